#!/usr/bin/env bash
# Session 13, call 1: the device link pipelined (the core reads a poll's answer when it comes instead of waiting
# for it; the device process ignores grows/retreats of launches it reported ended, the daemon releases those grows)
# against the build before (15eaa09): first the daemon check on the new build, then priority (default only) and
# overhead, base and new in turn, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
for i in 1 2 3 4; do
b=carry/base; n=base; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=pipelined; }
OUT=/tmp/b67-$i BIN=$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" > "$O/run-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "blocks: gpumux|^(added|gpumuxd|gpumux ppq)" "$O/run-$i-$n.txt"
cp /tmp/b67-$i/logs.tgz "$O/logs-$i-$n.tgz" 2>/dev/null
done

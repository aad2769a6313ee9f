#!/usr/bin/env bash
# Session 12, call 4: the core's pump ends at the first poll with no events (no second round per launch only to
# see whether it ended) against the build before (c4d1d24), in turn: priority (default only) and overhead;
# then the daemon check on the new build.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
b=carry/base; n=base; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=one-round; }
OUT=/tmp/b56-$i BIN=$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" > "$O/run-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "blocks: gpumux|^(added|gpumuxd|gpumux ppq)" "$O/run-$i-$n.txt"
done
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"

#!/usr/bin/env bash
# Session 13, call 12: the device process with 32 hardware work queues by default: the daemon check on the new
# build, then priority (default only) and overhead, the build before (carry/prev) and the new one in turn, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
for i in 1 2 3 4; do
b=carry/prev; n=prev; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=queues-32; }
OUT=/tmp/b77-$i BIN=$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" > "$O/run-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "blocks: gpumux|^(added|gpumuxd)" "$O/run-$i-$n.txt" | grep -v "2 ms"
done

#!/usr/bin/env bash
# Session 16, call 5: the session's final daemon code (protocol 3; carry/daemon from the head):
# the daemon check, then the overhead experiment in turn with main 1cd7414 (carry/prev), four
# pairs, the final build first in two and second in two.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
i=0
for b in daemon prev prev daemon daemon prev prev daemon; do
i=$((i+1))
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|added|gpumuxd, [1248] client)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
done 2>&1 | tee "$O/overhead.txt"

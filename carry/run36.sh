#!/usr/bin/env bash
# Session 11, call 1: shared-memory rings (device link + client link). Daemon check on the new build,
# then the overhead experiment: base (216e20d) and new, in turn, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
tail -5 /tmp/check.log
for i in 1 2 3 4; do
b=carry/base; n=base; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=rings; }
OUT=/tmp/b36-$i BIN=$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "^(native|gpumuxd|added|gpumux )" "$O/overhead-$i-$n.txt"
done

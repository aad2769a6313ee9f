#!/usr/bin/env bash
# Session 14, call 16: kept launch records (carry/daemon) against the build before (carry/prev,
# ef66c4f), the priority experiment at 20 and 100 µs blocks in turn, twice each: run 93's outliers
# came with time slicing's too (a disturbed instance?).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/p94-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > "$O/pr-$i-$b.txt" 2>&1
echo "== prio $i $b rc $?"; grep -E "^(20|100) µs blocks: (gpumux|time|MPS)" "$O/pr-$i-$b.txt"
done

#!/usr/bin/env bash
# Session 15, call 16: requests during polls on top of the launcher thread (carry/daemon) against
# main (carry/prev): the priority experiment at 20 and 100 µs blocks, in turn, twice each; then
# the overhead experiment once each.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
b=daemon; [ $((i % 2)) -eq 0 ] && b=prev
OUT=/tmp/pr$i BIN=carry/$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > /tmp/pr-$i.txt 2>&1
echo "== priority $i $b rc $?"
grep -E "^(20|100) µs blocks: (gpumux|MPS)" /tmp/pr-$i.txt | tr -s ' ' | cut -c1-110
done 2>&1 | tee "$O/priority.txt"
for i in 1 2; do
b=daemon; [ $((i % 2)) -eq 0 ] && b=prev
OUT=/tmp/ov$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|gpumuxd|added)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
done 2>&1 | tee "$O/overhead.txt"

#!/usr/bin/env bash
# Session 15, call 8: the priority experiment again, end events queried at most every 100 µs
# (carry/daemon) against the build before (carry/prev), in turn, twice per build.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
b=daemon; [ $((i % 2)) -eq 0 ] && b=prev
OUT=/tmp/pr$i BIN=carry/$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" > /tmp/pr-$i.txt 2>&1
echo "== priority $i $b rc $?"
grep -E "^(20|100|1000) µs blocks: " /tmp/pr-$i.txt | tr -s ' ' | cut -c1-110
done 2>&1 | tee "$O/priority.txt"

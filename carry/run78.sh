#!/usr/bin/env bash
# Session 13, call 13: does the device process's 32 hardware queues cost urgent latency? Priority at 20 and 100 µs
# blocks (default policy only), the build before (carry/prev) and the new one in turn, three times each.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4 5 6; do
b=carry/prev; n=prev; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=queues-32; }
OUT=/tmp/b78-$i BIN=$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > "$O/pr-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "blocks: gpumux" "$O/pr-$i-$n.txt"
done

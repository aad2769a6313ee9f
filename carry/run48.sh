#!/usr/bin/env bash
# Session 11, call 16: --poll-us 5 (the default) against 2, in turn, twice: overhead and priority.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
p=5; [ $((i % 2)) -eq 0 ] && p=2
OUT=/tmp/b48-$i BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" --daemon-args "--poll-us $p" > "$O/run-$i-poll$p.txt" 2>&1
echo "== $i poll-us $p rc $?"
grep -E "blocks: gpumux|^(added|gpumuxd, 8|gpumuxd, 1 )" "$O/run-$i-poll$p.txt"
done

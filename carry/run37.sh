#!/usr/bin/env bash
# Session 11, call 3: priority (default config only) base vs rings; overhead with --poll-us 2 and 1 on rings.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2; do
b=carry/base; n=base; [ $i -eq 2 ] && { b=carry/daemon; n=rings; }
OUT=/tmp/b37-$i BIN=$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" > "$O/priority-$i-$n.txt" 2>&1
echo "== priority $n rc $?"
grep -E "^(Priority|setting|  *[0-9]|gpumux|one process|two processes|native|MPS|time)" "$O/priority-$i-$n.txt" | head -40
done
for p in 2 1; do
OUT=/tmp/b37-p$p BIN=carry/daemon timeout 100 bash scripts/bench-daemon-gpu.sh --only overhead --daemon-args "--poll-us $p" > "$O/overhead-poll$p.txt" 2>&1
echo "== overhead poll-us $p rc $?"
grep -E "^(native|gpumuxd|added|gpumux )" "$O/overhead-poll$p.txt"
done

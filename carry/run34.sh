#!/usr/bin/env bash
# Session 10, call 13: request overhead and launch rate, 65b016b vs the head, in turn (is the head's lower rate in run 64 the build or the machine?).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
b=carry/old; n=65b016b; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=head; }
OUT=/tmp/b34-$i BIN=$b timeout 140 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead-$i-$n.log" 2>&1
echo "== $i $n rc $?"
grep -E "^(native|gpumuxd|added|gpumux )" "$O/overhead-$i-$n.log"
done

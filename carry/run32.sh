#!/usr/bin/env bash
# Session 10, call 11: co-located co-run, 305d1f4 vs a peer's queued-ahead kernel counting as a peer, in turn.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
b=carry/daemon-305d1f4; n=old; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=new; }
OUT=/tmp/b32-$i BIN=$b timeout 140 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain > "$O/corun-$i-$n.log" 2>&1
echo "== $i $n rc $?"
mkdir -p /tmp/l32-$i && tar xzf /tmp/b32-$i/logs.tgz -C /tmp/l32-$i 2>/dev/null; grep -h "queue ahead:\|ERROR" /tmp/l32-$i/*.log | cut -c60-300
grep -E "(MPS|gpumux).*yes$" "$O/corun-$i-$n.log" | grep -E "\+" 
done

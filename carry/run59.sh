#!/usr/bin/env bash
# Session 12, call 7: refills at 100 and 1000 µs blocks, the default beside +no-refill, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2; do
OUT=/tmp/b59-$i BIN=carry/daemon timeout 280 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies ppq-even-drain+no-refill --block-us 100,1000 > "$O/priority-$i.txt" 2>&1
echo "== $i rc $?"
mkdir -p /tmp/l59-$i && tar xzf /tmp/b59-$i/logs.tgz -C /tmp/l59-$i 2>/dev/null; grep -h "refills:" /tmp/l59-$i/*.log | cut -c60-400
grep -E "blocks: (gpumux|MPS)" "$O/priority-$i.txt"
done

#!/usr/bin/env bash
# Session 10, call 4: the own-SMs co-run that stopped the daemon in run 58, with its log's errors.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2; do
OUT=/tmp/b25-$i BIN=carry/daemon timeout 250 bash scripts/bench-daemon-gpu.sh --only corun \
  --corun-policies ppq-even-drain+own-sms > "$O/bench-$i.log" 2>&1
echo "bench $i rc $?"
mkdir -p /tmp/l25-$i && tar xzf /tmp/b25-$i/logs.tgz -C /tmp/l25-$i 2>/dev/null
grep -hE "ERROR|WARN|queue ahead|panick|stopp" /tmp/l25-$i/*.log | cut -c1-600 | head -20 | tee "$O/errors-$i.txt"
tail -22 "$O/bench-$i.log"
done

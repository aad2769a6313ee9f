#!/usr/bin/env bash
# Session 10, call 7: the own-SMs co-run with queue ahead until the daemon's check fires; its error names the launch's history.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4 5 6; do
OUT=/tmp/b28-$i BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only corun \
  --corun-policies ppq-even-drain+own-sms+ahead > "$O/bench-$i.log" 2>&1
rc=$?
mkdir -p /tmp/l28-$i && tar xzf /tmp/b28-$i/logs.tgz -C /tmp/l28-$i 2>/dev/null
echo "bench $i rc $rc: $(grep -h "queue ahead:" /tmp/l28-$i/*.log | cut -c60-260)"
if grep -q "ERROR" /tmp/l28-$i/*.log; then
  grep -h "ERROR" /tmp/l28-$i/*.log | cut -c1-3000 | tee "$O/error.txt"
  break
fi
done

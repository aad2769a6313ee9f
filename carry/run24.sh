#!/usr/bin/env bash
# Session 10, call 3: what queue ahead did (the device's counters in the daemon logs), co-run and priority.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
OUT=/tmp/b24 BIN=carry/daemon timeout 400 bash scripts/bench-daemon-gpu.sh --only corun,priority \
  --corun-policies ppq-even-drain,ppq-even-drain+own-sms --priority-policies ppq-even-drain+in-process > "$O/bench.log" 2>&1
echo "bench rc $? ($(( $(date +%s) - t0 )) s)"
cp /tmp/b24/bench-daemon.txt /tmp/b24/bench-daemon.json "$O/" 2>/dev/null
mkdir -p /tmp/l24 && tar xzf /tmp/b24/logs.tgz -C /tmp/l24 2>/dev/null
for f in /tmp/l24/*.log; do echo "== $(basename "$f")"; grep -hE "queue ahead|spent their time" -A1 "$f" | grep -vE "^--$" | cut -c1-400; done > "$O/counters.txt"
cat "$O/counters.txt" | grep -E "^==|queue ahead" | head -40
tail -40 "$O/bench.log"

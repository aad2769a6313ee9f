#!/usr/bin/env bash
# Session 19, call 6: in run 144 (call 5) this build's low-priority client alone through the daemon
# made 0.002 of its rate at 1000 µs blocks in two rows of one run (a stall of about a second; never
# seen before). The priority experiment at 1000 µs blocks only, three times, logs kept.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3; do
  OUT=$O/p$i BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --block-us 1000 \
    --priority-policies ppq-even-drain+no-ahead,ppq-even-drain+own-sms > "$O/p$i.txt" 2>&1
  echo "== priority $i rc $?"
  grep -E "blocks: (gpumux|MPS)" "$O/p$i.txt" | tr -s ' ' | cut -c1-100
done

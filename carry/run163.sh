#!/usr/bin/env bash
# Session 21, call 4 (GPU run 204): run 203's A/B again with the order turned (chain first):
# the priority experiment (default configuration) three pairs, then the overhead two pairs.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab-p PAIRS=3 timeout 300 bash scripts/ab/ab-daemon-gpu.sh carry/chain carry/main --only priority --priority-policies "" > "$O/ab-priority.txt" 2>&1
grep -v "^run " "$O/ab-priority.txt" | grep -E "blocks|main:|chain:|better" | cut -c1-160 | head -60
for d in /tmp/ab-p/0*; do mkdir -p $d/l; tar xzf $d/logs.tgz -C $d/l 2>/dev/null
  echo "$(basename $d): $(grep -h 'queue ahead:' $d/l/gpumux_ppq-even-drain.log | sed 's/.*queue ahead: //' | cut -c1-60 | paste -sd'|')"
  echo "$(basename $d): $(grep -h 'ran 20[0-9] kernels' $d/l/gpumux_ppq-even-drain.log | head -3 | sed 's/.*: wait/wait/' | sed -E 's/ \/ [0-9.]+ \/ [0-9.]+//g' | paste -sd'|')"
done > "$O/per-run.txt"
echo "== per run: queue ahead, urgent stage p50s (20 | 100 | 1000 µs blocks)"; cut -c1-330 "$O/per-run.txt"
OUT=/tmp/ab-o PAIRS=2 timeout 200 bash scripts/ab/ab-daemon-gpu.sh carry/main carry/chain > "$O/ab-overhead.txt" 2>&1
grep -v "^run " "$O/ab-overhead.txt" | grep -E "launches|main:|chain:|better|p50|p99" | cut -c1-160
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-p/*/bench-daemon.txt ab-p/*/logs.tgz ab-o/*/bench-daemon.txt 2>/dev/null)

#!/usr/bin/env bash
# Session 20, call 8 (GPU run 198): late commands sent at once whether or not the device asked to
# be polled again (uncond2, main's code with that condition dropped) against main (eng, b35404a):
# the overhead, four pairs in turn; the priority experiment (default configuration), two pairs.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab-o PAIRS=4 bash scripts/ab/ab-daemon-gpu.sh carry/eng carry/uncond2 > "$O/ab-overhead.txt" 2>&1
grep -v "^run " "$O/ab-overhead.txt" | grep -E "launches|eng:|uncond2:|better|p50|p99" | cut -c1-160
OUT=/tmp/ab-p PAIRS=2 bash scripts/ab/ab-daemon-gpu.sh carry/eng carry/uncond2 --only priority --priority-policies "" > "$O/ab-priority.txt" 2>&1
grep -v "^run " "$O/ab-priority.txt" | grep -E "blocks|eng:|uncond2:|better" | cut -c1-160
for d in /tmp/ab-p/0*; do mkdir -p $d/l; tar xzf $d/logs.tgz -C $d/l 2>/dev/null
  echo "$(basename $d): $(grep -h 'ran 20[0-9] kernels' $d/l/gpumux_ppq-even-drain.log | head -3 | sed 's/.*goes"): //' | sed 's/; launch.*//' | paste -sd'|')"
done > "$O/urgent-stages.txt"
echo "== urgent stages"; cat "$O/urgent-stages.txt"
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-p/*/bench-daemon.txt ab-o/*/bench-daemon.txt 2>/dev/null)

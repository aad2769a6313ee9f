#!/usr/bin/env bash
# Session 21, call 6 (GPU run 206): only the core's half of run 203's change (a kernel follows the
# kernel before it past recorded events and syncs; the CUDA device as on main) against main: the
# daemon check on core; the priority experiment (default configuration) three pairs; the co-run
# experiment (default configuration) one pair.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/core timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/ab-p PAIRS=3 timeout 280 bash scripts/ab/ab-daemon-gpu.sh carry/main carry/core --only priority --priority-policies "" > "$O/ab-priority.txt" 2>&1
grep -v "^run " "$O/ab-priority.txt" | grep -E "blocks|main:|core:|better" | cut -c1-160 | head -60
for d in /tmp/ab-p/0*; do mkdir -p $d/l; tar xzf $d/logs.tgz -C $d/l 2>/dev/null
  echo "$(basename $d): $(grep -h 'queue ahead:' $d/l/gpumux_ppq-even-drain.log | sed 's/.*queue ahead: //' | cut -c1-120 | paste -sd'|')"
  echo "$(basename $d): $(grep -h 'ran 20[0-9] kernels' $d/l/gpumux_ppq-even-drain.log | head -3 | sed 's/.*: wait/wait/' | sed -E 's/ \/ [0-9.]+ \/ [0-9.]+//g' | paste -sd'|')"
done > "$O/per-run.txt"
echo "== per run: queue ahead, urgent stage p50s (20 | 100 | 1000 µs blocks)"; cut -c1-330 "$O/per-run.txt"
OUT=/tmp/ab-c PAIRS=1 timeout 200 bash scripts/ab/ab-daemon-gpu.sh carry/main carry/core --only corun --corun-policies "" > "$O/ab-corun.txt" 2>&1
grep -v "^run " "$O/ab-corun.txt" | cut -c1-160 | head -40
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-p/*/bench-daemon.txt ab-p/*/logs.tgz ab-c/*/bench-daemon.txt 2>/dev/null)

#!/usr/bin/env bash
# Session 20, call 7 (GPU run 197): the engine's urgent turn without its second scheduling round
# (eng, b35404a) against main before it (late, c2f8231): the daemon check and gpu-check on eng;
# the priority experiment (the default configuration only) three pairs in turn; the overhead
# three pairs in turn; the urgent kernel's stage log from each priority run.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/eng timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
timeout 240 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"
OUT=/tmp/ab-p PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/late carry/eng --only priority --priority-policies "" > "$O/ab-priority.txt" 2>&1
grep -v "^run " "$O/ab-priority.txt" | grep -E "blocks|late:|eng:|better" | cut -c1-160 | head -60
for d in /tmp/ab-p/0*; do mkdir -p $d/l; tar xzf $d/logs.tgz -C $d/l 2>/dev/null
  echo "$(basename $d): $(grep -h 'ran 20[0-9] kernels' $d/l/gpumux_ppq-even-drain.log | head -3 | sed 's/.*goes"): //' | sed 's/; launch.*//' | paste -sd'|')"
done > "$O/urgent-stages.txt"
echo "== urgent decide by run (20 | 100 | 1000 µs blocks)"; cat "$O/urgent-stages.txt"
OUT=/tmp/ab-o PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/late carry/eng > "$O/ab-overhead.txt" 2>&1
grep -v "^run " "$O/ab-overhead.txt" | grep -E "launches|late:|eng:|better|p50|p99" | cut -c1-160
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-p/*/bench-daemon.txt ab-p/*/logs.tgz ab-o/*/bench-daemon.txt 2>/dev/null)

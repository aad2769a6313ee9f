#!/usr/bin/env bash
# Session 21, call 3 (GPU run 203): a stream's next kernel queued ahead past recorded events and
# syncs, and behind a native launch whatever retreats it (chain) against main (66eb918's daemon
# code, = b35404a's): the GPU tests and the daemon check on chain; the priority experiment (the
# default configuration only) three pairs in turn, with each run's queue-ahead counts and the
# urgent kernel's stage log; then gpu-check.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 200 bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
echo "== tests rc $?"; grep -E "^=== |test result|SKIPPED|panicked|FAILED|AheadCounts" "$O/tests.txt" | cut -c1-220
OUT=/tmp/check BIN=carry/chain timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/ab-p PAIRS=3 timeout 300 bash scripts/ab/ab-daemon-gpu.sh carry/main carry/chain --only priority --priority-policies "" > "$O/ab-priority.txt" 2>&1
grep -v "^run " "$O/ab-priority.txt" | grep -E "blocks|main:|chain:|better|LP|urgent" | cut -c1-160 | head -60
for d in /tmp/ab-p/0*; do mkdir -p $d/l; tar xzf $d/logs.tgz -C $d/l 2>/dev/null
  echo "$(basename $d): $(grep -h 'queue ahead:' $d/l/gpumux_ppq-even-drain.log | sed 's/.*queue ahead: //' | cut -c1-90 | paste -sd'|')"
  echo "$(basename $d): $(grep -h 'ran 20[0-9] kernels' $d/l/gpumux_ppq-even-drain.log | head -3 | sed 's/.*goes"): //' | sed 's/; launch.*//' | paste -sd'|')"
done > "$O/per-run.txt"
echo "== per run: queue ahead, urgent stages (20 | 100 | 1000 µs blocks)"; cat "$O/per-run.txt" | cut -c1-300
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-p/*/bench-daemon.txt ab-p/*/logs.tgz 2>/dev/null)
timeout 170 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"

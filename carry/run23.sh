#!/usr/bin/env bash
# Session 10, call 2: gpu-check (CUDA code changed), then priority + overhead, queue ahead on/off.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.log" 2>&1; echo "gpu-check rc $? ($(( $(date +%s) - t0 )) s)"
tail -12 "$O/gpu-check.log"
OUT=$O/prio BIN=carry/daemon timeout 360 bash scripts/bench-daemon-gpu.sh --only priority,overhead \
  --priority-policies ppq-even-drain+no-ahead,ppq-shared-drain,ppq-even-drain+in-process > "$O/prio.log" 2>&1
echo "prio rc $? ($(( $(date +%s) - t0 )) s)"
rm -f "$O/prio/logs.tgz"
grep -hE "spent their time" -A2 /tmp/bench-logs*/*.log 2>/dev/null | head -0
tail -50 "$O/prio.log"

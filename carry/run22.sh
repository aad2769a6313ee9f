#!/usr/bin/env bash
# Session 10, call 1: GPU tests (queue ahead), daemon check, co-run with and without queue ahead.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.log" 2>&1; echo "tests rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "test result|SKIPPED|FAILED|panicked|disturbed|dropped kernel" "$O/tests.log" | head -30
OUT=$O/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > "$O/check.log" 2>&1; echo "check rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(PASS|FAIL)" "$O/check.log" | head -20
rm -rf "$O/check/"*.bin 2>/dev/null
OUT=$O/corun BIN=carry/daemon timeout 330 bash scripts/bench-daemon-gpu.sh --only corun \
  --corun-policies ppq-even-drain,ppq-even-drain+no-ahead,ppq-even-drain+in-process,ppq-even-drain+own-sms > "$O/corun.log" 2>&1
echo "corun rc $? ($(( $(date +%s) - t0 )) s)"
tail -45 "$O/corun.log"

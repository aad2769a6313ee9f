#!/usr/bin/env bash
# Session 10, call 15: checks on the last build (GPU tests, daemon check, gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu > "$O/tests.log" 2>&1; echo "tests rc $?"
grep -E "test result|FAILED|panicked" "$O/tests.log"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.log" 2>&1; echo "gpu-check rc $? ($(( $(date +%s) - t0 )) s)"
tail -1 "$O/gpu-check.log"

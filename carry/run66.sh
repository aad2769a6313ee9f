#!/usr/bin/env bash
# Session 12, call 15: client_gpu after the last read's test refactor (StepX: one helper for STEP's buffer).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.txt" 2>&1
grep -E "test |test result|panicked|status" "$O/tests.txt" | cut -c1-200

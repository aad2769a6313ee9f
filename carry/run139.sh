#!/usr/bin/env bash
# Session 18, calls 6-7: client_gpu after the hardware-priority test stopped assuming its kernel
# shape untimed (block times stay with the compiled module, which earlier tests timed).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.txt" 2>&1
grep -E "test result|SKIPPED|panicked|FAILED|urgent: ended|native launches" "$O/tests.txt" | cut -c1-220

#!/usr/bin/env bash
# Session 10, call 6: the final build: client_gpu (queue ahead test opts in), daemon check (default: queue ahead off), gpu-check.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.log" 2>&1; echo "tests rc $?"
grep -E "test result|FAILED|panicked" "$O/tests.log"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.log" 2>&1; echo "gpu-check rc $?"
tail -1 "$O/gpu-check.log"

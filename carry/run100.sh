#!/usr/bin/env bash
# Session 15, call 6: the CUDA change (end events queried at most every 100 µs): the GPU tests,
# scripts/gpu-check.sh and the daemon check on it.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-160
timeout 330 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; tail -15 "$O/gpu-check.txt"
OUT=/tmp/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160

#!/usr/bin/env bash
# Session 15, call 14: the session's final CUDA code (after the last read): the GPU tests, the
# daemon check and scripts/gpu-check.sh; the overhead experiment once (a record of the instance).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-160
OUT=/tmp/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"
OUT=/tmp/ov BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov.txt 2>&1
echo "== overhead rc $?"
grep -E "^(native|gpumuxd|added)" /tmp/ov.txt | tr -s ' ' | tee "$O/overhead.txt"

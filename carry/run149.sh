#!/usr/bin/env bash
# Session 19, call 10: the final library code (busy() as in main again: run 188). GPU tests and
# the daemon check.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 240 bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
echo "== tests rc $?"
grep -E "test result|SKIPPED|panicked|FAILED|native launches" "$O/tests.txt" | cut -c1-200
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160

#!/usr/bin/env bash
# Session 14, call 17: after the last read (InContext::new makes the kept records itself): the
# client GPU tests and the daemon check.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-180
OUT=$O/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
rm -rf "$O/check"

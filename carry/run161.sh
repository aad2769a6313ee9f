#!/usr/bin/env bash
# Session 20, call 10 (GPU run 200): client_gpu after its end-of-launch finders became one (end_of).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 200 bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.txt" 2>&1
echo "== tests rc $?"
grep -E "^=== |test result|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-200

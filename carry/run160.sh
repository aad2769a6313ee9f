#!/usr/bin/env bash
# Session 20, call 9 (GPU run 199): the GPU tests on main's code (the engine's one-round urgent
# turn, b35404a's): client_gpu, engine_gpu, gpu.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 300 bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
echo "== tests rc $?"
grep -E "^=== |test result|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-200

#!/usr/bin/env bash
# Session 12, call 5: kernels unloaded when their client leaves (functions keep their module; the daemon unloads a
# gone client's modules): GPU tests (a new one: a kernel unloaded while it runs), the daemon check with the
# daemon's "kernels loaded in all" through the kill test, and scripts/gpu-check.sh (the CUDA code changed).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|panicked|status|unloaded while" "$O/tests.txt"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
for f in $(find /tmp/check -name daemon.log); do echo "== $f: $(grep -c 'modules\? unloaded' "$f") clients gone"; grep -o "unloaded ([0-9]* kernels loaded in all)" "$f" | sort | uniq -c | sort -rn | head -4; grep -o "unloaded ([0-9]* kernels loaded in all)" "$f" | tail -1; done | tee "$O/unloads.txt"
bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1; echo "gpu-check rc $?"
tail -2 "$O/gpu-check.txt"

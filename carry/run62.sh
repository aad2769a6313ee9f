#!/usr/bin/env bash
# Session 12, call 10: the session's last CUDA code: GPU tests, scripts/gpu-check.sh (the prelude's reset changed),
# and the co-run (default beside always co-located) as a regression check against MPS.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|panicked|status|refills:" "$O/tests.txt"
bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1; echo "gpu-check rc $?"
tail -2 "$O/gpu-check.txt"
OUT=/tmp/b62 BIN=carry/daemon timeout 300 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain,ppq-even-drain+co-locate > "$O/corun.txt" 2>&1
echo "corun rc $?"
mkdir -p /tmp/l62 && tar xzf /tmp/b62/logs.tgz -C /tmp/l62 2>/dev/null; grep -h "refills:\|co-run placement\|ERROR" /tmp/l62/*.log | cut -c60-330 | tee "$O/counters.txt"
grep -E "(MPS|gpumux).*(yes|no)$" "$O/corun.txt"

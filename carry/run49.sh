#!/usr/bin/env bash
# Session 11, call 17: the session's last code on the GPU: GPU tests, the daemon check, the default co-run
# (beside always co-located), scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|panicked|status" "$O/tests.txt"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
OUT=/tmp/b49 BIN=carry/daemon timeout 300 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain,ppq-even-drain+co-locate > "$O/corun.txt" 2>&1
echo "corun rc $?"
mkdir -p /tmp/l49 && tar xzf /tmp/b49/logs.tgz -C /tmp/l49 2>/dev/null; grep -h "queue ahead:\|co-run placement\|launch commands\|ERROR" /tmp/l49/*.log | cut -c60-330 | tee "$O/counters.txt"
grep -E "(MPS|gpumux).*(yes|no)$" "$O/corun.txt"
bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1; echo "gpu-check rc $?"
tail -2 "$O/gpu-check.txt"

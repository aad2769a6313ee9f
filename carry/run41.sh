#!/usr/bin/env bash
# Session 11, call 9: the co-run chooser (and lazy error words) on the GPU: client/engine GPU tests,
# the daemon check, then the co-run: the default (chosen per pair) and always co-located, side by side.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|panicked|status" "$O/tests.txt"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
OUT=/tmp/b41 BIN=carry/daemon timeout 400 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain,ppq-even-drain+co-locate > "$O/corun.txt" 2>&1
echo "corun rc $?"
mkdir -p /tmp/l41 && tar xzf /tmp/b41/logs.tgz -C /tmp/l41 2>/dev/null; grep -h "queue ahead:\|co-run placement\|ERROR" /tmp/l41/*.log | cut -c60-300
grep -A40 "^Co-run" "$O/corun.txt" | head -40

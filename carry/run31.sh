#!/usr/bin/env bash
# Session 10, call 10: the session's last build: GPU tests, daemon check, gpu-check, one default co-run.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.log" 2>&1; echo "tests rc $?"
grep -E "test result|FAILED|panicked" "$O/tests.log"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.log" 2>&1; echo "gpu-check rc $? ($(( $(date +%s) - t0 )) s)"
tail -1 "$O/gpu-check.log"
OUT=/tmp/b31 BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain,ppq-even-drain+own-sms > "$O/corun.log" 2>&1
echo "corun rc $? ($(( $(date +%s) - t0 )) s)"
mkdir -p /tmp/l31 && tar xzf /tmp/b31/logs.tgz -C /tmp/l31 2>/dev/null; grep -h "queue ahead:\|ERROR" /tmp/l31/*.log | cut -c60-400
cp /tmp/b31/bench-daemon.txt "$O/" 2>/dev/null
grep -E "STP|slowdown| / |  1\.[0-9]{3} " "$O/corun.log" | grep -vE "^\[" | head -40

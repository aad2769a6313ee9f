#!/usr/bin/env bash
# Session 12, call 6: refills (SMs given back to a launch whose workers left them are filled at once): GPU tests
# (a new one: a launch refilled on the SMs it was given back runs each block once), the daemon check, and the
# priority experiment, the default beside +no-refill, every block size.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|panicked|status|refills:|FAILED" "$O/tests.txt"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
OUT=/tmp/b58 BIN=carry/daemon timeout 300 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies ppq-even-drain+no-refill > "$O/priority.txt" 2>&1
echo "priority rc $?"
mkdir -p /tmp/l58 && tar xzf /tmp/b58/logs.tgz -C /tmp/l58 2>/dev/null; grep -h "refills:\|queue ahead:\|ERROR" /tmp/l58/*.log | cut -c60-400 | tee "$O/counters.txt"
grep -A14 "^setting" "$O/priority.txt"

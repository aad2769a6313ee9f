#!/usr/bin/env bash
# Session 10, call 9: the final build (queue ahead on by default): client_gpu, daemon check, priority + overhead (with/without), gpu-check.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
t0=$(date +%s)
bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.log" 2>&1; echo "tests rc $?"
grep -E "test result|FAILED|panicked" "$O/tests.log"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $? ($(( $(date +%s) - t0 )) s)"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
grep -h "queue ahead:\|ERROR" /tmp/check/*/daemon.log 2>/dev/null | cut -c60-300 | sort | uniq -c | head
OUT=/tmp/prio BIN=carry/daemon timeout 300 bash scripts/bench-daemon-gpu.sh --only priority,overhead \
  --priority-policies ppq-even-drain+no-ahead,ppq-even-drain+in-process > "$O/prio.log" 2>&1
echo "prio rc $? ($(( $(date +%s) - t0 )) s)"
cp /tmp/prio/bench-daemon.txt /tmp/prio/bench-daemon.json "$O/" 2>/dev/null
mkdir -p /tmp/lp && tar xzf /tmp/prio/logs.tgz -C /tmp/lp 2>/dev/null; grep -h "queue ahead:\|ERROR" /tmp/lp/*.log | cut -c60-400
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.log" 2>&1; echo "gpu-check rc $? ($(( $(date +%s) - t0 )) s)"
tail -1 "$O/gpu-check.log"
tail -42 "$O/prio.log"

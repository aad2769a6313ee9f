#!/usr/bin/env bash
# Session 17, call 14: the launch clock with a start's own parts (plan, parameters, calls or
# post; commit c3bbda5; carry/daemon, carry/t): the GPU tests, the daemon check, the overhead
# experiment twice (the launch clock's line), and scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-160
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
for i in 1 2; do
OUT=/tmp/ov$i BIN=carry/daemon timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead$i.txt" 2>&1
echo "== overhead $i rc $?"; grep -E "^(added|gpumuxd)" "$O/overhead$i.txt" | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
grep -h "launch commands, mean" /tmp/lo$i/gpumux_ppq-even-drain.log | cut -c60-900 | tee -a "$O/clock.txt"
done
timeout 220 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"

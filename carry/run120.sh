#!/usr/bin/env bash
# Session 17, call 2: adopted workers' launch calls not waited for in the launch command
# (carry/daemon, carry/t) against main (carry/prev, e09d074): the GPU tests, the daemon check,
# then the overhead experiment in turn, three pairs, with the device's launch clock line.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-160
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
i=0
for b in daemon prev prev daemon daemon prev; do
i=$((i+1))
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|added|gpumuxd)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
grep -h "launch commands, mean\|queue ahead:" /tmp/lo$i/gpumux_ppq-even-drain.log | cut -c60-400
done 2>&1 | tee "$O/overhead.txt"

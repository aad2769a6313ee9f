#!/usr/bin/env bash
# Session 16, call 7: the session's final build (carry/daemon, carry/t: protocol 3, the launch
# clock counting adopted workers' calls, the bench's breakdown rows): the GPU tests, the daemon
# check, the overhead experiment once (with the device's launch clock line), the same experiment
# on the simulated GPU in a device process and in-process on this host (what the core and the
# link carry with a device that costs nothing), and scripts/gpu-check.sh last.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-160
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/ov BIN=carry/daemon timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead.txt" 2>&1
echo "== overhead rc $?"; grep -E "^(native|added|gpumuxd)" "$O/overhead.txt" | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo; tar xzf /tmp/ov/logs.tgz -C /tmp/lo 2>/dev/null
grep -h "launch commands, mean" /tmp/lo/gpumux_ppq-even-drain.log | tail -2 | cut -c1-300
for a in "--device-process" ""; do for i in 1 2; do
OUT=/tmp/sim BIN=carry/daemon timeout 120 bash scripts/bench-daemon-gpu.sh --device sim:h100 --only overhead ${a:+--daemon-args "$a"} > /tmp/sim.txt 2>&1
echo "== sim [$a] $i rc $?"; grep -E "^gpumuxd" /tmp/sim.txt | tr -s ' ' | cut -c1-90
done; done 2>&1 | tee "$O/sim.txt"
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"

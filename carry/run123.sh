#!/usr/bin/env bash
# Session 17, call 5: the device process's launch command made cheaper (shared kernel name and
# arguments in launch records, one buffer for a launch's parameters, a multiply hash for the
# id-keyed maps of the core, the backends and the CUDA device) with the launch command's
# clock split into parts (carry/daemon, carry/t) against main (carry/prev, e09d074): the GPU
# tests, the daemon check, then the overhead experiment in turn, five pairs.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-160
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
i=0
for b in daemon prev prev daemon daemon prev prev daemon daemon prev; do
i=$((i+1))
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|added|gpumuxd)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
grep -h "launch commands, mean\|device process: busy\|core: busy" /tmp/lo$i/gpumux_ppq-even-drain.log | cut -c60-900
done 2>&1 | tee "$O/overhead.txt" | grep -E "^== |8 clients|added|launch commands" | cut -c1-400

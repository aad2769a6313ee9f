#!/usr/bin/env bash
# Session 19, call 8: the final library code (the placement branch folded into place(), the
# native end's write without the relaxed variant, and busy() counting kernels queued ahead, which
# run on the GPU before the engine's launch of theirs: a device that said idle then was not
# polled for up to a second). GPU tests, the daemon check, gpu-check, the overhead against main
# (two pairs), the priority experiment twice with logs (the stall of run 184).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 240 bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
echo "== tests rc $?"
grep -E "test result|SKIPPED|panicked|FAILED|native launches" "$O/tests.txt" | cut -c1-200
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
timeout 220 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"
OUT=/tmp/ab147 PAIRS=2 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/daemon > "$O/ab-overhead.txt" 2>&1
grep -v "^run " "$O/ab-overhead.txt" | grep -E "launches|prev:|daemon:|better|p50" | cut -c1-160
for i in 1 2; do
  OUT=/tmp/p147-$i BIN=carry/daemon timeout 120 bash scripts/bench-daemon-gpu.sh --only priority > "$O/priority-$i.txt" 2>&1
  echo "== priority $i rc $?"
  grep -E "blocks: (gpumux ppq-even-drain|MPS) " "$O/priority-$i.txt" | tr -s ' ' | cut -c1-100
  grep -E "blocks: gpumux" "$O/priority-$i.txt" | awk '{print $(NF-1)}' | paste -sd' '
  mkdir -p "$O/logs$i"; tar xzf /tmp/p147-$i/logs.tgz -C "$O/logs$i" 2>/dev/null
  grep -rh "took the core [0-9]\{6,\}\|step took [0-9]\{6,\}" "$O/logs$i" | grep -v "LoadModule" | head -5
done
(cd "$O" && tar czf logs.tgz logs1 logs2 && rm -rf logs1 logs2)

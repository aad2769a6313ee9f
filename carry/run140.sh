#!/usr/bin/env bash
# Session 19, call 1: native launches as cheap as workers' (posted to the launcher thread when
# queued ahead, their end published to host memory by a stream write after the kernel), and
# hardware priority for every launch alone at its priority unless another priority runs as
# workers only (carry/daemon; main's build dd9737b in carry/prev). GPU tests, the daemon check,
# the overhead with each build in turn.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 240 bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
echo "== tests rc $?"
grep -E "test result|SKIPPED|panicked|FAILED|urgent: ended|native launches" "$O/tests.txt" | cut -c1-200
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
i=0
for b in daemon prev prev daemon; do
  i=$((i+1))
  OUT=/tmp/o140-$i BIN=carry/$b timeout 60 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead-$i-$b.txt" 2>&1
  echo "== overhead $i $b rc $?"; grep -E "^(native|gpumuxd|added)" "$O/overhead-$i-$b.txt" | head -12 | tr -s ' ' | paste -sd';' | cut -c1-400
done

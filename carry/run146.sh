#!/usr/bin/env bash
# Session 19, call 7: the build to keep (a short kernel behind workers is queued as workers again,
# as in main). GPU tests, the daemon check, the overhead against main's build (four pairs in turn),
# scripts/gpu-check.sh, then priority and co-run once.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 240 bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
echo "== tests rc $?"
grep -E "test result|SKIPPED|panicked|FAILED|urgent: ended|native launches" "$O/tests.txt" | cut -c1-200
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/ab146 PAIRS=4 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/daemon > "$O/ab-overhead.txt" 2>&1
grep -v "^run " "$O/ab-overhead.txt" | grep -E "launches|prev:|daemon:|better|p50|p99" | cut -c1-160
timeout 220 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"
OUT=$O/pc BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,corun \
  --priority-policies ppq-even-drain+no-hw-priority --corun-policies ppq-even-drain > "$O/pc.txt" 2>&1
echo "== priority+corun rc $?"
grep -E "blocks: (gpumux|MPS)|: (gpumux|MPS)" "$O/pc.txt" | tr -s ' ' | cut -c1-110

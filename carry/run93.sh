#!/usr/bin/env bash
# Session 14, call 15: launch records made with the context and kept (commit after 02062cf). The GPU
# tests (with the new kept-records test), the daemon check (its kill test wants free memory back to
# the baseline to the byte), the priority experiment at 20 µs blocks with the slow lines, and
# scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "^test |test result|status|SKIPPED|panicked" "$O/tests.txt" | cut -c1-180
OUT=$O/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
rm -rf "$O/check"
export RUST_LOG=info
OUT=/tmp/p93 BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > "$O/pr.txt" 2>&1
echo "== prio rc $?"; grep -E "^(20|100) µs blocks: gpumux" "$O/pr.txt"
mkdir -p /tmp/lp93; tar xzf /tmp/p93/logs.tgz -C /tmp/lp93 2>/dev/null
f=$(ls /tmp/lp93/gpumux_ppq-even-drain*.log | head -1)
echo "slow urgent: $(grep -c 'slow urgent' $f); launch records made slowly: $(grep -c 'a launch record' $f)"
grep -h "slow urgent\|a launch record" "$f" | sed 's/^[^ ]*Z //' | head -5 | cut -c1-220
unset RUST_LOG
timeout 280 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check "$O/gpucheck" > "$O/gpucheck.txt" 2>&1
echo "== gpu-check rc $?"; tail -12 "$O/gpucheck.txt"

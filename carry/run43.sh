#!/usr/bin/env bash
# Session 11, call 11: the final co-run chooser (warm-up 20 ms, two windows of each placement, holds that
# double when confirmed): GPU tests, the daemon check, the co-run: default (chosen), always co-located, own SMs.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|panicked|status" "$O/tests.txt"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
RUST_LOG=info,gpumux_cuda::client::device::corun=debug OUT=/tmp/b43 BIN=carry/daemon timeout 400 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain,ppq-even-drain+co-locate,ppq-even-drain+own-sms > "$O/corun.txt" 2>&1
echo "corun rc $?"
mkdir -p /tmp/l43 && tar xzf /tmp/b43/logs.tgz -C /tmp/l43 2>/dev/null; grep -h "queue ahead:\|co-run\|ERROR" /tmp/l43/*.log | cut -c60-300 > "$O/counters.txt"; grep -v "co-run of kernels" "$O/counters.txt"; grep -c "co-run of kernels" "$O/counters.txt"
grep -A40 "^Co-run" "$O/corun.txt" | head -40

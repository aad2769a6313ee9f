#!/usr/bin/env bash
# Session 13, call 8: tiny launches run natively on any SM set (launch_plan.rs): the overhead experiment (load
# clocks, stage log) with the build before (6a36bff, carry/prev) and the new one in turn, twice; then the GPU tests,
# the daemon check and scripts/gpu-check.sh on the new build.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=carry/prev; n=prev; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=tiny-native; }
OUT=/tmp/b74-$i BIN=$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "^(added|gpumuxd)" "$O/ov-$i-$n.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b74-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
grep -h "gpumuxd::load\|INFO.*busy .* of\|ran [0-9]* kernels\|launch commands\|queue ahead\|timed" "$f" | cut -c28-600 > "$O/load-$i-$n.txt"
grep -h "ran 20100 kernels\|ran 10100 kernels\|ran 5100 kernels\|ran 2600 kernels" "$f" | sed 's/.*(bench-\(.\)-0) ran \([0-9]*\) kernels.*goes"): /\1 \2 /' | awk '{print $2, $0}' | sort -u -k1,1n | sed 's/; finish.*//' | cut -c1-130
done
unset RUST_LOG
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|panicked|status" "$O/tests.txt"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1; echo "gpu-check rc $?"
tail -2 "$O/gpu-check.txt"

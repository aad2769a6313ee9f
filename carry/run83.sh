#!/usr/bin/env bash
# Session 14, call 5: the device process queues ahead after answering each poll instead of inside
# the launch command (commit C, carry/daemon) against commit B (carry/prev). The GPU tests (with
# the new deferred queue-ahead test), the daemon check, then the overhead experiment in turn twice
# and the priority experiment (default only) once each.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "^test |test result|status|SKIPPED|panicked" "$O/tests.txt" | cut -c1-200
OUT=$O/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | cut -c1-160 | head -20
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/b83-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i-$b.txt" 2>&1
echo "== $i $b rc $?"
grep -E "^(added|gpumuxd|native)" "$O/ov-$i-$b.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b83-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
grep -h "gpumuxd::load\|launch commands, mean\|ran 2600 kernels\|request(s) waited\|queued ahead\|ahead" "$f" | sed 's/^.*Z //' > "$O/load-$i-$b.txt"
grep -h "gpumuxd::load" "$f" | sed 's/^.*gpumuxd::load: //' | grep -E 'busy [4-9][0-9]\.' | tail -2 | cut -c1-420
done
unset RUST_LOG
for i in 1 2; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/p83-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" > "$O/pr-$i-$b.txt" 2>&1
echo "== prio $i $b rc $?"
grep -E "blocks: gpumux|MPS|stream" "$O/pr-$i-$b.txt" | head -12
done

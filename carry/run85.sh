#!/usr/bin/env bash
# Session 14, call 7: bindings, commands and unbinds as one frame with the next poll (ToDevice::Batch, carry/daemon)
# against a frame each (carry/prev, the build of 581872b = b9a6eda). The daemon check, then the overhead
# experiment in turn twice and the priority experiment (default only) in turn twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=$O/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | cut -c1-160 | head -20
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/b85-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i-$b.txt" 2>&1
echo "== $i $b rc $?"
grep -E "^(added|gpumuxd|native)" "$O/ov-$i-$b.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b85-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
grep -h "gpumuxd::load\|launch commands, mean\|ran 2600 kernels\|request(s) waited\|queued ahead\|ahead" "$f" | sed 's/^.*Z //' > "$O/load-$i-$b.txt"
grep -h "gpumuxd::load" "$f" | sed 's/^.*gpumuxd::load: //' | grep -E 'busy [4-9][0-9]\.' | tail -2 | cut -c1-420
done
unset RUST_LOG
for i in 1 2 3 4; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/p85-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" > "$O/pr-$i-$b.txt" 2>&1
echo "== prio $i $b rc $?"
grep -E "^(20|100|1000) µs blocks" "$O/pr-$i-$b.txt"
done

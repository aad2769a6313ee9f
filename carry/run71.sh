#!/usr/bin/env bash
# Session 13, call 5: the device process's own reports (f4b6a57, laps of 250 ms) against lockstep (the current
# build), the overhead experiment in turn, twice, with the load clocks: which side is busy all the time when the
# core no longer waits for the device's answers.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=carry/daemon; n=lockstep; [ $((i % 2)) -eq 0 ] && { b=carry/reports; n=reports; }
OUT=/tmp/b71-$i BIN=$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "^(added|gpumuxd)" "$O/ov-$i-$n.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b71-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
grep -h "gpumuxd::load\|INFO.*busy .* of\|ran [0-9]* kernels\|launch commands" "$f" | cut -c28-600 > "$O/load-$i-$n.txt"
grep -h "gpumuxd::load" "$f" | cut -c28-260 | tail -8
done

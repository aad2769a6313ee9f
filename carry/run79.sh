#!/usr/bin/env bash
# Session 14, call 1: where the core's and the device process's time goes per launch, finer
# (core: messages / engine / device sends / device polls / the rest; device process: launch
# commands / other commands / polls / binds / unbinds), every quarter second, for the overhead
# experiment (1-8 clients' launch rates), twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2; do
OUT=/tmp/b79-$i BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i.txt" 2>&1
echo "== $i rc $?"
grep -E "^(added|gpumuxd|native)" "$O/ov-$i.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b79-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
grep -h "gpumuxd::load\|launch commands, mean\|ran 20100 kernels\|ran 10100 kernels\|ran 5100 kernels\|ran 2600 kernels" "$f" | sed 's/^.*Z //' > "$O/load-$i.txt"
grep -h "gpumuxd::load" "$f" | sed 's/^.*gpumuxd::load: //' | grep -E 'busy [4-9][0-9]\.' | cut -c1-330
grep -h "launch commands, mean" "$f" | sed 's/^.*Z //' | cut -c1-250
done

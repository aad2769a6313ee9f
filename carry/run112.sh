#!/usr/bin/env bash
# Session 16, call 2: the stage log of the rate clients (where each kernel's time goes) and the
# load clocks, overhead experiment once per build: carry/daemon (protocol 3, posted messages) and
# carry/prev (main 1cd7414).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2; do
b=daemon; [ $((i % 2)) -eq 0 ] && b=prev
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|gpumuxd|added)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
ls /tmp/lo$i > "$O/logs-$i-$b.txt"
grep -h "where they spent\|gpumuxd::load\|launch commands, mean" /tmp/lo$i/gpumux_ppq-even-drain.log > "$O/stages-$i-$b.txt"
grep -h "where they spent" /tmp/lo$i/gpumux_ppq-even-drain.log | grep -c . 
grep -h "where they spent" /tmp/lo$i/gpumux_ppq-even-drain.log | tail -8 | sed -E 's/^.*client ([0-9]+).*ran ([0-9]+) kernels.*Where a launch.s time goes"\): /c\1 n\2 /' | cut -c1-200
done 2>&1 | tee "$O/overhead.txt"

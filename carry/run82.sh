#!/usr/bin/env bash
# Session 14, call 4: requests that waited long for the core summed up once a second instead of
# a log line each (commit B, carry/daemon) against the line each (commit A, carry/prev): the
# overhead experiment, in turn, twice, with the load clocks' quarter-second laps.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/b82-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i-$b.txt" 2>&1
echo "== $i $b rc $?"
grep -E "^(added|gpumuxd|native)" "$O/ov-$i-$b.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b82-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
echo "log lines: $(wc -l < $f)"
grep -h "gpumuxd::load\|launch commands, mean\|ran 2600 kernels\|request(s) waited" "$f" | sed 's/^.*Z //' > "$O/load-$i-$b.txt"
grep -h "gpumuxd::load" "$f" | sed 's/^.*gpumuxd::load: //' | grep -E 'busy [4-9][0-9]\.' | tail -4 | cut -c1-400
done

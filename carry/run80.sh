#!/usr/bin/env bash
# Session 14, call 2: the core's time per launch with frames to clients apart from the messages,
# and which threads are on the CPUs during the launch-rate runs (top -H every 0.2 s).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2; do
(top -b -H -d 0.2 -n 60 -w 200 > "$O/top-$i.txt" 2>&1 &)
OUT=/tmp/b80-$i BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i.txt" 2>&1
echo "== $i rc $?"
sleep 1
grep -E "^(added|gpumuxd|native)" "$O/ov-$i.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b80-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
grep -h "gpumuxd::load\|launch commands, mean\|ran 20100 kernels\|ran 10100 kernels\|ran 5100 kernels\|ran 2600 kernels" "$f" | sed 's/^.*Z //' > "$O/load-$i.txt"
grep -h "gpumuxd::load" "$f" | sed 's/^.*gpumuxd::load: //' | grep -E 'busy [4-9][0-9]\.' | cut -c1-400
done
# The busiest threads in the snapshots with the most CPU in use.
for i in 1 2; do
awk '/^top -/{n++} /^ *[0-9]+ /{ if ($9+0 > 30) print n, $9, $12 }' "$O/top-$i.txt" | sort -k1,1n -k2,2nr | awk '{c[$1]++; if (c[$1] <= 24) print}' | awk '{a[$1]=a[$1] " " $3 ":" $2} END {for (k in a) print k, a[k]}' | sort -n | tail -12
done

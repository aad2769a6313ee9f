#!/usr/bin/env bash
# Session 14, call 3: a CPU profile of the daemon (core and device process) during the 8-client
# launch-rate run, with this machine's Debian perf carried in carry/perf (software cpu-clock).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
P="env LD_LIBRARY_PATH=$PWD/carry/perf/lib carry/perf/perf"
ldd --version | head -1; cat /sys/devices/system/clocksource/clocksource0/current_clocksource
$P --version; $P record -e cpu-clock -o /tmp/t.data -- sleep 0.05 2>&1 | tail -2 || echo "perf record failed"
rm -rf /tmp/b81; mkdir -p /tmp/b81
(OUT=/tmp/b81 BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov.txt" 2>&1; echo "bench rc $?") &
# Start recording when the 8-client run begins.
# The daemon runs inside `gpumux` (its thread gpumuxd-core); its device process is its child.
# Record from the 4-client run to the daemon's end (4 and 8 clients).
for _ in $(seq 1 3000); do
  grep -q "launch rate, 4 clients" /tmp/b81/bench-daemon.err 2>/dev/null && break
  sleep 0.01
done
d=$(ps -eLo pid,comm | awk '$2=="gpumuxd-core"{print $1}' | sort -u | tail -1)
pids=$(echo "$d" $(pgrep -P "$d") | tr ' ' ',')
echo "recording pids $pids"
$P record -F 1000 --call-graph dwarf,8192 -p "$pids" -o /tmp/p81.data -- sleep 1.5 2>&1 | tail -2
wait
grep -E "^(added|gpumuxd|native)" "$O/ov.txt" | grep -v "2 ms"
$P report -i /tmp/p81.data --no-children --sort comm,symbol -g none --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -70 > "$O/flat.txt"
$P report -i /tmp/p81.data --no-children --comm gpumuxd-core --sort symbol -g caller,0.5,callee,function,percent --stdio 2>/dev/null | head -600 > "$O/core-callers.txt"
$P report -i /tmp/p81.data --children --comm gpumuxd-core --sort symbol -g none --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -120 > "$O/core-children.txt"
$P report -i /tmp/p81.data --children --pid $(echo $pids | cut -d, -f2) --sort symbol -g none --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -120 > "$O/device-children.txt"
cut -c1-150 "$O/flat.txt" | head -45
echo; cut -c1-150 "$O/core-children.txt" | head -60

#!/usr/bin/env bash
# Session 15, call 12: with the launcher thread, a CPU profile of the daemon (core thread and device process) through a
# long 8-client launch-rate phase (--rate-clients 8 --rate-launches 400000: several seconds
# instead of 0.3), 2 s at 1000 samples/s with dwarf call graphs; the load clocks' lines kept.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
OUT=$O/profile FROM="launch rate, 8 clients" SECONDS_TO_RECORD=2 FREQ=1000 \
  bash scripts/profile-daemon-gpu.sh --only overhead --rate-clients 8 --rate-launches 400000 2>&1 | tail -60
P="env LD_LIBRARY_PATH=$PWD/carry/perf/lib $PWD/carry/perf/perf"
$P report -i /tmp/profile-daemon.data --stdio --no-children --comm gpumuxd-core -g caller,0.5,callee,function,percent --percent-limit 0.7 2>/dev/null \
  | grep -v '^#' | grep -v '^$' | head -700 > "$O/profile/core-graph.txt"
mkdir -p /tmp/l && tar xzf "$O/profile/logs.tgz" -C /tmp/l 2>/dev/null
grep -h "gpumuxd::load" /tmp/l/*.log | cut -c1-400 | tail -30 > "$O/profile/load.txt"
echo "--- load"; tail -8 "$O/profile/load.txt"
rm -f "$O/profile/logs.tgz"
P="env LD_LIBRARY_PATH=$PWD/carry/perf/lib $PWD/carry/perf/perf"
$P report -i /tmp/profile-daemon.data --stdio --no-children --comm gpumuxd -g caller,0.5,callee,function,percent --percent-limit 0.4 2>/dev/null | grep -v '^#' | grep -v '^$' | head -900 > "$O/profile/device-graph.txt"
$P report -i /tmp/profile-daemon.data --stdio --no-children --sort comm,symbol -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | grep launcher | head -40 > "$O/profile/launcher.txt"

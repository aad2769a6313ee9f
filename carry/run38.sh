#!/usr/bin/env bash
# Session 11, call 5: where the core thread and the device process spend their CPU during the
# overhead experiment (perf carried from the dev machine; gpumuxd with its symbol table).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export LD_LIBRARY_PATH=$PWD/carry/perf
P=$PWD/carry/perf/perf
$P --version || exit 1
mkdir -p /tmp/bin && cp carry/daemon/gpumux /tmp/bin/ && cp carry/sym/gpumuxd /tmp/bin/
$P record -F 20000 -a -o /tmp/perf.data -- env OUT=/tmp/b38 BIN=/tmp/bin bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead.txt" 2>&1
echo "record rc $?"
grep -E "^(native|gpumuxd|added|gpumux )" "$O/overhead.txt"
R="$P report -i /tmp/perf.data --no-children --stdio"
$R --sort comm 2>/dev/null | grep -v "^#" | grep -v "^$" | head -30 > "$O/by-comm.txt"
$R --comms gpumuxd-core --sort dso,sym 2>/dev/null | grep -v "^#" | grep -v "^$" | head -80 > "$O/core.txt"
$R --comms gpumuxd --sort dso,sym 2>/dev/null | grep -v "^#" | grep -v "^$" | head -80 > "$O/device.txt"
head -20 "$O/by-comm.txt"; echo; head -45 "$O/core.txt"; echo; head -45 "$O/device.txt"

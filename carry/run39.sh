#!/usr/bin/env bash
# Session 11, call 6: run 38's profile again, with gpumux's symbol table (the daemon ran as `gpumux daemon`).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export LD_LIBRARY_PATH=$PWD/carry/perf
P=$PWD/carry/perf/perf
cp carry/sym/gpumux /tmp/bin/gpumux
R="$P report -i /tmp/perf.data --no-children --stdio --percentage relative"
for c in gpumuxd-core gpumuxd gpumuxd-r2 gpumuxd-w2 gpumux-client-r gpumux; do
$R --comms $c --sort dso,sym 2>/dev/null | grep -v "^#" | grep -v "^$" | head -60 > "$O/$c.txt"
echo "== $c"; head -40 "$O/$c.txt" | cut -c1-150
done

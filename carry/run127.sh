#!/usr/bin/env bash
# Session 17, call 9: one client's launch rate, the final build (carry/daemon, 019ac38) against
# main (carry/prev, e09d074), in turn, six pairs, with 40,000 launches per rate figure and only
# the 1- and 8-client figures: is the one-client deficit of runs 162-164 real?
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
i=0
for b in daemon prev prev daemon daemon prev prev daemon daemon prev prev daemon; do
i=$((i+1))
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead --rate-clients 1,8 --rate-launches 40000 > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|added|gpumuxd)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
done > "$O/overhead.txt" 2>&1
grep -E "^== |1 clients|8 clients" "$O/overhead.txt"

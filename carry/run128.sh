#!/usr/bin/env bash
# Session 17, call 10: which part of the final build (carry/daemon, 019ac38) costs one client
# its rate (run 166): the same build without the launcher thread's sums (carry/v1: the launch
# clock's sampled parts only) and main (carry/prev, e09d074), in rotation, four rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
i=0
for b in prev v1 daemon v1 daemon prev daemon prev v1 prev v1 daemon; do
i=$((i+1))
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead --rate-clients 1,8 --rate-launches 40000 > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|added|gpumuxd)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
done > "$O/overhead.txt" 2>&1
grep -E "^== |1 clients|8 clients" "$O/overhead.txt"

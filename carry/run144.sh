#!/usr/bin/env bash
# Session 19, call 5: main's build (prev) against this one (daemon): the overhead, four pairs in
# turn (scripts/ab); then the priority experiment, the default policy only, prev daemon daemon prev.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab144 PAIRS=4 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/daemon > "$O/ab-overhead.txt" 2>&1
cat "$O/ab-overhead.txt" | grep -v "^run " | cut -c1-200
i=0
for b in prev daemon daemon prev; do
  i=$((i+1))
  OUT=/tmp/p144-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority > "$O/priority-$i-$b.txt" 2>&1
  echo "== priority $i $b rc $?"
  grep -E "blocks: (gpumux|MPS)" "$O/priority-$i-$b.txt" | tr -s ' ' | cut -c1-100
done

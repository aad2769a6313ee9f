#!/usr/bin/env bash
# Session 19, call 11: the core sends the commands of requests it handled while a pump's last
# poll was out (they waited for the next request or a timer, up to a second with the device
# idle). carry/prev: main before it (65acd51); carry/daemon: with it. The daemon check; the
# overhead, three pairs in turn; the priority experiment once each.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/ab150 PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/daemon > "$O/ab-overhead.txt" 2>&1
grep -v "^run " "$O/ab-overhead.txt" | grep -E "launches|prev:|daemon:|better|p50|p99" | cut -c1-160
for b in prev daemon; do
  OUT=/tmp/p150-$b BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only priority \
    --priority-policies ppq-even-drain+no-hw-priority > "$O/priority-$b.txt" 2>&1
  echo "== priority $b rc $?"
  grep -E "blocks: (gpumux|MPS)" "$O/priority-$b.txt" | tr -s ' ' | cut -c1-100
done

#!/usr/bin/env bash
# Session 15, call 4: how many kernels a second the GPU turns around in the daemon's pattern
# with an ideal host loop (scripts/grid-rate), then the daemon's own launch rate on the same
# instance (main's build, carry/prev: the overhead experiment once).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp bash scripts/grid-rate/run.sh 2>&1 | tee "$O/grid-rate.txt"
OUT=/tmp/ov BIN=carry/prev timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov.txt 2>&1
echo "== overhead rc $?"
grep -E "^(native|gpumuxd|added)" /tmp/ov.txt | tr -s ' ' | tee "$O/overhead.txt"

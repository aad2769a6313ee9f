#!/usr/bin/env bash
# Session 11, call 15: where a launch command's time goes in the CUDA device (the device's new launch clock):
# the overhead experiment once, the clock's lines from every daemon's log.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/b47 BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead.txt" 2>&1
echo "overhead rc $?"
grep -E "^(native|gpumuxd|added|gpumux )" "$O/overhead.txt"
mkdir -p /tmp/l47 && tar xzf /tmp/b47/logs.tgz -C /tmp/l47 2>/dev/null
for f in /tmp/l47/*.log; do echo "-- $(basename $f)"; grep -h "launch commands\|ran 2100 kernels" $f | sed 's/.*INFO [a-z_:]*: //' | cut -c1-330; done | tee "$O/clock.txt"

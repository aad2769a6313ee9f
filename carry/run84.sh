#!/usr/bin/env bash
# Session 14, call 6: what a kernel launch costs the host thread by shape (streams, priorities,
# grid, parameters, event records, hardware queues): scripts/launch-cost. Then a profile of the
# daemon during the 8-client launch rate (scripts/profile-daemon-gpu.sh, 4000 samples/s).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=$O bash scripts/launch-cost/run.sh 2>&1 | tee "$O/launch-cost.txt"
OUT=$O/profile FROM="launch rate, 8 clients" SECONDS_TO_RECORD=0.6 FREQ=4000 bash scripts/profile-daemon-gpu.sh --only overhead 2>&1 | tail -95
rm -f "$O/launch_cost"

#!/usr/bin/env bash
# Session 19, call 12: the late commands drained only when the device does not ask to be polled
# again (cond) against draining them always (uncond, run 190) and main (prev): the overhead.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab151a PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/cond > "$O/ab-prev-cond.txt" 2>&1
grep -v "^run " "$O/ab-prev-cond.txt" | grep -E "launches|prev:|cond:|better|p50|p99" | cut -c1-160
OUT=/tmp/ab151b PAIRS=2 bash scripts/ab/ab-daemon-gpu.sh carry/uncond carry/cond > "$O/ab-uncond-cond.txt" 2>&1
grep -v "^run " "$O/ab-uncond-cond.txt" | grep -E "launches|uncond:|cond:|better|p50|p99" | cut -c1-160

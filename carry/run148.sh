#!/usr/bin/env bash
# Session 19, call 9: the overhead of the final build (daemon) against main's (prev) and against
# itself without busy() counting kernels queued ahead (nobusy), three pairs each (scripts/ab).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab148a PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/daemon > "$O/ab-prev.txt" 2>&1
grep -v "^run " "$O/ab-prev.txt" | grep -E "launches|prev:|daemon:|better|p50" | cut -c1-160
OUT=/tmp/ab148b PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/nobusy carry/daemon > "$O/ab-nobusy.txt" 2>&1
grep -v "^run " "$O/ab-nobusy.txt" | grep -E "launches|nobusy:|daemon:|better|p50" | cut -c1-160

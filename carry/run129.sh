#!/usr/bin/env bash
# Session 17, call 11: scripts/ab/ab-daemon-gpu.sh on the GPU machine: main (carry/prev, e09d074)
# against the session's final build (carry/daemon, 019ac38; comments only since), six pairs,
# the 1- and 8-client launch rates of 40,000 launches.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab PAIRS=6 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/daemon --only overhead --rate-clients 1,8 --rate-launches 40000 > "$O/ab.txt" 2>&1
echo "ab rc $?"; cat "$O/ab.txt"

#!/usr/bin/env bash
# Session 17, call 12: the launch + sync tail again: main (carry/prev, e09d074)
# against the session's final build (carry/daemon, 019ac38; comments only since), eight pairs,
# only the one-client rate: is the higher p99 of run 168 the build?
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab PAIRS=8 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/daemon --only overhead --rate-clients 1 --rate-launches 20000 > "$O/ab.txt" 2>&1
echo "ab rc $?"; cat "$O/ab.txt"

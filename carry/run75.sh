#!/usr/bin/env bash
# Session 13, call 9: the daemon check on the session's final build (lockstep, load clocks; CUDA code as in run 99).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
grep -h "core: busy\|device process: busy" /tmp/check -r 2>/dev/null | head -4 | cut -c1-250

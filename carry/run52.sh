#!/usr/bin/env bash
# Session 11, call 20: the last code (RingReceiver::sleep_on) on the GPU: the daemon check and the overhead.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
OUT=/tmp/b52 BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead.txt" 2>&1
echo "overhead rc $?"
grep -E "^(native|gpumuxd|added|gpumux )" "$O/overhead.txt"

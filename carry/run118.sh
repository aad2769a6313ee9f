#!/usr/bin/env bash
# Session 16, call 8: pollers that hold their core for the first 64 looks of a wait
# (carry/daemon) against the build before (carry/prev, b4bcc02): the daemon check, then the
# overhead experiment in turn, three pairs.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
i=0
for b in daemon prev prev daemon daemon prev; do
i=$((i+1))
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|added|gpumuxd)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
done 2>&1 | tee "$O/overhead.txt"

#!/usr/bin/env bash
# Session 10, call 14: the head (core.rs split) on the GPU: daemon check and one default co-run.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
OUT=/tmp/b35 BIN=carry/daemon timeout 140 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain > "$O/corun.log" 2>&1
echo "corun rc $?"
mkdir -p /tmp/l35 && tar xzf /tmp/b35/logs.tgz -C /tmp/l35 2>/dev/null; grep -h "queue ahead:\|ERROR" /tmp/l35/*.log | cut -c60-300
grep -E "(MPS|gpumux).*(yes|no)$" "$O/corun.log"

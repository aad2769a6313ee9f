#!/usr/bin/env bash
# Session 11, call 8: the co-run on the rings build: the default and own SMs.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/b40 BIN=carry/daemon timeout 400 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain,ppq-even-drain+own-sms > "$O/corun.txt" 2>&1
echo "corun rc $?"
mkdir -p /tmp/l40 && tar xzf /tmp/b40/logs.tgz -C /tmp/l40 2>/dev/null; grep -h "queue ahead:\|ERROR" /tmp/l40/*.log | cut -c60-300
grep -A40 "^Co-run" "$O/corun.txt" | head -60

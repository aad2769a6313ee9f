#!/usr/bin/env bash
# Session 12, call 11: long low-priority launches (20 ms, --lp-launch-ms 20): what SMs given back and left idle
# cost them, and what refills buy: the default (refill where a grow cannot go on in place) beside +refill-always
# and +no-refill, 100 and 1000 µs blocks; then the usual 2 ms launches with +refill-always at 100 µs once more.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/b63 BIN=carry/daemon timeout 400 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies ppq-even-drain+refill-always,ppq-even-drain+no-refill --block-us 100,1000 --lp-launch-ms 20 > "$O/priority-long.txt" 2>&1
echo "long rc $?"
mkdir -p /tmp/l63 && tar xzf /tmp/b63/logs.tgz -C /tmp/l63 2>/dev/null; grep -h "refills:" /tmp/l63/*.log | cut -c60-400
grep -E "blocks: " "$O/priority-long.txt"

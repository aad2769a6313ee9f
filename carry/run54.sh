#!/usr/bin/env bash
# Session 12, call 2: headroom for urgent launches (cuda:0,headroom=N): the priority experiment,
# the default beside +headroom (1 slot) and +headroom=2, every block size, MPS and native in the same run.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/b54 BIN=carry/daemon timeout 560 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies ppq-even-drain+headroom,ppq-even-drain+headroom=2 > "$O/priority.txt" 2>&1
echo "priority rc $?"
mkdir -p /tmp/l54 && tar xzf /tmp/b54/logs.tgz -C /tmp/l54 2>/dev/null; grep -h "queue ahead:\|ERROR\|panick" /tmp/l54/*.log | cut -c60-400 > "$O/counters.txt"; head -20 "$O/counters.txt"
cp /tmp/b54/*.json "$O/" 2>/dev/null
grep -A40 "^Cross-process priority" "$O/priority.txt" | head -50

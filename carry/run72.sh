#!/usr/bin/env bash
# Session 13, call 6: is the host's CPU oversubscribed while 8 clients launch? vmstat every second during the
# overhead experiment (lockstep build), with the bench's progress lines time-stamped beside it.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
nproc
vmstat -n 1 > "$O/vmstat.txt" 2>&1 & vm=$!
( OUT=/tmp/b72 BIN=carry/daemon timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov.txt" 2>&1 ) &
b=$!
while kill -0 $b 2>/dev/null; do date +%s; top -b -n 1 -H -w 200 | sed -n 1,40p | grep -E "^top|^%Cpu|gpumux|bench|R " | head -30; sleep 1; done > "$O/top.txt" 2>&1
kill $vm
grep -E "^(added|gpumuxd)" "$O/ov.txt" | grep -v "2 ms"
grep -n "launch rate" /tmp/b72/bench-daemon.err | head
awk '{print $1, $13, $14, $15, $16}' "$O/vmstat.txt" | tr '\n' ';'

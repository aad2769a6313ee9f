#!/usr/bin/env bash
# Session 14, call 13: the session's last code (ppq-even's lists in slot order, the one-turn
# urgent launch): the daemon check, then the priority and overhead experiments once.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=$O/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
rm -rf "$O/check"
OUT=/tmp/b91 BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" > "$O/bench.txt" 2>&1
echo "== bench rc $?"
grep -E "^(added|gpumuxd|native|20 µs|100 µs|1000 µs)" "$O/bench.txt" | grep -v "2 ms"

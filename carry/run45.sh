#!/usr/bin/env bash
# Session 11, call 13: where an urgent kernel's time goes on the rings build: the priority experiment at
# 20 and 100 µs blocks, default only, the core's retreat turns logged (debug).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
RUST_LOG=info,gpumuxd::core=debug OUT=/tmp/b45 BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > "$O/priority.txt" 2>&1
echo "priority rc $?"
grep -A12 "^setting" "$O/priority.txt"
mkdir -p /tmp/l45 && tar xzf /tmp/b45/logs.tgz -C /tmp/l45 2>/dev/null; ls /tmp/l45
grep -h "ran [0-9]* kernels" /tmp/l45/*.log | sed 's/.*INFO gpumuxd::core: //' | cut -c1-400 | tee "$O/stages.txt"
grep -h "retreat" /tmp/l45/*.log | grep DEBUG | head -3 | cut -c1-400
grep -h "retreat" /tmp/l45/*.log | grep DEBUG | sed 's/.*DEBUG //' > /tmp/turns.txt; wc -l /tmp/turns.txt; gzip -c /tmp/turns.txt > "$O/turns.txt.gz"

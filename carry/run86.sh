#!/usr/bin/env bash
# Session 14, call 8: the final build (commit ec66981: load parts, slow waits summed up; the CUDA
# code is run 99's): the daemon check, then the overhead and priority experiments once each.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=$O/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
export RUST_LOG=info,gpumuxd::load=debug
OUT=/tmp/b86 BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" > "$O/bench.txt" 2>&1
echo "== bench rc $?"
grep -E "^(added|gpumuxd|native|20 µs|100 µs|1000 µs)" "$O/bench.txt" | grep -v "2 ms"
mkdir -p /tmp/l86; tar xzf /tmp/b86/logs.tgz -C /tmp/l86 2>/dev/null
grep -h "request(s) waited\|core: busy .* of [0-9.]* s;" /tmp/l86/gpumux_ppq-even-drain.log | sed 's/^.*Z //' | grep -v "gpumuxd::load" | cut -c1-300 > "$O/log-lines.txt"
wc -l < /tmp/l86/gpumux_ppq-even-drain.log; tail -3 "$O/log-lines.txt"

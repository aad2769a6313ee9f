#!/usr/bin/env bash
# Session 14, call 9: an urgent launch in the same turn as the retreat that makes room for it
# (commit after ec66981, carry/daemon) against two turns (carry/prev). The daemon check, then the
# priority experiment (default only) in turn three times, with the stage log, and the overhead once each.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=$O/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
export RUST_LOG=info,gpumuxd::core=debug
for i in 1 2 3 4 5 6; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/p87-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" > "$O/pr-$i-$b.txt" 2>&1
echo "== prio $i $b rc $?"
grep -E "^(20|100|1000) µs blocks: gpumux" "$O/pr-$i-$b.txt"
mkdir -p /tmp/lp$i; tar xzf /tmp/p87-$i/logs.tgz -C /tmp/lp$i 2>/dev/null
f=$(ls /tmp/lp$i/gpumux_ppq-even-drain*.log | head -1)
grep -h "a turn with a retreat" "$f" | sed 's/^.*a turn/a turn/' > "$O/turns-$i-$b.txt"
echo "turns with a retreat: $(wc -l < $O/turns-$i-$b.txt); rounds:" $(awk '{print $(NF-1)}' "$O/turns-$i-$b.txt" | sort | uniq -c | sort -rn | head -3 | tr '\n' ' ')
grep -h "ran 200 kernels; where" "$f" | sed 's/.*goes"): //' | head -3 | cut -c1-200
done
unset RUST_LOG
for i in 1 2; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/o87-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i-$b.txt" 2>&1
echo "== ov $i $b rc $?"
grep -E "^(added|gpumuxd, 8)" "$O/ov-$i-$b.txt"
done

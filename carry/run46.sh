#!/usr/bin/env bash
# Session 11, call 14: the engine's cheaper urgent round (951e38d) against the build before it (539984d),
# in turn: priority (default only) and overhead; then the daemon check on the new build.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
b=carry/base; n=base; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=engine; }
RUST_LOG=info,gpumuxd::core=debug OUT=/tmp/b46-$i BIN=$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" > "$O/run-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "blocks: gpumux|^(added|gpumuxd, 8)" "$O/run-$i-$n.txt"
mkdir -p /tmp/l46-$i && tar xzf /tmp/b46-$i/logs.tgz -C /tmp/l46-$i 2>/dev/null
grep -h "a turn with a retreat" /tmp/l46-$i/*.log | sed 's/.*engine \([0-9.]*\) µs.*/\1/' | sort -n | awk '{a[NR]=$1} END {print "engine µs per retreat turn, p50", a[int(NR/2)+1], "p90", a[int(NR*0.9)+1], "n", NR}'
done
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"

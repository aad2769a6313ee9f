#!/usr/bin/env bash
# Session 14, call 10: the one-turn urgent launch (carry/daemon) against two turns (carry/prev),
# the priority experiment (default only) in turn four more times; per build, the retreat turns'
# engine and poll times (stage log at debug) and the urgent client's stages, printed here.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::core=debug
for i in 1 2 3 4 5 6 7 8; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/p88-$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" > /tmp/pr-$i.txt 2>&1
echo "== prio $i $b rc $?"
grep -E "^(20|100|1000) µs blocks: gpumux" /tmp/pr-$i.txt
mkdir -p /tmp/lp$i; tar xzf /tmp/p88-$i/logs.tgz -C /tmp/lp$i 2>/dev/null
f=$(ls /tmp/lp$i/gpumux_ppq-even-drain*.log | head -1)
grep -h "a turn with a retreat" "$f" | sed 's/^.*a turn/a turn/' | awk '{for (k=1;k<=NF;k++) { if ($k=="engine") e+=$(k+1); if ($k=="polls") p+=$(k+1); if ($k=="launch" && $(k+1)=="calls") l+=$(k+2) } n++} END {printf "retreat turns %d: mean engine %.1f µs, launch calls %.1f µs, polls %.1f µs\n", n, e/n, l/n, p/n}'
grep -h "ran [0-9]* kernels; where" "$f" | sed 's/^.*client [0-9]* (\(bench-[0-9-]*\)) ran \([0-9]*\) kernels.*goes"): /\1 \2: /' | cut -c1-190
done 2>&1 | tee "$O/summary.txt"

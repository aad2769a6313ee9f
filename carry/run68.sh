#!/usr/bin/env bash
# Session 13, call 2: where the core's and the device process's time goes (gpumuxd::load=debug, one line a
# second each) while clients launch; the pipelined link with polls spaced by the core's cadence (5 µs, and
# --poll-us 1) against the build before (15eaa09), overhead in turn twice; then priority at 1000 µs blocks.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
i=0
for round in 1 2; do
for v in base new new-poll1; do
i=$((i+1)); b=carry/daemon; extra=(); [ $v = base ] && b=carry/base; [ $v = new-poll1 ] && extra=(--daemon-args "--poll-us 1")
OUT=/tmp/b68-$i BIN=$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead "${extra[@]}" > "$O/ov-$i-$v.txt" 2>&1
echo "== $i $v rc $?"
grep -E "^(added|gpumuxd)" "$O/ov-$i-$v.txt"
mkdir -p /tmp/l$i; tar xzf /tmp/b68-$i/logs.tgz -C /tmp/l$i 2>/dev/null
grep -h "gpumuxd::load\|core: busy\|device process: busy" /tmp/l$i/gpumux_ppq-even-drain.log > "$O/load-$i-$v.txt" 2>/dev/null
grep -h "INFO.*\(core: busy\|device process: busy\)" /tmp/l$i/gpumux_ppq-even-drain.log | cut -c28-400
done
done
for i in 1 2 3 4; do
b=carry/base; n=base; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=new; }
OUT=/tmp/p68-$i BIN=$b timeout 120 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 1000 > "$O/pr-$i-$n.txt" 2>&1
echo "== pr $i $n rc $?"
grep -E "blocks: gpumux" "$O/pr-$i-$n.txt"
done

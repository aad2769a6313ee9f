#!/usr/bin/env bash
# Session 16, call 1: protocol 3 (no reply to an accepted launch) and the device link's posted
# messages (one ring write a round), carry/daemon, against main 1cd7414 (carry/prev): the daemon
# check first, then the overhead experiment in turn, three pairs, with the core's and the device
# process's busiest quarter seconds, then the priority experiment at 20 and 100 µs blocks, one pair.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
top() { grep -h "gpumuxd::load: $1: busy" "$2" | sed "s/^.*$1: busy/$1: busy/" | awk -F';' '{split($2,a," "); print a[1], $0}' | sort -n -r | head -1 | cut -d' ' -f2- | cut -c1-330; }
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4 5 6; do
b=daemon; [ $((i % 2)) -eq 0 ] && b=prev
s=$(date +%s)
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $? $(( $(date +%s) - s )) s"
grep -E "^(native|gpumuxd|added)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
top core /tmp/lo$i/gpumux_ppq-even-drain.log; top "device process" /tmp/lo$i/gpumux_ppq-even-drain.log
done 2>&1 | tee "$O/overhead.txt"
unset RUST_LOG
for i in 1 2; do
b=daemon; [ $((i % 2)) -eq 0 ] && b=prev
OUT=/tmp/pr$i BIN=carry/$b timeout 100 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > /tmp/pr-$i.txt 2>&1
echo "== priority $i $b rc $?"
grep -E "^(20|100) µs blocks: (gpumux|MPS)" /tmp/pr-$i.txt | tr -s ' ' | cut -c1-110
done 2>&1 | tee "$O/priority.txt"

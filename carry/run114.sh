#!/usr/bin/env bash
# Session 16, call 4: a round's completions handled while the poll's answer is on its way
# (carry/daemon, commit 6d7c9e9): the daemon check; the overhead experiment in turn with protocol 3
# alone (carry/p3) and main 1cd7414 (carry/prev), three rounds; the priority experiment once for
# it and for p3.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
top() { grep -h "gpumuxd::load: $1: busy" "$2" | sed "s/^.*$1: busy/$1: busy/" | awk -F';' '{split($2,a," "); print a[1], $0}' | sort -n -r | head -1 | cut -d' ' -f2- | cut -c1-400; }
export RUST_LOG=info,gpumuxd::load=debug
i=0
for round in 1 2 3; do for b in daemon p3 prev; do
i=$((i+1))
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(added|gpumuxd, [18] client)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
top core /tmp/lo$i/gpumux_ppq-even-drain.log; top "device process" /tmp/lo$i/gpumux_ppq-even-drain.log
grep -h "where they spent" /tmp/lo$i/gpumux_ppq-even-drain.log | tail -1 | sed -E 's/^.*time goes"\): //' | cut -c1-200
done; done 2>&1 | tee "$O/overhead.txt"
unset RUST_LOG
i=0
for b in daemon p3; do
i=$((i+1))
OUT=/tmp/pr$i BIN=carry/$b timeout 100 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > /tmp/pr-$i.txt 2>&1
echo "== priority $i $b rc $?"
grep -E "^(20|100) µs blocks: (gpumux|MPS)" /tmp/pr-$i.txt | tr -s ' ' | cut -c1-110
done 2>&1 | tee "$O/priority.txt"

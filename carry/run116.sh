#!/usr/bin/env bash
# Session 16, call 6: unbindings posted and carried out after the poll (carry/daemon):
# the daemon check, then the overhead experiment in turn with protocol 3 alone (carry/p3), four
# pairs, the final build first in two and second in two.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
top() { grep -h "gpumuxd::load: $1: busy" "$2" | sed "s/^.*$1: busy/$1: busy/" | awk -F';' '{split($2,a," "); print a[1], $0}' | sort -n -r | head -1 | cut -d' ' -f2- | cut -c1-400; }
export RUST_LOG=info,gpumuxd::load=debug
i=0
for b in daemon p3 p3 daemon daemon p3 p3 daemon; do
i=$((i+1))
OUT=/tmp/ov$i BIN=carry/$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|added|gpumuxd, [1248] client)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null; top core /tmp/lo$i/gpumux_ppq-even-drain.log; top "device process" /tmp/lo$i/gpumux_ppq-even-drain.log
done 2>&1 | tee "$O/overhead.txt"

#!/usr/bin/env bash
# Session 15, call 15: requests handled during polls again, now on top of the launcher thread (carry/daemon), against
# the build before (carry/prev). The daemon check on the new build; then the overhead experiment
# (the rate with 1/2/4/8 clients) in turn, twice per build, with the core's busiest quarter
# seconds; then the priority experiment at 20 and 100 µs blocks once per build.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/ov$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|gpumuxd|added|gpumux ppq)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
grep -h "gpumuxd::load: core: busy" /tmp/lo$i/gpumux_ppq-even-drain.log | sed 's/^.*core: busy/core: busy/' | sort -t';' -k2 -n -r | awk -F';' '{split($2,a," "); print a[1], $0}' | sort -n -r | head -2 | cut -d' ' -f2- | cut -c1-330
done 2>&1 | tee "$O/overhead.txt"
unset RUST_LOG
for i in 1 2; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/pr$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > /tmp/pr-$i.txt 2>&1
echo "== priority $i $b rc $?"
grep -E "^(20|100) µs blocks: " /tmp/pr-$i.txt | tr -s ' ' | cut -c1-110
done 2>&1 | tee "$O/priority.txt"

#!/usr/bin/env bash
# Session 16, call 3: workers queued ahead started after the poll's answer (carry/daemon, carry/t):
# the GPU tests and the daemon check on it; the overhead experiment in turn: that build, the same
# with GPUMUX_AFTER_POLL=0, protocol 3 alone (carry/p3) and main 1cd7414 (carry/prev), twice
# each, with the busiest quarter seconds; the priority experiment once each for it and main;
# last scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-160
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
top() { grep -h "gpumuxd::load: $1: busy" "$2" | sed "s/^.*$1: busy/$1: busy/" | awk -F';' '{split($2,a," "); print a[1], $0}' | sort -n -r | head -1 | cut -d' ' -f2- | cut -c1-400; }
export RUST_LOG=info,gpumuxd::load=debug
i=0
for round in 1 2; do for b in daemon off p3 prev; do
i=$((i+1)); bin=$b; env=""
[ $b = off ] && { bin=daemon; env="GPUMUX_AFTER_POLL=0"; }
env $env OUT=/tmp/ov$i BIN=carry/$bin timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(added|gpumuxd, [18] client)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
top core /tmp/lo$i/gpumux_ppq-even-drain.log; top "device process" /tmp/lo$i/gpumux_ppq-even-drain.log
grep -h "where they spent" /tmp/lo$i/gpumux_ppq-even-drain.log | tail -1 | sed -E 's/^.*time goes"\): //' | cut -c1-200
grep -h "queue ahead:" /tmp/lo$i/gpumux_ppq-even-drain.log | tail -1 | cut -c1-300
done; done 2>&1 | tee "$O/overhead.txt"
unset RUST_LOG
i=0
for b in daemon prev; do
i=$((i+1))
OUT=/tmp/pr$i BIN=carry/$b timeout 100 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > /tmp/pr-$i.txt 2>&1
echo "== priority $i $b rc $?"
grep -E "^(20|100) µs blocks: (gpumux|MPS)" /tmp/pr-$i.txt | tr -s ' ' | cut -c1-110
done 2>&1 | tee "$O/priority.txt"
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"

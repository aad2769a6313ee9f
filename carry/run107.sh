#!/usr/bin/env bash
# Session 15, call 13: the context set only when another is current (carry/daemon, carry/t)
# against the launcher-thread build before it (carry/prev): GPU tests and the daemon check on
# the new build; the overhead experiment in turn, twice each, with the device process's busiest
# quarter seconds; last scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-160
OUT=/tmp/check BIN=carry/daemon timeout 200 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
top() { grep -h "gpumuxd::load: $1: busy" "$2" | sed "s/^.*$1: busy/$1: busy/" | awk -F';' '{split($2,a," "); print a[1], $0}' | sort -n -r | head -1 | cut -d' ' -f2- | cut -c1-330; }
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=prev; [ $((i % 2)) -eq 0 ] && b=daemon
OUT=/tmp/ov$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|gpumuxd|added)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
top core /tmp/lo$i/gpumux_ppq-even-drain.log; top "device process" /tmp/lo$i/gpumux_ppq-even-drain.log
done 2>&1 | tee "$O/overhead.txt"
unset RUST_LOG
timeout 200 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"

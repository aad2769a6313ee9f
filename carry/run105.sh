#!/usr/bin/env bash
# Session 15, call 11: the launcher thread spinning 200 µs for its next job (carry/daemon) against
# the build before the launcher thread (carry/prev): client GPU tests; overhead once each; the
# priority experiment at 20 and 100 µs blocks twice each, in turn.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.txt" 2>&1
grep -E "test result|status|panicked|FAILED" "$O/tests.txt" | cut -c1-160
for i in 1 2; do
b=daemon; [ $((i % 2)) -eq 0 ] && b=prev
OUT=/tmp/ov$i BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $b rc $?"
grep -E "^(native|gpumuxd|added)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
done 2>&1 | tee "$O/overhead.txt"
for i in 1 2 3 4; do
b=daemon; [ $((i % 2)) -eq 0 ] && b=prev
OUT=/tmp/pr$i BIN=carry/$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > /tmp/pr-$i.txt 2>&1
echo "== priority $i $b rc $?"
grep -E "^(20|100) µs blocks: (gpumux|MPS)" /tmp/pr-$i.txt | tr -s ' ' | cut -c1-110
done 2>&1 | tee "$O/priority.txt"

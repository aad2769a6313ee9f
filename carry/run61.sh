#!/usr/bin/env bash
# Session 12, call 9: what a refill buys a launch given back half its SMs (client_gpu's refill test, its step
# times, three times), and the priority experiment at 20 µs blocks, the default beside +no-refill, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3; do carry/t/client_gpu --test-threads 1 --nocapture refilled 2>&1 | grep -E "step|refills|test result"; done | tee "$O/refill-steps.txt"
for i in 1 2; do
OUT=/tmp/b61-$i BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies ppq-even-drain+no-refill --block-us 20 > "$O/priority-$i.txt" 2>&1
echo "== $i rc $?"; grep -E "blocks: (gpumux|MPS)" "$O/priority-$i.txt"
done

#!/usr/bin/env bash
# Session 12, call 1: the co-run chooser trying leaning placements too (one kernel taking 6 or 7
# eighths of each SM, the other the rest): its probe log gives every candidate's rates per pair.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
RUST_LOG=info,gpumux_cuda::client::device::corun=debug OUT=/tmp/b53 BIN=carry/daemon timeout 400 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain,ppq-even-drain+co-locate,ppq-even-drain+own-sms > "$O/corun.txt" 2>&1
echo "corun rc $?"
mkdir -p /tmp/l53 && tar xzf /tmp/b53/logs.tgz -C /tmp/l53 2>/dev/null; grep -h "queue ahead:\|co-run\|ERROR" /tmp/l53/*.log | cut -c60-900 > "$O/counters.txt"; grep -v "co-run of kernels" "$O/counters.txt"; grep "co-run of kernels" "$O/counters.txt" | head -30
grep -A40 "^Co-run" "$O/corun.txt" | head -40

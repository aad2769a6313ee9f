#!/usr/bin/env bash
# Session 13, call 11: do the device's streams share the GPU's hardware queues? CUDA maps streams onto
# CUDA_DEVICE_MAX_CONNECTIONS hardware queues (default 8); 8 clients' launch streams, their queued-ahead kernels,
# the control, cut and copy streams are more than 8, and a kernel waiting in a shared queue holds up the others.
# The overhead experiment (final build) with the default and with 32 connections, in turn, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info
for i in 1 2 3 4; do
n=default; unset CUDA_DEVICE_MAX_CONNECTIONS
[ $((i % 2)) -eq 0 ] && { n=connections-32; export CUDA_DEVICE_MAX_CONNECTIONS=32; }
OUT=/tmp/b76-$i BIN=carry/daemon timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "^(added|gpumuxd|native)" "$O/ov-$i-$n.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b76-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
grep -h "ran 20100 kernels\|ran 10100 kernels\|ran 5100 kernels\|ran 2600 kernels" "$f" | sed 's/.*(bench-\(.\)-0) ran \([0-9]*\) kernels.*goes"): /\1 \2 /' | awk '{print $2, $0}' | sort -u -k1,1n | sed 's/; finish.*//' | cut -c1-130
done

#!/usr/bin/env bash
# Session 11, call 10: the co-run chooser with a warm-up and two windows of each placement per probe:
# the co-run (default chosen per pair, always co-located) with the chooser's probes logged.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
RUST_LOG=info,gpumux_cuda::client::device::corun=debug OUT=/tmp/b42 BIN=carry/daemon timeout 400 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain,ppq-even-drain+co-locate > "$O/corun.txt" 2>&1
echo "corun rc $?"
mkdir -p /tmp/l42 && tar xzf /tmp/b42/logs.tgz -C /tmp/l42 2>/dev/null; grep -h "queue ahead:\|co-run\|ERROR" /tmp/l42/*.log | cut -c60-300
grep -A40 "^Co-run" "$O/corun.txt" | head -40

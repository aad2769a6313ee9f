#!/usr/bin/env bash
# Session 12, call 3: where the urgent kernel's time goes with headroom: 100 and 1000 µs blocks, the default and
# +headroom=2, the core's stage log (debug) and the device's headroom counts.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
RUST_LOG=info,gpumuxd::core=debug OUT=/tmp/b55 BIN=carry/daemon timeout 300 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies ppq-even-drain+headroom=2 --block-us 100,1000 > "$O/priority.txt" 2>&1
echo "priority rc $?"
grep -A12 "^setting" "$O/priority.txt"
mkdir -p /tmp/l55 && tar xzf /tmp/b55/logs.tgz -C /tmp/l55 2>/dev/null; ls /tmp/l55
for f in /tmp/l55/*.log; do echo "== $f"; grep -h "ran [0-9]* kernels\|headroom of\|queue ahead:" "$f" | sed 's/.*INFO gpumuxd::core: //; s/.*INFO gpumux_cuda[a-z_:]*: //' | cut -c1-500; done | tee "$O/stages.txt"

#!/usr/bin/env bash
# Session 13, call 3: the device process reports on its own (no Poll round trip; f4b6a57) against the build
# before (15eaa09): the daemon check on the new build, then priority (default only) and overhead, base and new in
# turn, twice, with the load clocks (gpumuxd::load=debug) and each client's stage log.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=carry/base; n=base; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=reports; }
OUT=/tmp/b69-$i BIN=$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" > "$O/run-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "blocks: gpumux|^(added|gpumuxd)" "$O/run-$i-$n.txt"
mkdir -p /tmp/l$i; tar xzf /tmp/b69-$i/logs.tgz -C /tmp/l$i 2>/dev/null
grep -h "gpumuxd::load\|INFO.*busy .* of\|ran [0-9]* kernels" /tmp/l$i/gpumux_ppq-even-drain.log | cut -c28-600 > "$O/load-$i-$n.txt"
done

#!/usr/bin/env bash
# Session 13, call 4: why the launch rate does not grow with clients (the stage log's `run`: 9 / 17 / 31 / 78 µs
# for 1 / 2 / 4 / 8 clients in runs 103-105). The overhead experiment (lockstep, load clocks at gpumuxd::load=debug)
# under the default and under variants: SMs of their own, no queue ahead, always co-located, fcfs; and the device
# in the daemon's process.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
i=0
for p in ppq-even-drain ppq-even-drain+own-sms ppq-even-drain+no-ahead ppq-even-drain+co-locate fcfs ppq-even-drain+own-sms+no-ahead; do
i=$((i+1))
OUT=/tmp/b70-$i BIN=carry/daemon timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead --policy "$p" > "$O/ov-$i.txt" 2>&1
echo "== $i $p rc $?"
grep -E "^(added|gpumuxd)" "$O/ov-$i.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b70-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=$(ls /tmp/l$i/*.log | grep -v "in-process\|simulated\|sockets" | head -1)
grep -h "gpumuxd::load\|INFO.*busy .* of\|ran [0-9]* kernels\|queue ahead\|launch commands" "$f" | cut -c28-600 > "$O/load-$i.txt"
grep -h "ran 20100 kernels\|ran 10100 kernels\|ran 5100 kernels\|ran 2600 kernels" "$f" | sed 's/.*(bench-\(.\)-0) ran \([0-9]*\) kernels.*goes"): /\1 \2 /' | awk '{print $2, $0}' | sort -u -k1,1n | cut -c1-150
done

#!/usr/bin/env bash
# Session 13, call 7: reports with a look at the device after each command (ends reported as they come, not after
# every queued command), against lockstep, the overhead experiment in turn, twice, with the load clocks.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumuxd::load=debug
for i in 1 2 3 4; do
b=carry/daemon; n=lockstep; [ $((i % 2)) -eq 0 ] && { b=carry/reports2; n=reports; }
OUT=/tmp/b73-$i BIN=$b timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "^(added|gpumuxd)" "$O/ov-$i-$n.txt" | grep -v "2 ms"
mkdir -p /tmp/l$i; tar xzf /tmp/b73-$i/logs.tgz -C /tmp/l$i 2>/dev/null
f=/tmp/l$i/gpumux_ppq-even-drain.log
grep -h "gpumuxd::load\|INFO.*busy .* of\|ran [0-9]* kernels\|launch commands" "$f" | cut -c28-600 > "$O/load-$i-$n.txt"
grep -h "gpumuxd::load" "$f" | cut -c28-260 | tail -8
grep -h "ran 20100 kernels\|ran 10100 kernels\|ran 5100 kernels\|ran 2600 kernels" "$f" | sed 's/.*(bench-\(.\)-0) ran \([0-9]*\) kernels.*goes"): /\1 \2 /' | awk '{print $2, $0}' | sort -u -k1,1n | sed 's/; finish.*//' 
done

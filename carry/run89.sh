#!/usr/bin/env bash
# Session 14, call 11: the co-run experiment under the default policy, the one-turn build
# (carry/daemon) and the build before (carry/prev) in turn: retreats between equal clients now
# free SMs in the same turn too.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2; do
b=daemon; [ $i -eq 2 ] && b=prev
OUT=/tmp/c89-$i BIN=carry/$b timeout 290 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain > "$O/corun-$i-$b.txt" 2>&1
echo "== corun $i $b rc $?"
sed -n '/Co-run/,$p' "$O/corun-$i-$b.txt" | grep -v "^\[" | head -40
done

#!/usr/bin/env bash
# Session 19, call 4: the overhead experiment with main's build (prev) and this build's native ends
# by a stream write (default) and by event query (GPUMUX_NATIVE_END=event), in turn; then the
# priority experiment once with this build's default beside `+no-hw-priority`.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
i=0
for v in prev write event event write prev; do
  i=$((i+1))
  b=daemon; [ $v = prev ] && b=prev
  GPUMUX_NATIVE_END=$v OUT=/tmp/o143-$i BIN=carry/$b timeout 60 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead-$i-$v.txt" 2>&1
  echo "== overhead $i $v rc $?"; grep -E "^(native|gpumuxd|added)" "$O/overhead-$i-$v.txt" | head -12 | tr -s ' ' | paste -sd';' | cut -c1-400
done
OUT=/tmp/p143 BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only priority \
  --priority-policies ppq-even-drain+no-hw-priority > "$O/p.txt" 2>&1
echo "== priority rc $?"
sed -n '/Cross-process priority/,$p' "$O/p.txt" | grep -v "^\[" | grep -E "gpumux|MPS|streams|setting" | head -20

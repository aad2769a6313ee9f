#!/usr/bin/env bash
# Session 19, call 3: each co-run kernel alone through the daemon ran 2-6% slower with native
# ends published by a stream write (run 141) than in run 177 (ends by event query): about 3.5 µs
# a kernel. Which part: the co-run experiment (its solo rows) with main's build (prev) and this
# build with GPUMUX_NATIVE_END = write (default), write-relaxed (no memory barrier), event; once (a second call if they differ).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
i=0
for round in 1; do
for v in prev write write-relaxed event; do
  i=$((i+1))
  b=daemon; [ $v = prev ] && b=prev
  GPUMUX_NATIVE_END=$v OUT=/tmp/c142-$i BIN=carry/$b timeout 100 bash scripts/bench-daemon-gpu.sh --only corun \
    --corun-policies ppq-even-drain > "$O/corun-$i-$v.txt" 2>&1
  echo "== $i $v rc $? $(grep -E '^(fma|histogram|sgemm|triad): gpumux' "$O/corun-$i-$v.txt" | awk '{print $1, $(NF-1)}' | paste -sd' ') | $(grep -E 'gpumux ppq' "$O/corun-$i-$v.txt" | grep -E '^(triad|sgemm)' | awk '{print $1, $(NF-2)}' | paste -sd' ')"
done
done

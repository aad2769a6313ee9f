#!/usr/bin/env bash
# An A/B of two daemon builds on the GPU machine: `gpumux bench daemon` (by default
# `--only overhead`) with each build in turn, A B B A A B ..., then a summary per figure:
# each build's values, mean, median, and in how many pairs B did better (scripts/ab/summarize.py).
# Single runs of one instance vary by +-20% (docs/benchmarks.md), so a change is worth keeping
# when it wins most pairs, not when one mean is higher.
#
#   OUT=/tmp/ab PAIRS=5 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/daemon [bench args...]
#
# A and B are directories as scripts/daemon-gpu-prep.sh makes them (gpumux and gpumuxd in
# each); the bench arguments replace `--only overhead`. Each run's report and daemon logs are
# kept in $OUT/NN-BUILD/. Exit status: 0, or 2 for bad usage.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ $# -lt 2 ] || [ ! -x "$1/gpumux" ] || [ ! -x "$2/gpumux" ]; then
    echo "usage: ab-daemon-gpu.sh A_DIR B_DIR [bench args...] (each with gpumux and gpumuxd)" >&2
    exit 2
fi
a=$1 b=$2; shift 2
[ $# -gt 0 ] || set -- --only overhead
OUT=${OUT:-/tmp/ab-daemon}; PAIRS=${PAIRS:-4}
mkdir -p "$OUT"
order=()
for ((p = 0; p < PAIRS; p++)); do
    if ((p % 2 == 0)); then order+=("$a" "$b"); else order+=("$b" "$a"); fi
done
dirs=()
i=0
for bin in "${order[@]}"; do
    i=$((i + 1))
    d=$(printf "%s/%02d-%s" "$OUT" "$i" "$(basename "$bin")")
    mkdir -p "$d"
    basename "$bin" > "$d/build"
    OUT=$d BIN=$bin timeout 600 bash scripts/bench-daemon-gpu.sh "$@" > "$d/run.txt" 2>&1
    echo "run $i, $(basename "$bin"): exit $?"
    dirs+=("$d")
done
python3 scripts/ab/summarize.py "${dirs[@]}" | tee "$OUT/summary.txt"

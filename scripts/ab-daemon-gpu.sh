#!/usr/bin/env bash
# An A/B of two daemon builds on the GPU machine: `gpumux bench daemon` (by default
# `--only overhead`) with each build in turn, A B B A A B ..., then a summary per figure:
# each build's values, mean, median, and in how many pairs B did better (scripts/ab-summarize.py).
# Single runs on one instance vary by +-20% (docs/benchmarks.md, "Reading the figures"), so a
# change is worth keeping when it wins most pairs, not when one mean is higher.
#
#   scripts/ab-daemon-gpu.sh A_DIR B_DIR [bench args...]
#
# A_DIR, B_DIR: builds as scripts/device-build.sh makes them, e.g. target/device/base
# (`device-build.sh --rev main target/device/base`) and target/device/main; carry both.
# The bench args replace `--only overhead` (e.g. `--only priority --priority-policies ""`).
# OUT (default /tmp, or the device tool's $OUT): each run's report and daemon logs go to
# $OUT/ab/NN-BUILD/, the summary to $OUT/ab/summary.txt. PAIRS (default 4).
# Exit status: 0, or 2 for bad usage.
set -uo pipefail
if [ $# -lt 2 ] || [ ! -x "$1/gpumux" ] || [ ! -x "$2/gpumux" ]; then
    echo "usage: ab-daemon-gpu.sh A_DIR B_DIR [bench args...] (each with gpumux and gpumuxd)" >&2
    exit 2
fi
a=$(realpath "$1") b=$(realpath "$2"); shift 2
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- --only overhead
ab=${OUT:-/tmp}/ab; PAIRS=${PAIRS:-4}
mkdir -p "$ab"
order=()
for ((p = 0; p < PAIRS; p++)); do
    if ((p % 2 == 0)); then order+=("$a" "$b"); else order+=("$b" "$a"); fi
done
dirs=()
i=0
for bin in "${order[@]}"; do
    i=$((i + 1))
    d=$(printf "%s/%02d-%s" "$ab" "$i" "$(basename "$bin")")
    mkdir -p "$d"
    basename "$bin" > "$d/build"
    timeout 600 bash scripts/bench-daemon-gpu.sh "$bin" "$d" -- "$@" > "$d/run.txt" 2>&1
    echo "run $i, $(basename "$bin"): exit $?"
    dirs+=("$d")
done
python3 scripts/ab-summarize.py "${dirs[@]}" | tee "$ab/summary.txt"

#!/usr/bin/env bash
# How the cost of `gpumux run` grows with the number of processes: N
# processes of one 4-block kernel each (scripts/gen-processes.sh), all
# arriving at 0, on sim:h100, one policy at a time, on one thread. With two
# binaries it also checks that their --json outputs are byte-identical.
#
#   scripts/process-scaling.sh BINARY [BINARY2]
#
# COUNTS (default "100 1000 10000 100000"), POLICIES (default "fcfs dss-cs"),
# LIMIT_S (default 600: a run still going after that is stopped and shown as
# ">LIMIT_S"). Prints one Markdown row per count and policy: wall seconds
# (parse + isolated runs + the shared run) and microseconds per process.
set -uo pipefail

if [ $# -lt 1 ]; then
    echo "usage: process-scaling.sh BINARY [BINARY2]" >&2
    exit 2
fi
bins=("$@")
counts=${COUNTS:-100 1000 10000 100000}
policies=${POLICIES:-fcfs dss-cs}
limit=${LIMIT_S:-600}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

header="| processes | policy |"
rule="|---|---|"
for b in "${bins[@]}"; do
    header+=" $(basename "$b") wall s | µs/process |"
    rule+="---|---|"
done
[ ${#bins[@]} -eq 2 ] && { header+=" same JSON |"; rule+="---|"; }
echo "$header"
echo "$rule"

for n in $counts; do
    "$here/gen-processes.sh" "$n" >"$work/w.toml"
    for p in $policies; do
        row="| $n | $p |"
        for i in "${!bins[@]}"; do
            b=${bins[$i]}
            extra=()
            # A binary with the work limit would refuse nothing here, but say so explicitly.
            "$b" run --help 2>/dev/null | grep -q -- --max-work && extra=(--max-work unlimited)
            start=$(date +%s.%N)
            if timeout "$limit" "$b" run "$work/w.toml" --device sim:h100 --policy "$p" --threads 1 --quiet --json \
                "${extra[@]}" >"$work/out$i.json" 2>"$work/err$i"; then
                end=$(date +%s.%N)
                s=$(echo "$end - $start" | bc -l)
                row+=" $(printf '%.2f' "$s") | $(printf '%.1f' "$(echo "$s * 1000000 / $n" | bc -l)") |"
            else
                rc=$?
                [ $rc -eq 124 ] && row+=" >$limit (stopped) | - |" || row+=" failed ($rc) | - |"
                : >"$work/out$i.json"
            fi
        done
        if [ ${#bins[@]} -eq 2 ]; then
            if [ ! -s "$work/out0.json" ] || [ ! -s "$work/out1.json" ]; then
                row+=" n/a |"
            elif cmp -s "$work/out0.json" "$work/out1.json"; then
                row+=" yes |"
            else
                row+=" **no** |"
            fi
        fi
        echo "$row"
    done
done

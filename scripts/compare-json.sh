#!/usr/bin/env bash
# Compares two gpumux binaries' `run --json` outputs, byte for byte, over the
# README's main job and every examples/*.toml on sim:h100. A change that must
# not alter any scheduling decision (a speed-up, a check) passes only if every
# output is identical.
#
#   scripts/compare-json.sh OLD_BINARY NEW_BINARY [OUTDIR]
#
# OUTDIR (default: a temporary directory) keeps both outputs of every input.
# Exit status: 0 all identical, 1 some differ or a run failed, 2 usage.
set -uo pipefail

if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: compare-json.sh OLD_BINARY NEW_BINARY [OUTDIR] (both executable)" >&2
    exit 2
fi
old=$1
new=$2
out=${3:-$(mktemp -d)}
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)

# name|workload|device
inputs=("main|parboil-k20c:mix=8,seed=1|sim:k20c")
for f in "$root"/examples/*.toml; do
    inputs+=("$(basename "$f" .toml)|$f|sim:h100")
done

status=0
for spec in "${inputs[@]}"; do
    IFS='|' read -r name workload device <<<"$spec"
    for side in old new; do
        bin=$old
        [ "$side" = new ] && bin=$new
        if ! "$bin" run "$workload" --device "$device" --json --quiet >"$out/$name.$side.json" 2>"$out/$name.$side.err"; then
            echo "FAIL    $name: $side binary exited non-zero (see $out/$name.$side.err)"
            status=1
        fi
    done
    if cmp -s "$out/$name.old.json" "$out/$name.new.json"; then
        echo "same    $name ($(wc -c <"$out/$name.new.json") bytes)"
    else
        echo "DIFFER  $name: diff $out/$name.old.json $out/$name.new.json"
        status=1
    fi
done
exit $status

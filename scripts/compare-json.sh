#!/usr/bin/env bash
# Compares two gpumux binaries' outputs, byte for byte: `run --json` of the
# README's main job and of every examples/*.toml on sim:h100, and `rt experiment
# fig7 --sets 2000` (JSON and SVG). With --full, also every `experiment NAME
# --quick` (text report and SVG plots; about 3 minutes per binary on 2 cores).
# A change that must not alter any scheduling decision (a speed-up, a check, a
# restructuring) passes only if every output is identical.
#
#   scripts/compare-json.sh [--full] OLD_BINARY NEW_BINARY [OUTDIR]
#
# OUTDIR (default: a temporary directory) keeps both outputs of every input.
# Exit status: 0 all identical, 1 some differ or a run failed, 2 usage.
set -uo pipefail

full=0
if [ "${1:-}" = --full ]; then
    full=1
    shift
fi
if [ $# -lt 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
    echo "usage: compare-json.sh [--full] OLD_BINARY NEW_BINARY [OUTDIR] (both executable)" >&2
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
# Commands that write a folder of files: every file must match.
# name|arguments (the output folder is appended as --out DIR)
folders=("rt-fig7|rt experiment fig7 --sets 2000 --quiet")
if [ $full = 1 ]; then
    for name in $("$new" experiment list | awk '{print $1}'); do
        folders+=("experiment-$name|experiment $name --quick --quiet")
    done
fi
for spec in "${folders[@]}"; do
    IFS='|' read -r name args <<<"$spec"
    for side in old new; do
        bin=$old
        [ "$side" = new ] && bin=$new
        rm -rf "$out/$name.$side"
        # shellcheck disable=SC2086 # args is a word list on purpose
        if ! "$bin" $args --out "$out/$name.$side" >"$out/$name.$side.stdout" 2>"$out/$name.$side.err"; then
            echo "FAIL    $name: $side binary exited non-zero (see $out/$name.$side.err)"
            status=1
        fi
    done
    # Wall-clock figures differ run to run: drop them (and the output path) before comparing.
    for side in old new; do
        rm -rf "$out/$name.$side.cmp"
        cp -r "$out/$name.$side" "$out/$name.$side.cmp"
        # An experiment's header gives its wall time: "== NAME --quick (seed 1, 68.5 s) ==".
        wall='s/^(== .*\(seed [0-9]+), [0-9.]+ s\) ==$/\1, WALL s) ==/'
        find "$out/$name.$side.cmp" -type f -exec sed -i -E -e '/"(seconds|sets_per_second|wall_s|elapsed_s)":/d' -e "$wall" {} +
        sed -E -e '/^time: /d' -e "$wall" -e "s#$out/$name.$side#OUT#g" "$out/$name.$side.stdout" >"$out/$name.$side.cmp/stdout"
    done
    if diff -r -q "$out/$name.old.cmp" "$out/$name.new.cmp" >/dev/null; then
        echo "same    $name ($(find "$out/$name.new" -type f | wc -l) files and stdout, timings left out)"
    else
        echo "DIFFER  $name: diff -r $out/$name.old.cmp $out/$name.new.cmp"
        status=1
    fi
done
exit $status

#!/usr/bin/env bash
# Runs prebuilt gpumux-cuda GPU test binaries on a machine with a GPU (they skip elsewhere).
#
#   scripts/cuda-device-tests.sh [--repeat N] [TEST_BINARY...] [-- test args...]
#
# TEST_BINARY: default client_gpu, engine_gpu and gpu in target/device/main/tests (`scripts/device-build.sh
# --tests` puts them there). Test args go to each binary, e.g.
# `-- --exact NAME` for one test. --repeat N runs each binary N times, each in a fresh process,
# and counts the failures (a flaky test: `--repeat 10 target/device/main/tests/client_gpu --
# --exact NAME`; CUDA_MODULE_LOADING=EAGER and the like pass through the environment).
# Prints each run's test lines and panics; OUTDIR $OUT/tests (else /tmp/tests) keeps every
# run's whole output. Exit status: 0 if every run passed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
repeat=1
[ "${1:-}" = --repeat ] && { repeat=$2; shift 2; }
bins=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do bins+=("$(realpath -m "$1")"); shift; done
[ "${1:-}" = -- ] && shift
# Not launch_limits: a gpumuxd test that daemon-gpu-check.sh runs against its daemon.
[ ${#bins[@]} -gt 0 ] || for t in client_gpu engine_gpu gpu; do bins+=("$root/target/device/main/tests/$t"); done
out=${OUT:-/tmp}/tests; mkdir -p "$out"
# NVRTC: the CUDA toolkit's, or the pip wheel's (nvidia-cuda-nvrtc).
source "$root/scripts/nvrtc-path.sh"
status=0
for t in "${bins[@]}"; do
    [ -x "$t" ] || { echo "=== $t: not an executable"; status=1; continue; }
    fails=0
    for i in $(seq 1 "$repeat"); do
        log="$out/$(basename "$t")-$i.txt"
        echo "=== $t $* (run $i of $repeat)"
        timeout 600 "$t" --nocapture --test-threads 1 "$@" >"$log" 2>&1
        rc=$?
        grep -E "^test |SKIPPED|test result" "$log" | grep -v "^test .* ok$" | cut -c1-200
        grep -A3 "panicked" "$log" | cut -c1-600
        [ $rc -ne 0 ] && { fails=$((fails + 1)); status=1; }
    done
    echo "=== $(basename "$t"): $fails of $repeat runs failed"
done
echo "=== status $status"
exit $status

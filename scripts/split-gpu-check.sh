#!/usr/bin/env bash
# One launch split over several GPUs (gpumux_cuda::split, issue 38) on a machine with 2 or more
# NVIDIA GPUs, building nothing:
#
#   scripts/split-gpu-check.sh [BIN_DIR] [OUTDIR]
#
# BIN_DIR: what scripts/device-build.sh makes (default target/device/main; $BIN also works): its
#          gpumux-cuda-check, and tests/split_gpu if it was built with --tests.
# OUTDIR:  logs and JSON (default $OUT/split-check, else /tmp/split-check).
# SPLIT_ARGS: more flags for `gpumux-cuda-check split` (e.g. "--gpus 2 --reps 9 --fma-iters 80000").
#
# 1. `gpumux-cuda-check split`: a compute-bound FMA loop and nbody, and the memory-bound triad and
#    reduce_partial, each split over 2 GPUs (and 4 where there are 4) with the shadow-buffer merge
#    and with declared slices (the declaration checked on the GPU first), inputs replicated in every
#    run and (memory-bound) already on every GPU; every output compared byte for byte with the
#    native kernel on GPU 0; end-to-end and kernel-only times against it (medians); histogram,
#    reduce_final and bfs_step refused with their reasons; the goals table with the anchors.
# 2. tests/split_gpu (if present): eight suite kernels split and compared bytewise, refusals, and a
#    wrong write-set declaration caught.
# Exit status: non-zero if a bitwise comparison failed, a kernel was not refused, or a step failed
# (a goal not met is printed, not a failure). Uses peer copies only: no NVLink multicast.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-${BIN:-$root/target/device/main}}")
OUTDIR=$(realpath -m "${2:-${OUT:-/tmp}/split-check}")
mkdir -p "$OUTDIR"
[ -x "$BIN/gpumux-cuda-check" ] || { echo "split-gpu-check: no gpumux-cuda-check in $BIN (scripts/device-build.sh makes it)" >&2; exit 2; }
# NVRTC: the CUDA toolkit's, or the pip wheel's (nvidia-cuda-nvrtc).
source "$root/scripts/nvrtc-path.sh"

nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUTDIR/gpus.txt"
nvidia-smi topo -m > "$OUTDIR/topo.txt" 2>&1 && cat "$OUTDIR/topo.txt"
[ -f "$BIN/commit" ] && echo "binaries of commit $(cat "$BIN/commit")"
status=0 summary=()
echo "=== split: $BIN/gpumux-cuda-check --json $OUTDIR/split.json split ${SPLIT_ARGS:-}"
# shellcheck disable=SC2086
"$BIN/gpumux-cuda-check" --json "$OUTDIR/split.json" split ${SPLIT_ARGS:-} 2>&1 | tee "$OUTDIR/split.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then summary+=("split check: PASS (every split bitwise equal; refusals refused)")
else summary+=("split check: FAIL (exit $rc)"); status=1; fi
if [ -x "$BIN/tests/split_gpu" ]; then
    echo "=== tests/split_gpu"
    "$BIN/tests/split_gpu" --test-threads=1 --nocapture 2>&1 | tee "$OUTDIR/split_gpu.log"
    rc=${PIPESTATUS[0]}
    if grep -q SKIPPED "$OUTDIR/split_gpu.log"; then summary+=("split_gpu tests: SKIPPED (see the log)"); status=1
    elif [ "$rc" -eq 0 ]; then summary+=("split_gpu tests: PASS")
    else summary+=("split_gpu tests: FAIL (exit $rc)"); status=1; fi
else
    summary+=("split_gpu tests: not run (no $BIN/tests/split_gpu: scripts/device-build.sh --tests builds it)")
fi
echo "=== summary"
printf '%s\n' "${summary[@]}" | tee "$OUTDIR/summary.txt"
exit $status

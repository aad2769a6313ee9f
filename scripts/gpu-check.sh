#!/usr/bin/env bash
# Checks gpumux's CUDA backend on a machine with an NVIDIA GPU, building nothing:
# correctness of every suite kernel under random preemption first, then the
# benchmarks (solo overhead, preemption latency, spatial sharing).
#
#   scripts/gpu-check.sh [BINARY] [OUTDIR]
#
# BINARY: a prebuilt `gpumux-cuda-check` (default: $GPUMUX_CUDA_CHECK, else
#         target/device/main/gpumux-cuda-check as scripts/device-build.sh makes it, else
#         target/release/gpumux-cuda-check from
#         `cargo build --release -p gpumux-cuda-bench --bin gpumux-cuda-check`).
# OUTDIR: where JSON results and logs go (default: $OUT/gpu-check, else /tmp/gpu-check).
# GPUMUX_PHASES: which phases to run (default "check overhead preempt mps spatial").
#   spatial: triad + sgemm alone, one after the other, together (hardware), on disjoint SM
#            sets (gpumux workers, green contexts), and as two MPS client processes with
#            CUDA_MPS_ACTIVE_THREAD_PERCENTAGE per process; this script starts MPS in a
#            private pipe directory for it (the bench itself stays a non-MPS process and
#            hands the directory to its two children) and stops it again.
#   spatial-mps (not in the default): the MPS rows only, with the bench itself an MPS
#            client too (if the MPS rows of `spatial` fail because a non-MPS process holds
#            the GPU).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-${GPUMUX_CUDA_CHECK:-}}
if [ -z "$BIN" ]; then
    BIN=$root/target/release/gpumux-cuda-check
    [ -x "$root/target/device/main/gpumux-cuda-check" ] && BIN=$root/target/device/main/gpumux-cuda-check
fi
OUTDIR=${2:-${OUT:-/tmp}/gpu-check}
PHASES=${GPUMUX_PHASES:-check overhead preempt mps spatial}
mkdir -p "$OUTDIR"

if [ ! -x "$BIN" ]; then
    echo "gpu-check: no executable at $BIN (build it with cargo build --release -p gpumux-cuda-bench --bin gpumux-cuda-check)" >&2
    exit 2
fi

# NVRTC: the CUDA toolkit's, or the pip wheel's (nvidia-cuda-nvrtc).
source "$root/scripts/nvrtc-path.sh"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUTDIR/gpu.txt"
status=0
passed=() failed=() skipped=()
run() { # name, then arguments
    local name=$1; shift
    echo "=== $name: $BIN $*"
    "$BIN" --json "$OUTDIR/$name.json" "$@" 2>&1 | tee "$OUTDIR/$name.log"
    local rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ]; then
        echo "=== $name FAILED (exit $rc)"; status=1; failed+=("$name")
    else
        passed+=("$name")
    fi
    return 0
}
skip() { echo "=== $1: skipped ($2)"; skipped+=("$1: $2"); }

MPS_DIR=/tmp/gpumux-mps
MPS_LOG=/tmp/gpumux-mps-log
# Starts the MPS control daemon in a private pipe directory; changes no device setting
# (compute mode, clocks) and needs no reset. Returns nonzero when it cannot.
mps_start() {
    command -v nvidia-cuda-mps-control >/dev/null || { echo "=== MPS: nvidia-cuda-mps-control not found"; return 1; }
    mkdir -p "$MPS_DIR" "$MPS_LOG"
    CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR CUDA_MPS_LOG_DIRECTORY=$MPS_LOG nvidia-cuda-mps-control -d \
        || { echo "=== MPS: could not start the MPS daemon"; return 1; }
    sleep 1
}
mps_stop() {
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR CUDA_MPS_LOG_DIRECTORY=$MPS_LOG nvidia-cuda-mps-control
    sleep 1
}

for phase in $PHASES; do
    case $phase in
        check) run check check --rounds 2 ;;
        overhead) run overhead overhead ;;
        # 1000 trials: the p99 of 200 is their second-slowest, too noisy to judge a target by.
        preempt) run preempt preempt --block-us 10,20,100 --trials 1000 --modes native-priority,gpumux,gpumux-chunk1,timeslice ;;
        mps)
            # MPS in a private pipe directory; stopped again afterwards. It changes
            # no device setting (compute mode, clocks) and needs no reset.
            if command -v nvidia-cuda-mps-control >/dev/null; then
                export CUDA_MPS_PIPE_DIRECTORY=/tmp/gpumux-mps CUDA_MPS_LOG_DIRECTORY=/tmp/gpumux-mps-log
                mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
                if nvidia-cuda-mps-control -d; then
                    sleep 1
                    run preempt-mps preempt --modes mps
                    echo quit | nvidia-cuda-mps-control
                    sleep 1
                else
                    skip mps "could not start the MPS daemon"
                fi
                unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
            else
                skip mps "nvidia-cuda-mps-control not found"
            fi ;;
        spatial)
            if mps_start; then
                run spatial spatial --mps-pipe-dir "$MPS_DIR"
                mps_stop
            else
                echo "=== spatial: MPS not running; the bench skips its MPS rows"
                run spatial spatial --mps-pipe-dir /nonexistent-gpumux-mps
            fi ;;
        spatial-mps)
            if mps_start; then
                export CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR
                run spatial-mps spatial --modes mps --mps-pipe-dir "$MPS_DIR"
                unset CUDA_MPS_PIPE_DIRECTORY
                mps_stop
            else
                skip spatial-mps "no MPS"
            fi ;;
        *) echo "unknown phase $phase" >&2; status=1; failed+=("$phase (unknown phase)") ;;
    esac
done
# One line that says it all, last, so a log's tail is enough.
join() { local IFS=,; echo "$*"; }
if [ "$status" -ne 0 ]; then
    echo "gpu-check: FAIL: $(join "${failed[@]}") (passed: $(join "${passed[@]}"); skipped: $(join "${skipped[@]}"))"
else
    echo "gpu-check: PASS: $(join "${passed[@]}") (skipped: $(join "${skipped[@]}"))"
fi
exit $status

#!/usr/bin/env bash
# `gpumux calibrate` on a real GPU (issue 42): each kernel of a workload alone on cuda:0
# (alone time, a run on few SMs for the DRAM stretch, single blocks for the spread, a
# retreat for the preemption cost), the copies, the fit for the simulator; then the
# workload under the policies on the GPU, on the simulator as the file describes it, and on
# the simulator with the calibration: ANTT and STP side by side, one table.
# Builds nothing and changes no GPU setting.
#
#   scripts/calibrate-gpu.sh [BINARY] [OUTDIR] [WORKLOAD]
# BINARY:   gpumux (default target/device/main/gpumux, from scripts/device-build.sh)
# OUTDIR:   default $OUT/calibrate, else /tmp/calibrate
# WORKLOAD: default examples/suite-h100.toml
# GPUMUX_POLICIES: default the 8 of `gpumux run` and spatial-even (9)
# GPUMUX_TARGET:   simulator preset fitted for (default sim:h100)
# Writes OUTDIR/calibration.toml, calibration.workload.toml, compare.json, calibrate.txt
# (the tables), calibrate.err (progress, verification lines), gpu.txt, date.txt.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-$root/target/device/main/gpumux}")
OUTDIR=$(realpath -m "${2:-${OUT:-/tmp}/calibrate}")
WORKLOAD=${3:-examples/suite-h100.toml}
POLICIES=${GPUMUX_POLICIES:-fcfs,npq,ppq-excl-cs,ppq-excl-drain,ppq-shared-cs,dss-cs,dss-drain,rr-1000us,spatial-even}
TARGET=${GPUMUX_TARGET:-sim:h100}
cd "$root"
mkdir -p "$OUTDIR"
[ -x "$BIN" ] || { echo "calibrate-gpu: no executable at $BIN" >&2; exit 2; }

# NVRTC for the compiles: the CUDA toolkit's, or the pip wheel's.
source "$root/scripts/nvrtc-path.sh"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUTDIR/gpu.txt"
date -u +%Y-%m-%dT%H:%MZ | tee "$OUTDIR/date.txt"
t0=$(date +%s.%N)
timeout 540 "$BIN" calibrate --device cuda:0 --target "$TARGET" "$WORKLOAD" -o "$OUTDIR/calibration.toml" \
    --compare "$POLICIES" --json "$OUTDIR/compare.json" >"$OUTDIR/calibrate.txt" 2>"$OUTDIR/calibrate.err"
rc=$?
cat "$OUTDIR/calibrate.txt"
grep -v "^gpumux-cuda verify" "$OUTDIR/calibrate.err" | tail -20
echo "=== calibrate: exit $rc, $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s"
bad=$(grep -c "MISMATCH" "$OUTDIR/calibrate.err")
echo "=== verification: $(grep -c '^gpumux-cuda verify.*: OK' "$OUTDIR/calibrate.err") OK lines, $bad MISMATCH"
[ "$bad" -ne 0 ] && rc=1
exit $rc

#!/usr/bin/env bash
# gpumux on a real GPU through the engine (`--device cuda:0`), in one batch:
#   1. every supported suite kernel at small sizes under five policies; each
#      device run checks its outputs (bitwise against a native launch, native
#      against the CPU reference) and prints `gpumux-cuda verify ...` lines;
#   2. examples/suite-h100.toml under the same policies (table + JSON);
#   3. `gpumux bench cuda overhead` (solo overhead of the worker transformation).
# Step `check` first: every suite kernel transformed vs native under random
# retreats/resumes (`gpumux bench cuda check`).
# Builds nothing and changes no GPU setting.
#
#   scripts/cuda-device-run.sh [BINARY] [OUTDIR]
# BINARY: gpumux (default target/device/main/gpumux, from scripts/device-build.sh);
# OUTDIR: default $OUT/cuda-run, else /tmp/cuda-run.
# GPUMUX_STEPS: which steps (default "check small suite overhead").
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-$root/target/device/main/gpumux}")
OUT=$(realpath -m "${2:-${OUT:-/tmp}/cuda-run}")
cd "$root"   # scripts/cuda-small.toml, examples/suite-h100.toml
STEPS=${GPUMUX_STEPS:-check small suite overhead}
POLICIES=${GPUMUX_POLICIES:-fcfs,npq,ppq-excl-cs,dss-cs,rr}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "cuda-device-run: no executable at $BIN" >&2; exit 2; }

# NVRTC: the CUDA toolkit's, or the pip wheel's (nvidia-cuda-nvrtc).
source "$root/scripts/nvrtc-path.sh"

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
date -u +%Y-%m-%dT%H:%MZ | tee "$OUT/date.txt"
status=0
step() { # name, seconds, then the command
    local name=$1 secs=$2; shift 2
    echo "=== $name: $*"
    local t0=$(date +%s.%N)
    timeout "$secs" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err"
    local rc=$?
    local t1=$(date +%s.%N)
    cat "$OUT/$name.txt"
    grep -v "^gpumux-cuda verify" "$OUT/$name.err" | tail -20
    echo "=== $name: exit $rc, $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s"
    [ "$rc" -ne 0 ] && status=1
    return 0
}
for s in $STEPS; do
    case $s in
        check) step check 240 "$BIN" bench cuda check --rounds 2 --json "$OUT/check.json" ;;
        small) step small 240 "$BIN" run scripts/cuda-small.toml --device cuda:0 --policy "$POLICIES" ;;
        suite)
            step suite 240 "$BIN" run examples/suite-h100.toml --device cuda:0 --policy "$POLICIES"
            step suite-json 240 "$BIN" run examples/suite-h100.toml --device cuda:0 --policy "$POLICIES" --json ;;
        overhead) step overhead 300 "$BIN" bench cuda overhead --json "$OUT/overhead.json" ;;
        *) echo "unknown step $s" >&2; status=1 ;;
    esac
done

echo "=== verification (count, line)"
cat "$OUT"/*.err 2>/dev/null | grep "^gpumux-cuda verify" | sed 's/seed [0-9]*: //' | sort | uniq -c | tee "$OUT/verify.txt"
bad=$(grep -c "MISMATCH" "$OUT/verify.txt")
ok=$(grep -c ": OK" "$OUT/verify.txt")
echo "=== summary: $ok distinct OK verification lines, $bad MISMATCH; exit status $status"
[ "$bad" -ne 0 ] && status=1
exit $status

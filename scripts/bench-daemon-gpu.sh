#!/usr/bin/env bash
# `gpumux bench daemon` on a GPU machine: gpumuxd against MPS, time slicing and two streams of
# one process (priority, co-run, overhead; docs/benchmarks.md says what each measures).
#
#   scripts/bench-daemon-gpu.sh [BIN_DIR [OUTDIR]] [--] [bench args...]
#
# BIN_DIR: what scripts/device-build.sh makes (default target/device/main; $BIN also works).
# OUTDIR:  results (default $OUT/bench-daemon, else /tmp/bench-daemon): bench-daemon.json,
#          bench-daemon.txt (the tables), bench-daemon.err (progress), logs.tgz (the daemons' logs).
# Bench args, e.g. `--only priority --priority-policies ""` (the default configuration only)
# or `--only overhead --rate-clients 1,8`; `gpumux bench daemon --help` lists them.
# RUST_LOG in the environment reaches the daemons (e.g. RUST_LOG=info,gpumuxd::core=debug).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
args=()   # the positional arguments before the bench's (which start with -)
while [ $# -gt 0 ] && [ ${#args[@]} -lt 2 ] && [[ $1 != -* ]]; do args+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
BIN=$(realpath -m "${args[0]:-${BIN:-$root/target/device/main}}")
OUT=$(realpath -m "${args[1]:-${OUT:-/tmp}/bench-daemon}")
[ -x "$BIN/gpumux" ] && [ -x "$BIN/gpumuxd" ] || { echo "bench-daemon-gpu: no gpumux and gpumuxd in $BIN (scripts/device-build.sh)" >&2; exit 2; }
cd "$root"
mkdir -p "$OUT"
# NVRTC for the bench's and the daemon's compiles: the CUDA toolkit's, or the pip wheel's.
source "$root/scripts/nvrtc-path.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
echo "build $(cat "$BIN/commit" 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%MZ)"
logs=$(mktemp -d)
"$BIN/gpumux" bench daemon --logs "$logs" --json "$OUT/bench-daemon.json" "$@" > "$OUT/bench-daemon.txt" 2> "$OUT/bench-daemon.err"
rc=$?
tar czf "$OUT/logs.tgz" -C "$logs" . 2>/dev/null
tail -n 30 "$OUT/bench-daemon.err"
cat "$OUT/bench-daemon.txt"
echo "bench exit $rc"
exit $rc

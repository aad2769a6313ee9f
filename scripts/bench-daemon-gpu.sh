#!/usr/bin/env bash
# Runs `gpumux bench daemon` on a GPU machine (no Rust there): build here with
#   cargo build --release -p gpumux -p gpumuxd && mkdir -p carry/bench &&
#   cp target/release/{gpumux,gpumuxd} carry/bench/ && strip carry/bench/*
# then run this script there with carry ["carry/bench"]. Extra arguments go to
# the bench. Results: $OUT/bench-daemon.json, $OUT/bench-daemon.txt, daemon
# logs in $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-carry/bench}
OUT=${OUT:-/tmp/bench-daemon-out}
mkdir -p "$OUT"
# NVRTC for the bench's and the daemon's compiles: the CUDA toolkit's, or the pip wheel's.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libnvrtc.so.13" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
wheel=$(python3 -c 'import nvidia, os; print([os.path.join(p, "cu13", "lib") for p in nvidia.__path__][0])' 2>/dev/null || true)
[ -n "$wheel" ] && [ -d "$wheel" ] && export LD_LIBRARY_PATH="$wheel:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
logs=$(mktemp -d)
"$BIN/gpumux" bench daemon --logs "$logs" --json "$OUT/bench-daemon.json" "$@" > "$OUT/bench-daemon.txt" 2> "$OUT/bench-daemon.err"
rc=$?
tar czf "$OUT/logs.tgz" -C "$logs" . "$OUT/bench-daemon.err" 2>/dev/null
tail -n 30 "$OUT/bench-daemon.err"
cat "$OUT/bench-daemon.txt"
echo "bench exit $rc"
exit $rc

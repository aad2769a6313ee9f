#!/usr/bin/env bash
# The Python package on a real GPU (issue 41): the two CuPy-style examples through gpumuxd
# against the same programs on CuPy, and the Python client's launch + sync against the Rust
# client's.
#
#   scripts/python-gpu-check.sh [BIN_DIR] [OUTDIR]
#
# BIN_DIR: what `scripts/device-build.sh --python` makes (default target/device/main): gpumuxd,
# launch_bench and wheel/gpumux-*.whl. OUTDIR: outputs (default $OUT/python-check, else
# /tmp/python-check). Needs a GPU and python3 with NumPy and CuPy (the machine's: the wheel is
# unpacked onto PYTHONPATH beside them). Checks:
#   1. examples/python/saxpy.py and matmul.py through gpumuxd (cuda:0) and natively on CuPy
#      (--cupy: the same program, its import changed): outputs equal bit for bit, and both
#      within tolerance of NumPy; their times per launch side by side;
#   2. crates/gpumux-py/bench/launch_sync.py: p50 of launch + sync of an empty kernel, Python
#      against Rust, in turns (goal: Python at most 3 µs above);
#   3. the pytest suite on sim:h100 with this wheel, if pytest is there.
# Prints PASS/FAIL per check and a summary last; exits non-zero if any failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-${BIN:-$root/target/device/main}}")
OUT=$(realpath -m "${2:-${OUT:-/tmp}/python-check}")
cd "$root"
wheel=$(ls "$BIN"/wheel/gpumux-*.whl 2>/dev/null | head -1)
[ -n "$wheel" ] || { echo "python-gpu-check: no wheel in $BIN/wheel (scripts/device-build.sh --python makes it)" >&2; exit 2; }
[ -x "$BIN/gpumuxd" ] || { echo "python-gpu-check: no gpumuxd in $BIN" >&2; exit 2; }
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NVRTC for the daemon's compiles: the CUDA toolkit's, or the pip wheel's (as daemon-gpu-check.sh).
source "$root/scripts/nvrtc-path.sh"
fails=0
results=()
note() { results+=("$1"); echo "$1"; }
pass() { note "PASS $1"; }
fail() { note "FAIL $1"; fails=$((fails + 1)); }

rm -rf "$OUT/venv" "$OUT/site"
# Into a folder on PYTHONPATH, not a venv: the machine's python3 may itself be a venv (the
# device's is /opt/torch/.venv), whose NumPy and CuPy a venv made from it would not see.
# A wheel is a zip of the package, importable once unpacked.
python3 -m zipfile -e "$wheel" "$OUT/site" || { echo "cannot unpack $wheel" >&2; exit 2; }
export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
py=python3
"$py" -c 'import gpumux, cupy, numpy; print("gpumux", gpumux.__file__, "cupy", cupy.__version__, "numpy", numpy.__version__)' | tee "$OUT/versions.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

sock=$OUT/g.sock
rm -f "$sock"
"$BIN/gpumuxd" --device "${DAEMON_DEVICE:-cuda:0}" --socket "$sock" 2>"$OUT/gpumuxd.log" &
daemon_pid=$!
trap 'kill -TERM $daemon_pid 2>/dev/null; wait $daemon_pid 2>/dev/null' EXIT
for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || { echo "gpumuxd did not start:"; tail -20 "$OUT/gpumuxd.log"; exit 1; }
export GPUMUX_SOCKET=$sock

echo "== 1. the examples through gpumuxd and on CuPy"
for prog in saxpy matmul; do
    if ! "$py" "examples/python/$prog.py" --cupy --out "$OUT/$prog-cupy.npy" >"$OUT/$prog-cupy.json" 2>"$OUT/$prog-cupy.err"; then
        fail "$prog on CuPy: $(tail -1 "$OUT/$prog-cupy.err")"; continue
    fi
    if ! "$py" "examples/python/$prog.py" --out "$OUT/$prog-gpumux.npy" >"$OUT/$prog-gpumux.json" 2>"$OUT/$prog-gpumux.err"; then
        fail "$prog through gpumuxd: $(tail -1 "$OUT/$prog-gpumux.err") $(cat "$OUT/$prog-gpumux.json")"; continue
    fi
    if verdict=$("$py" - "$OUT/$prog-cupy" "$OUT/$prog-gpumux" <<'PY'
import json, sys
import numpy as np
native, ours = (np.load(p + ".npy") for p in sys.argv[1:])
tn, to = (json.load(open(p + ".json"))["ms_per_launch"] for p in sys.argv[1:])
same = native.shape == ours.shape and native.tobytes() == ours.tobytes()
diff = float(np.max(np.abs(native.astype(np.float64) - ours))) if native.shape == ours.shape else float("nan")
print(f"{'equal bit for bit' if same else f'DIFFERENT (max abs diff {diff:g})'}; "
      f"ms per launch: CuPy {tn:.4f}, gpumuxd {to:.4f} ({to / tn:.2f}x)")
sys.exit(0 if same else 1)
PY
    ); then pass "$prog: $verdict"; else fail "$prog: $verdict"; fi
done

echo "== 2. launch + sync, Python against Rust"
if [ -x "$BIN/launch_bench" ]; then
    if "$py" crates/gpumux-py/bench/launch_sync.py --socket "$sock" --rust-bench "$BIN/launch_bench" \
        >"$OUT/launch_sync.json" 2>"$OUT/launch_sync.log"; then
        pass "launch + sync: $(cat "$OUT/launch_sync.json")"
    else
        fail "launch + sync: $(cat "$OUT/launch_sync.json") $(tail -3 "$OUT/launch_sync.log")"
    fi
    cat "$OUT/launch_sync.log"
else
    fail "launch + sync: no launch_bench in $BIN"
fi
kill -TERM $daemon_pid 2>/dev/null; wait $daemon_pid 2>/dev/null

echo "== 3. the pytest suite on sim:h100"
if "$py" -c 'import pytest' 2>/dev/null; then
    if GPUMUXD=$BIN/gpumuxd "$py" -m pytest -q -p no:cacheprovider crates/gpumux-py/tests >"$OUT/pytest.log" 2>&1; then
        pass "pytest: $(tail -1 "$OUT/pytest.log")"
    else
        fail "pytest: $(tail -5 "$OUT/pytest.log")"
    fi
else
    note "SKIPPED pytest: not installed on this machine"
fi

echo "== summary"
printf '%s\n' "${results[@]}"
exit $((fails > 0))

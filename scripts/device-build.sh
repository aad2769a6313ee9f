#!/usr/bin/env bash
# Builds here (Rust) what the device scripts run on a GPU machine (no Rust there), stripped,
# into one folder under target/ (ignored by git; the device tool carries it by name):
#
#   scripts/device-build.sh [--rev REV] [--tests] [--symbols] [--perf] [--python] [DEST]
#
# DEST (default target/device/main) gets gpumuxd, gpumux (ps, bench daemon), gpumux-cuda-check,
# libgpumux_client.so, the Rust example clients (vector_add, histogram, fault_check, stream_pipeline,
# event_timing, oversubscribe: scripts/oversubscribe-gpu.sh), copy_bench
# (the client's copy throughput, crates/gpumux-client/examples) and the C
# ones (matmul, stencil; rpath $ORIGIN, kernels read from examples/clients/kernels relative to
# the repository root the scripts run in), and launch_bench (the Rust client's launch + sync).
#   --rev REV   build commit REV (a temporary worktree, its own target dir) instead of the tree:
#               the A side of an A/B (scripts/ab-daemon-gpu.sh target/device/base target/device/main)
#   --tests     also the GPU test binaries of gpumux-cuda (client_gpu, engine_gpu, gpu, split_gpu, swap_gpu) in DEST/tests/
#   --symbols   keep the symbol tables (strip --strip-debug), for a profile that names functions
#   --perf      also this machine's perf and the libraries it needs beyond glibc in DEST/perf/
#               (implies --symbols; scripts/profile-daemon-gpu.sh runs it there)
#   --python    also the Python package's wheel in DEST/wheel (maturin, installed into
#               target/maturin-venv if not on PATH; scripts/python-gpu-check.sh runs it there)
# Then on the device: carry ["DEST"] and run scripts/gpu-check.sh, daemon-gpu-check.sh,
# bench-daemon-gpu.sh, ab-daemon-gpu.sh or cuda-device-tests.sh with DEST's paths.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
rev= tests=0 strip_opt=--strip-all perf=0 python=0
while [ $# -gt 0 ]; do
    case $1 in
        --rev) rev=$2; shift 2 ;;
        --tests) tests=1; shift ;;
        --symbols) strip_opt=--strip-debug; shift ;;
        --perf) perf=1; strip_opt=--strip-debug; shift ;;
        --python) python=1; shift ;;
        -*) echo "usage: device-build.sh [--rev REV] [--tests] [--symbols] [--perf] [--python] [DEST]" >&2; exit 2 ;;
        *) break ;;
    esac
done
dest=$(realpath -m "${1:-$root/target/device/main}")
src=$root
target=${CARGO_TARGET_DIR:-$root/target}
if [ -n "$rev" ]; then
    src=$(mktemp -d)
    git -C "$root" worktree add --detach "$src" "$rev" >/dev/null
    trap 'git -C "$root" worktree remove --force "$src"' EXIT
    target=$root/target/device-build   # not the tree's target: other builds use it
fi
cd "$src"
export CARGO_TARGET_DIR=$target
cargo build --release -p gpumuxd -p gpumux -p gpumux-client -p gpumux-cuda-bench --examples --bins --lib
rm -rf "$dest"; mkdir -p "$dest"
cp "$target/release/"{gpumuxd,gpumux,gpumux-cuda-check,libgpumux_client.so} "$dest/"
# The daemon's launch-limits property test, which daemon-gpu-check.sh runs against cuda:0.
mkdir -p "$dest/tests"
cargo test --release -p gpumuxd --test launch_limits --no-run --message-format=json |
    jq -r 'select(.executable != null and .target.name == "launch_limits") | .executable' | while read -r t; do cp "$t" "$dest/tests/launch_limits"; done
# Issue 40's pitched and asynchronous copies, which daemon-gpu-check.sh's pipeline check runs
# against cuda:0 (younger than revisions an A/B may build).
if [ -e crates/gpumuxd/tests/pitched_async_copies.rs ]; then
    cargo test --release -p gpumuxd --test pitched_async_copies --no-run --message-format=json |
        jq -r 'select(.executable != null and .target.name == "pitched_async_copies") | .executable' |
        while read -r t; do cp "$t" "$dest/tests/pitched_async_copies"; done
fi
# The multi-GPU daemon's CI tests, whose client move multi-gpu-daemon-check.sh runs against cuda:0,1
# (check 5; younger than revisions an A/B may build).
if grep -q GPUMUXD_TEST_MULTI_DEVICE crates/gpumuxd/tests/multi_gpu.rs 2>/dev/null; then
    cargo test --release -p gpumuxd --test multi_gpu --no-run --message-format=json |
        jq -r 'select(.executable != null and .target.name == "multi_gpu") | .executable' |
        while read -r t; do cp "$t" "$dest/tests/multi_gpu"; done
fi
# The daemon's split launch (issue 38), which multi-gpu-daemon-check.sh's MULTI_ONLY=split runs
# against cuda:0,1 (younger than revisions an A/B may build).
if [ -e crates/gpumuxd/tests/split_launch.rs ]; then
    cargo test --release -p gpumuxd --test split_launch --no-run --message-format=json |
        jq -r 'select(.executable != null and .target.name == "split_launch") | .executable' |
        while read -r t; do cp "$t" "$dest/tests/split_launch"; done
fi
for e in vector_add histogram fault_check copy_bench launch_bench stream_pipeline event_timing oversubscribe; do
    # The last five are younger than revisions an A/B may build (--rev).
    case $e in vector_add | histogram | fault_check) ;; *) [ -e "$target/release/examples/$e" ] || continue ;; esac
    cp "$target/release/examples/$e" "$dest/"
done
for c in matmul stencil; do
    cc -O2 -Wall -Wextra -Werror -std=c11 -Icrates/gpumux-client/include \
        -DKERNEL_DIR='"examples/clients/kernels"' "examples/clients/$c.c" -o "$dest/$c" \
        -L"$dest" -lgpumux_client -lm -Wl,-rpath,'$ORIGIN'
done
if [ $tests = 1 ]; then
    mkdir -p "$dest/tests"
    # swap_gpu (the buffer mover, issue 39) is younger than revisions an A/B may build.
    swap=(); [ -e crates/gpumux-cuda/tests/swap_gpu.rs ] && swap=(--test swap_gpu)
    cargo test --release -p gpumux-cuda --test client_gpu --test engine_gpu --test gpu --test split_gpu "${swap[@]}" --no-run --message-format=json |
        jq -r 'select(.executable != null) | .executable' | while read -r t; do
            cp "$t" "$dest/tests/$(basename "$t" | sed 's/-[0-9a-f]*$//')"
        done
fi
if [ $python = 1 ]; then
    maturin=$(command -v maturin || true)
    if [ -z "$maturin" ]; then
        [ -x "$root/target/maturin-venv/bin/maturin" ] ||
            { python3 -m venv "$root/target/maturin-venv" && "$root/target/maturin-venv/bin/pip" install --quiet 'maturin>=1.9.4,<2'; }
        maturin=$root/target/maturin-venv/bin/maturin
    fi
    "$maturin" build --release --quiet -m crates/gpumux-py/Cargo.toml -o "$dest/wheel"
fi
find "$dest" -type f -perm -u+x -exec strip "$strip_opt" {} +
strip "$strip_opt" "$dest/libgpumux_client.so"
if [ $perf = 1 ]; then
    p=$(command -v perf) || { echo "no perf on this machine (apt-get install linux-perf)" >&2; exit 1; }
    mkdir -p "$dest/perf/lib"
    cp "$p" "$dest/perf/perf"
    ldd "$p" | awk '$3 ~ /^\// {print $3}' |
        grep -v -E '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libstdc\+\+|libgcc_s)\.so' |
        while read -r lib; do cp -L "$lib" "$dest/perf/lib/"; done
fi
echo "$(git -C "$src" rev-parse --short HEAD)$( [ -z "$rev" ] && ! git -C "$src" diff --quiet HEAD -- crates examples && echo '+changes')" > "$dest/commit"
du -sh "$dest"; ls "$dest"

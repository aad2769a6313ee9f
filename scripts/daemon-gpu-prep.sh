#!/usr/bin/env bash
# Builds what scripts/daemon-gpu-check.sh runs on a GPU machine (which has no
# Rust) into carry/daemon/: gpumuxd, gpumux (for `ps`), the Rust example
# clients, libgpumux_client.so and the C examples linked against it
# (rpath $ORIGIN; they read their kernels from examples/clients/kernels,
# relative to the repository root the check runs in). Stripped, to fit the
# device tool's carry limit. Then: run `bash scripts/daemon-gpu-check.sh`
# there with carry ["carry/daemon"].
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p gpumuxd -p gpumux -p gpumux-client --examples --bins --lib
dest=carry/daemon
rm -rf "$dest"; mkdir -p "$dest"
cp "$target/release/gpumuxd" "$target/release/gpumux" "$target/release/libgpumux_client.so" "$dest/"
for e in vector_add histogram fault_check; do cp "$target/release/examples/$e" "$dest/"; done
for c in matmul stencil; do
    cc -O2 -Wall -Wextra -Werror -std=c11 -Icrates/gpumux-client/include \
        -DKERNEL_DIR='"examples/clients/kernels"' "examples/clients/$c.c" -o "$dest/$c" \
        -L"$dest" -lgpumux_client -lm -Wl,-rpath,'$ORIGIN'
done
strip "$dest"/*
du -sh "$dest"; ls "$dest"

#!/usr/bin/env bash
# Builds and runs grid_rate.cu on the GPU machine (nvcc there), with the
# driver's default hardware queues and with 32 (the daemon's device process).
set -euo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp}
nvcc -O2 -arch=sm_90 -o "$out/grid_rate" grid_rate.cu
"$out/grid_rate"
CUDA_DEVICE_MAX_CONNECTIONS=32 "$out/grid_rate"
rm -f "$out/grid_rate"

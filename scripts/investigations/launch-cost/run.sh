#!/usr/bin/env bash
# Builds and runs launch_cost.cu on the GPU machine (nvcc there), with the
# driver's default hardware queues and with 32.
set -euo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp}
nvcc -O2 -arch=sm_90 -o "$out/launch_cost" launch_cost.cu
"$out/launch_cost"
CUDA_DEVICE_MAX_CONNECTIONS=32 "$out/launch_cost"

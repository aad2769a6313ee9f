#!/usr/bin/env bash
# Builds and runs urgent_calls on a GPU machine (nvcc there): bash scripts/investigations/urgent-calls/run.sh [TRIALS] (about 15 s)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
nvcc -cubin -arch=sm_90 -O3 -o "$work/kernels.cubin" "$here/kernels.cu"
g++ -O2 -std=c++17 -pthread -o "$work/urgent_calls" "$here/urgent_calls.cpp" -I/usr/local/cuda/include -L/usr/local/cuda/lib64/stubs -lcuda
# As the daemon's device process runs (docs/daemon.md, "Where the device runs").
CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS:-32} "$work/urgent_calls" "$work/kernels.cubin" "${1:-200}"

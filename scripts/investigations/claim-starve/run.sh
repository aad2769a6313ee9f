#!/usr/bin/env bash
# Builds and runs claim_starve.cu and corun_age.cu on the GPU machine (nvcc
# there). Arguments go to claim_starve (its repetitions per op, default 200).
set -euo pipefail
cd "$(dirname "$0")"
out=${OUT:-/tmp}
nvcc -O3 -arch=sm_90 -o "$out/claim_starve" claim_starve.cu
nvcc -O3 -arch=sm_90 -o "$out/corun_age" corun_age.cu
"$out/claim_starve" "$@"
echo
"$out/corun_age"
rm -f "$out/claim_starve" "$out/corun_age"

#!/usr/bin/env bash
# Session 11, call 12: scripts/gpu-check.sh on the final CUDA code (co-run chooser, lazy error words).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1; echo "gpu-check rc $?"
tail -15 "$O/gpu-check.txt"

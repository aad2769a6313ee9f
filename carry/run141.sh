#!/usr/bin/env bash
# Session 19, call 2: the same builds as call 1 (run140.sh). Priority and co-run with the default
# beside `+no-hw-priority`, then scripts/gpu-check.sh (the suite device's native launches now
# publish their end in host memory too).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/p141 BIN=carry/daemon timeout 260 bash scripts/bench-daemon-gpu.sh --only priority,corun \
  --priority-policies ppq-even-drain+no-hw-priority --corun-policies ppq-even-drain > "$O/pc.txt" 2>&1
echo "== priority+corun rc $?"
sed -n '/Cross-process priority/,$p' "$O/pc.txt" | grep -v "^\[" | grep -E "gpumux|MPS|streams|setting|pair" | head -40
cp /tmp/p141/*.json "$O/" 2>/dev/null
timeout 220 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"

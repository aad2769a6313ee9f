#!/usr/bin/env bash
# Session 18, call 4: hardware priority on by default under the PPQ policies (carry/daemon; main's
# build in carry/prev). The daemon check; priority and co-run with the default beside
# `+no-hw-priority`; the overhead with each build in turn; scripts/gpu-check.sh.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/daemon timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/p137 BIN=carry/daemon timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,corun \
  --priority-policies ppq-even-drain+no-hw-priority --corun-policies ppq-even-drain,ppq-even-drain+no-hw-priority > "$O/pc.txt" 2>&1
echo "== priority+corun rc $?"
sed -n '/Cross-process priority/,$p' "$O/pc.txt" | grep -v "^\[" | grep -E "gpumux|MPS|streams|setting|pair" | head -40
i=0
for b in daemon prev daemon prev; do
  i=$((i+1))
  OUT=/tmp/o137-$i BIN=carry/$b timeout 60 bash scripts/bench-daemon-gpu.sh --only overhead > "$O/overhead-$i-$b.txt" 2>&1
  echo "== overhead $i $b rc $?"; grep -E "^(native|gpumuxd|added)" "$O/overhead-$i-$b.txt" | head -12 | tr -s ' ' | paste -sd';' | cut -c1-400
done
timeout 220 bash scripts/gpu-check.sh carry/t/gpumux-cuda-check /tmp/gc > "$O/gpu-check.txt" 2>&1
echo "== gpu-check rc $?"; grep "gpu-check:" "$O/gpu-check.txt"

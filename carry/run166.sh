#!/usr/bin/env bash
# Session 21, call 8 (GPU run 208): run 206's priority A/B again, order turned (core first), to
# see the kept change's effect on the urgent kernels on a second instance.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab-p PAIRS=3 timeout 240 bash scripts/ab/ab-daemon-gpu.sh carry/core carry/main --only priority --priority-policies "" > "$O/ab-priority.txt" 2>&1
grep -v "^run " "$O/ab-priority.txt" | grep -E "blocks|main:|core:|better" | cut -c1-160 | head -60
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-p/*/bench-daemon.txt ab-p/*/logs.tgz 2>/dev/null)

#!/usr/bin/env bash
# Session 21, call 7 (GPU run 207): the co-run experiment (default configuration) with core (a
# kernel follows the one before it past recorded events and syncs) against main, two pairs in turn
# (run 206's co-run A/B named no policy and produced nothing).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/ab-c PAIRS=2 timeout 560 bash scripts/ab/ab-daemon-gpu.sh carry/main carry/core --only corun --corun-policies ppq-even-drain > "$O/ab-corun.txt" 2>&1
grep -v "^run " "$O/ab-corun.txt" | cut -c1-160 | head -40
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-c/*/bench-daemon.txt ab-c/*/logs.tgz 2>/dev/null)

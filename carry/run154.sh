#!/usr/bin/env bash
# Session 20, call 3 (GPU run 193): late commands polled for twice (late), against main before
# the core fix (prev, 65acd51) and main (cond): the overhead, three pairs each in turn; the daemon
# check and the priority experiment once on late; client_gpu after its ended_with helper.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
timeout 200 bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.txt" 2>&1
echo "== client_gpu rc $?"; grep -E "test result|SKIPPED|panicked|FAILED" "$O/tests.txt" | cut -c1-200
OUT=/tmp/check BIN=carry/late timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/ab-a PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/late > "$O/ab-prev-late.txt" 2>&1
grep -v "^run " "$O/ab-prev-late.txt" | grep -E "launches|prev:|late:|better|p50|p99" | cut -c1-160
OUT=/tmp/ab-b PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/cond carry/late > "$O/ab-cond-late.txt" 2>&1
grep -v "^run " "$O/ab-cond-late.txt" | grep -E "launches|cond:|late:|better|p50|p99" | cut -c1-160
for d in /tmp/ab-a/0* /tmp/ab-b/0*; do mkdir -p $d/l; tar xzf $d/logs.tgz -C $d/l 2>/dev/null
  echo "$(basename $(dirname $d))/$(basename $d): $(grep -h 'ran 2100 kernels' $d/l/gpumux_ppq-even-drain.log | sed 's/.*goes"): //')"
done > "$O/stages.txt"
echo "== overhead client's stages"; cat "$O/stages.txt"
RUST_LOG=info,gpumuxd::core=debug OUT=/tmp/p-late BIN=carry/late timeout 150 bash scripts/bench-daemon-gpu.sh --only priority > "$O/priority-late.txt" 2>&1
echo "== priority late rc $?"
grep -E "blocks: (gpumux ppq-even-drain|MPS) " "$O/priority-late.txt" | tr -s ' ' | cut -c1-100
grep -E "blocks: gpumux" "$O/priority-late.txt" | awk '{print $(NF-1)}' | paste -sd' '
cp /tmp/p-late/logs.tgz "$O/logs.tgz"

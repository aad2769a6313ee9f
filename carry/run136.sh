#!/usr/bin/env bash
# Session 18, call 3: hardware priority (`cuda:N,hw-priority`: a launch alone at its priority runs
# as the client's kernel itself, priority between such launches left to the hardware's stream
# priorities). The GPU tests (two new ones for it), then the priority experiment with the
# default and `+hw-priority` beside MPS, time slicing and two streams of one process, twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu carry/t/engine_gpu carry/t/gpu > "$O/tests.txt" 2>&1
grep -E "test result|SKIPPED|panicked|FAILED|hardware_priority|urgent: ended|native launches" "$O/tests.txt" | cut -c1-200
for i in 1 2; do
  OUT=/tmp/p136-$i BIN=carry/daemon timeout 280 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies ppq-even-drain+hw-priority > "$O/priority-$i.txt" 2>&1
  echo "== priority $i rc $?"
  sed -n '/Cross-process priority/,$p' "$O/priority-$i.txt" | grep -v "^\[" | head -60
  tar xzf /tmp/p136-$i/logs.tgz -O --wildcards '*hardware_priority*.log' 2>/dev/null | grep -E "hardware priority|ERROR|WARN" | cut -c1-200 | head -5
done

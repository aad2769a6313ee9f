#!/usr/bin/env bash
# Session 10, call 8: queue ahead with the fix for launches that found no room (run 62's error): own SMs x3, co-located x2.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
bash scripts/cuda-device-tests.sh carry/t/client_gpu > "$O/tests.log" 2>&1; echo "tests rc $?"
grep -E "test result|FAILED|panicked" "$O/tests.log"
for i in 1 2 3 4 5; do
cfg=ppq-even-drain+own-sms+ahead; [ $i -ge 4 ] && cfg=ppq-even-drain+ahead
OUT=/tmp/b29-$i BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies $cfg > "$O/bench-$i.log" 2>&1
rc=$?
mkdir -p /tmp/l29-$i && tar xzf /tmp/b29-$i/logs.tgz -C /tmp/l29-$i 2>/dev/null
echo "bench $i ($cfg) rc $rc: $(grep -h "queue ahead:" /tmp/l29-$i/*.log | cut -c70-400)"
grep -h "ERROR" /tmp/l29-$i/*.log | cut -c1-3000 | tee -a "$O/error.txt"
grep -E "gpumux|MPS" "$O/bench-$i.log" | grep -E "STP|/" | grep -vE "^\[" | head -12
done

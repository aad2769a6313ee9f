#!/usr/bin/env bash
# Session 20, call 6 (GPU run 196): client_gpu with the short-launch test waiting for both ends
# at once (it waited for an end it had been given already: runs 194-195). The test alone fifteen
# times in fresh processes, then the whole binary twice.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libnvrtc.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
wheel=$(python3 -c 'import nvidia, os; print([os.path.join(p, "cu13", "lib") for p in nvidia.__path__][0])' 2>/dev/null || true)
[ -n "$wheel" ] && [ -d "$wheel" ] && export LD_LIBRARY_PATH="$wheel:${LD_LIBRARY_PATH:-}"
T=with_hardware_priority_a_short_launch_beside_another_prioritys_workers_stays_workers_and_alone_runs_natively
fails=0
for i in $(seq 1 15); do
  timeout 60 carry/t/client_gpu --exact "$T" --nocapture --test-threads 1 > "$O/alone-$i.txt" 2>&1
  rc=$?; [ $rc -ne 0 ] && { fails=$((fails + 1)); grep -A1 "panicked" "$O/alone-$i.txt" | tail -1 | cut -c1-700; }
done
echo "== alone: $fails of 15 failed"
for i in 1 2; do
  timeout 120 carry/t/client_gpu --nocapture --test-threads 1 > "$O/all-$i.txt" 2>&1
  echo "== all $i rc $? $(grep 'test result' "$O/all-$i.txt")"
  grep -A1 "panicked" "$O/all-$i.txt" | cut -c1-600
done
(cd "$O" && tar czf alone.tgz alone-*.txt && rm -f alone-*.txt)

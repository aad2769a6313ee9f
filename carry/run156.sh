#!/usr/bin/env bash
# Session 20, call 5 (GPU run 195): the short-launch hardware-priority test alone in a fresh
# process failed 3 of 10 times in run 194 (whole binary 2 of 2 passed): ten times each with the
# driver's default (lazy) module loading and with CUDA_MODULE_LOADING=EAGER, with what was in
# flight when it stopped.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -e "$d/libnvrtc.so.13" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
wheel=$(python3 -c 'import nvidia, os; print([os.path.join(p, "cu13", "lib") for p in nvidia.__path__][0])' 2>/dev/null || true)
[ -n "$wheel" ] && [ -d "$wheel" ] && export LD_LIBRARY_PATH="$wheel:${LD_LIBRARY_PATH:-}"
T=with_hardware_priority_a_short_launch_beside_another_prioritys_workers_stays_workers_and_alone_runs_natively
for mode in default EAGER; do
  fails=0
  for i in $(seq 1 10); do
    if [ $mode = EAGER ]; then export CUDA_MODULE_LOADING=EAGER; else unset CUDA_MODULE_LOADING; fi
    timeout 60 carry/t/client_gpu --exact "$T" --nocapture --test-threads 1 > "$O/$mode-$i.txt" 2>&1
    rc=$?; [ $rc -ne 0 ] && fails=$((fails + 1))
    [ $rc -ne 0 ] && grep -A1 "panicked" "$O/$mode-$i.txt" | tail -1 | cut -c1-700
  done
  echo "== $mode: $fails of 10 failed"
done
unset CUDA_MODULE_LOADING
(cd "$O" && tar czf runs.tgz default-*.txt EAGER-*.txt && rm -f default-*.txt EAGER-*.txt)

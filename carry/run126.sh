#!/usr/bin/env bash
# Session 17, call 8: the GPU machine's CPU topology, then the overhead experiment with the
# whole bench (daemon, device process, clients) kept on the CPUs that share CPU 0's last-level
# cache, in turn with no affinity, three pairs (the final build, carry/daemon, 019ac38): is the
# ±20% spread of the launch rate where the scheduler puts the communicating threads?
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
{ lscpu; echo; for c in /sys/devices/system/cpu/cpu[0-9]*; do echo "$(basename $c): L3 $(cat $c/cache/index3/shared_cpu_list 2>/dev/null) node $(ls -d $c/node* 2>/dev/null | xargs -n1 basename 2>/dev/null)"; done; } > "$O/topology.txt" 2>&1
grep -E "^(Model name|Socket|Core|Thread|NUMA|L3|CPU\(s\))" "$O/topology.txt"; grep "^cpu" "$O/topology.txt" | awk '{print $3}' | sort | uniq -c
llc=$(cat /sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list 2>/dev/null || echo 0-7)
echo "CPU 0's last-level cache: $llc"
i=0
for pin in none llc llc none none llc; do
i=$((i+1))
if [ $pin = llc ]; then run="taskset -c $llc"; else run=""; fi
OUT=/tmp/ov$i BIN=carry/daemon timeout 120 $run bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i $pin rc $?"
grep -E "^(native|added|gpumuxd)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
done > "$O/overhead.txt" 2>&1
grep -E "^== |native, 1 process|1 clients|4 clients|8 clients|^added" "$O/overhead.txt"

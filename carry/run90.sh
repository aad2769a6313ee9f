#!/usr/bin/env bash
# Session 14, call 12: the GPU machine's CPU topology (sockets, NUMA nodes, L3 domains), and the
# overhead experiment with every process of the bench confined to CPU 0's L3 domain against
# unconfined, in turn, twice: does the daemon lose time to cache traffic across domains?
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
lscpu | grep -E "Model name|Socket|Core|Thread|NUMA|L3|MHz" | tee "$O/lscpu.txt"
for c in 0 1 2 3 4 8 15; do echo "cpu$c L3 shared with: $(cat /sys/devices/system/cpu/cpu$c/cache/index3/shared_cpu_list 2>/dev/null) L2: $(cat /sys/devices/system/cpu/cpu$c/cache/index2/shared_cpu_list 2>/dev/null)"; done | tee -a "$O/lscpu.txt"
l3=$(cat /sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list 2>/dev/null)
node0=$(cat /sys/devices/system/node/node0/cpulist 2>/dev/null)
echo "L3 of cpu0: $l3; node0: $node0"
set0=${l3:-0-7}
[ "$set0" = "0-15" ] && set0=0-7
for i in 1 2 3 4; do
n=free; pre=""
[ $((i % 2)) -eq 0 ] && { n="cpus-$set0"; pre="taskset -c $set0"; }
OUT=/tmp/t90-$i BIN=carry/daemon timeout 150 $pre bash scripts/bench-daemon-gpu.sh --only overhead > "$O/ov-$i.txt" 2>&1
echo "== $i $n rc $?"
grep -E "^(added|gpumuxd, [18] )" "$O/ov-$i.txt"
done

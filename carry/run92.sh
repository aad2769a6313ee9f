#!/usr/bin/env bash
# Session 14, call 14: where the urgent kernels' millisecond outliers come from. The priority
# experiment at 20 and 100 µs blocks (default only), four times; from each daemon's log: every
# slow urgent kernel (over 1 ms: before its first launch, or after), slow CUDA device steps, slow
# core turns, and the summed waits; and the host's load meanwhile (vmstat each second).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info
(vmstat 1 200 > "$O/vmstat.txt" 2>&1 &)
for i in 1 2 3 4; do
OUT=/tmp/p92-$i BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only priority --priority-policies "" --block-us 20,100 > "$O/pr-$i.txt" 2>&1
echo "== prio $i rc $? $(date +%T)"
grep -E "^(20|100) µs blocks: gpumux" "$O/pr-$i.txt"
mkdir -p /tmp/lp$i; tar xzf /tmp/p92-$i/logs.tgz -C /tmp/lp$i 2>/dev/null
f=$(ls /tmp/lp$i/gpumux_ppq-even-drain*.log | head -1)
grep -hE "slow urgent kernel|CUDA device: .* took|without reading requests|request\(s\) waited|took the core" "$f" | sed 's/^[^ ]*Z //' > "$O/slow-$i.txt"
echo "slow urgent: $(grep -c 'slow urgent' $O/slow-$i.txt); device steps: $(grep -c 'CUDA device' $O/slow-$i.txt); core turns: $(grep -c 'without reading' $O/slow-$i.txt)"
grep -h "slow urgent" "$O/slow-$i.txt" | head -4 | cut -c1-260
grep -h "CUDA device\|without reading" "$O/slow-$i.txt" | head -4 | cut -c1-220
done
pkill vmstat
awk 'NR>2 {print $13, $14, $15, $16}' "$O/vmstat.txt" | sort | uniq -c | sort -rn | head -5

#!/usr/bin/env bash
# Session 17, call 4: the launch clock split into the launch command's parts (carry/daemon):
# the overhead experiment twice, with the device's launch clock line and the load lines.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2; do
OUT=/tmp/ov$i BIN=carry/daemon timeout 120 bash scripts/bench-daemon-gpu.sh --only overhead > /tmp/ov-$i.txt 2>&1
echo "== overhead $i rc $?"
grep -E "^(native|added|gpumuxd)" /tmp/ov-$i.txt | tr -s ' ' | cut -c1-90
mkdir -p /tmp/lo$i; tar xzf /tmp/ov$i/logs.tgz -C /tmp/lo$i 2>/dev/null
grep -h "launch commands, mean\|queue ahead:\|device process: busy\|core: busy" /tmp/lo$i/*.log | cut -c60-700
done 2>&1 | tee "$O/overhead.txt"

#!/usr/bin/env bash
# Session 10, call 5: the own-SMs co-run that stopped the daemon (runs 58-59), traced.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumux_cuda::client::device=trace
for i in 1 2 3; do
OUT=/tmp/b26-$i BIN=carry/daemon timeout 150 bash scripts/bench-daemon-gpu.sh --only corun --corun-seconds 1 \
  --corun-policies ppq-even-drain+own-sms > "$O/bench-$i.log" 2>&1
echo "bench $i rc $?"
mkdir -p /tmp/l26-$i && tar xzf /tmp/b26-$i/logs.tgz -C /tmp/l26-$i 2>/dev/null
f=$(ls /tmp/l26-$i/*own_SMs*.log | head -1)
grep -E "ERROR" "$f" | cut -c1-700 | head -3 | tee "$O/err-$i.txt"
l=$(grep -oE "launch [0-9]+: result check" "$f" | head -1 | grep -oE "[0-9]+")
if [ -n "$l" ]; then
  op=$(grep -oE "launch $l of [0-9]+" "$f" | head -1 | grep -oE "[0-9]+$")
  echo "launch $l op $op"
  grep -nE "launch $l[ :)]|launch $l\$|of $op:|: $op queued|: $op's queued|behind launch $l " "$f" | cut -c1-400 | head -40 | tee "$O/trace-$i.txt"
  n=$(grep -nE "launch $l of" "$f" | head -1 | cut -d: -f1)
  [ -n "$n" ] && sed -n "$((n-60)),$((n+40))p" "$f" | cut -c1-300 > "$O/around-$i.txt"
  break
fi
done
grep -E "queue ahead:" /tmp/l26-*/*.log | cut -c1-300

#!/usr/bin/env bash
# Session 18, call 2: the co-run experiment under the default policy, the build whose co-run
# chooser also tries leaning splits (the small side a third) of SMs of their own (carry/daemon) and main's (carry/prev),
# in turn: new, prev, new. The daemon logs each probe's choice (corun=debug).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
export RUST_LOG=info,gpumux_cuda::client::device::corun=debug
i=0
for b in daemon prev daemon; do
  i=$((i+1))
  OUT=/tmp/c135-$i BIN=carry/$b timeout 190 bash scripts/bench-daemon-gpu.sh --only corun --corun-policies ppq-even-drain > "$O/corun-$i-$b.txt" 2>&1
  echo "== corun $i $b rc $?"
  sed -n '/Co-run/,/^$/p' "$O/corun-$i-$b.txt" | grep -E "pair|gpumux|MPS" | head -12
  tar xzf /tmp/c135-$i/logs.tgz -O --wildcards '*ppq-even-drain.log' 2>/dev/null | grep -E "co-run" | cut -c1-400 > "$O/corun-$i-$b-log.txt"
  grep -E "co-run placement" "$O/corun-$i-$b-log.txt" | cut -c1-220; echo "leaning choices: $(grep -c 'Leaning' "$O/corun-$i-$b-log.txt")"
done

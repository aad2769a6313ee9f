#!/usr/bin/env bash
# Session 20, call 2 (GPU run 192): polls of the device process that linger for an event
# (linger, 50 µs) against main (cond): the daemon check; the overhead, four pairs in turn; the
# priority experiment with each build, with logs (the urgent kernel's stage log).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/linger timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/ab-a PAIRS=4 bash scripts/ab/ab-daemon-gpu.sh carry/cond carry/linger > "$O/ab-overhead.txt" 2>&1
grep -v "^run " "$O/ab-overhead.txt" | grep -E "launches|cond:|linger:|better|p50|p99" | cut -c1-160
for d in /tmp/ab-a/0*; do mkdir -p $d/l; tar xzf $d/logs.tgz -C $d/l 2>/dev/null
  echo "$(basename $d): $(grep -h 'ran 2100 kernels' $d/l/gpumux_ppq-even-drain.log | sed 's/.*goes"): //')"
  grep -h "lingered" $d/l/gpumux_ppq-even-drain.log | sed 's/.*device process: //' | head -2
done > "$O/stages.txt"
echo "== overhead client's stages"; cat "$O/stages.txt"
for b in linger cond; do
  RUST_LOG=info,gpumuxd::core=debug OUT=/tmp/p-$b BIN=carry/$b timeout 150 bash scripts/bench-daemon-gpu.sh --only priority > "$O/priority-$b.txt" 2>&1
  echo "== priority $b rc $?"
  grep -E "blocks: (gpumux ppq-even-drain|MPS) " "$O/priority-$b.txt" | tr -s ' ' | cut -c1-100
  grep -E "blocks: gpumux" "$O/priority-$b.txt" | awk '{print $(NF-1)}' | paste -sd' '
  mkdir -p "$O/logs-$b"; tar xzf /tmp/p-$b/logs.tgz -C "$O/logs-$b" 2>/dev/null
  grep -h "ran 203 kernels" "$O/logs-$b/gpumux_ppq-even-drain.log" | sed 's/.*goes"): //'
done
(cd "$O" && tar czf logs.tgz logs-linger logs-cond && rm -rf logs-linger logs-cond)
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-a 2>/dev/null)

#!/usr/bin/env bash
# Session 20, call 1 (GPU run 191): the runs owed by session 19. The kept core fix (late commands
# drained only when the device does not ask to be polled again: cond) on the GPU: the daemon
# check; the overhead against main before the fix (prev, 65acd51) and against the fix's first
# version (uncond); the priority experiment twice with the core's debug log (run 184's stall).
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=/tmp/check BIN=carry/cond timeout 150 bash scripts/daemon-gpu-check.sh > "$O/check.txt" 2>&1
echo "== daemon check rc $?"; grep -E "PASS|FAIL" "$O/check.txt" | sort -u | cut -c1-160
OUT=/tmp/ab-a PAIRS=3 bash scripts/ab/ab-daemon-gpu.sh carry/prev carry/cond > "$O/ab-prev-cond.txt" 2>&1
grep -v "^run " "$O/ab-prev-cond.txt" | grep -E "launches|prev:|cond:|better|p50|p99" | cut -c1-160
OUT=/tmp/ab-b PAIRS=2 bash scripts/ab/ab-daemon-gpu.sh carry/uncond carry/cond > "$O/ab-uncond-cond.txt" 2>&1
grep -v "^run " "$O/ab-uncond-cond.txt" | grep -E "launches|uncond:|cond:|better|p50|p99" | cut -c1-160
grep -rh "ran 2100 kernels" /tmp/ab-a/*cond*/ 2>/dev/null | head -3 | sed 's/.*spent their time[^:]*: //' > "$O/stages.txt"
tar xzOf /tmp/ab-a/02-cond/logs.tgz 2>/dev/null | grep -h "ran 2100 kernels" | sed 's/.*goes"): //' | head -2 >> "$O/stages.txt"
echo "== stage log (cond)"; cat "$O/stages.txt"
for i in 1 2; do
  RUST_LOG=info,gpumuxd::core=debug OUT=/tmp/p-$i BIN=carry/cond timeout 150 bash scripts/bench-daemon-gpu.sh --only priority > "$O/priority-$i.txt" 2>&1
  echo "== priority $i rc $?"
  grep -E "blocks: (gpumux ppq-even-drain|MPS) " "$O/priority-$i.txt" | tr -s ' ' | cut -c1-100
  grep -E "blocks: gpumux" "$O/priority-$i.txt" | awk '{print $(NF-1)}' | paste -sd' '
  mkdir -p "$O/logs$i"; tar xzf /tmp/p-$i/logs.tgz -C "$O/logs$i" 2>/dev/null
  grep -rh "took the core [0-9]\{6,\}\|step took [0-9]\{6,\}\|exchange took [0-9]\{6,\}" "$O/logs$i" | grep -v "LoadModule" | head -5
done
(cd "$O" && tar czf logs.tgz logs1 logs2 && rm -rf logs1 logs2)
(cd /tmp && tar czf "$O/ab-logs.tgz" ab-a ab-b 2>/dev/null)

#!/usr/bin/env bash
# Session 11, call 18: the core writing into a ringed client's ring itself (outbox.rs) against the build before
# (6bdce4e), in turn, twice: overhead and priority (default only); then the daemon check on the new build.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
for i in 1 2 3 4; do
b=carry/base; n=base; [ $((i % 2)) -eq 0 ] && { b=carry/daemon; n=outbox; }
OUT=/tmp/b50-$i BIN=$b timeout 200 bash scripts/bench-daemon-gpu.sh --only priority,overhead --priority-policies "" > "$O/run-$i-$n.txt" 2>&1
echo "== $i $n rc $?"
grep -E "blocks: gpumux|^(added|native, 2 ms|gpumuxd, 2 ms|gpumuxd, 1 |gpumuxd, 8)" "$O/run-$i-$n.txt"
done
OUT=/tmp/check BIN=carry/daemon bash scripts/daemon-gpu-check.sh > /tmp/check.log 2>&1; echo "check rc $?"
grep -E "^(PASS|FAIL)|free device memory" /tmp/check.log | sort -u | tee "$O/check.txt"

#!/usr/bin/env bash
# Session 17, call 1: what a clock read and a sched_yield cost on the GPU machine's host
# (scripts/clock-cost), then a CPU profile of main (e09d074) during the 8-client launch rate.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
{ echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource))"
  cc -O2 -o /tmp/clock_cost scripts/clock-cost/clock_cost.c && /tmp/clock_cost; } 2>&1 | tee "$O/clock.txt"
OUT=$O/profile FROM="launch rate, 8 clients" SECONDS_TO_RECORD=0.8 timeout 200 bash scripts/profile-daemon-gpu.sh --only overhead > "$O/profile.txt" 2>&1
echo "== profile rc $?"
grep -E "^(native|added|gpumuxd)" "$O/profile/bench.txt" | tr -s ' ' | cut -c1-90
echo "--- flat"; cut -c1-120 "$O/profile/flat.txt" | head -45

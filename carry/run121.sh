#!/usr/bin/env bash
# Session 17, call 3: a CPU profile of the build with the launcher thread's own sums (carry/daemon,
# symbols kept) during the 4- and 8-client launch rates: where the device process's launch
# command (4-5 µs, run 159) goes.
set -uo pipefail
cd "$(dirname "$0")/.."
O=${OUT:-/tmp/out}; mkdir -p "$O"
OUT=$O/profile SECONDS_TO_RECORD=2.5 timeout 200 bash scripts/profile-daemon-gpu.sh --only overhead > "$O/profile.txt" 2>&1
echo "== profile rc $?"; head -3 "$O/profile.txt"
grep -E "^(native|added|gpumuxd)" "$O/profile/bench.txt" | tr -s ' ' | cut -c1-90
echo "--- device main thread"; cut -c1-130 "$O/profile/device-main.txt" | head -70

#!/usr/bin/env bash
# A CPU profile of the daemon (its core and every thread, and its device process) during one
# part of `gpumux bench daemon`, on the GPU machine, which has no perf of its own.
#
#   FROM="launch rate, 8 clients" SECONDS_TO_RECORD=1 \
#     scripts/profile-daemon-gpu.sh [BIN_DIR] [--] --only overhead [bench args...]
#
# BIN_DIR: made with `scripts/device-build.sh --perf` (symbol tables kept, this machine's perf
# in BIN_DIR/perf; default target/device/main). Recording starts when the bench's progress line
# containing $FROM appears (default: the 4-client launch rate) and lasts $SECONDS_TO_RECORD
# (default 1.5; PERF_ALL=1: every CPU, for threads started after it began) at $FREQ samples a second per thread (default 1000), with call graphs unwound
# from the stack (dwarf; the software cpu-clock event: the GPU machine's kernel has no hardware
# counters). Writes to $OUT/profile (default /tmp/profile): bench.txt (the bench's tables),
# logs.tgz (the daemons' logs), flat.txt (self time per thread name and function), core.txt,
# device.txt, device-main.txt and launcher.txt (time with callees, per function, of the core
# thread, of the device process, of its main thread and of its launcher thread). Prints the heads.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$root/target/device/main
if [ $# -gt 0 ] && [[ $1 != -* ]]; then BIN=$(realpath -m "$1"); shift; fi
[ "${1:-}" = -- ] && shift
cd "$root"
OUT=${OUT:-/tmp}/profile; mkdir -p "$OUT"
FROM=${FROM:-launch rate, 4 clients}
SECONDS_TO_RECORD=${SECONDS_TO_RECORD:-1.5}
FREQ=${FREQ:-1000}
[ -x "$BIN/perf/perf" ] || { echo "no $BIN/perf/perf: build with scripts/device-build.sh --perf" >&2; exit 2; }
P="env LD_LIBRARY_PATH=$BIN/perf/lib $BIN/perf/perf"
if ! $P record -e cpu-clock -o /tmp/perf-probe.data -- true > /tmp/perf-probe.log 2>&1; then
    echo "perf does not run here:"; cat /tmp/perf-probe.log; exit 1
fi
bench=$(mktemp -d)
(bash scripts/bench-daemon-gpu.sh "$BIN" "$bench" -- "$@" > "$OUT/bench.txt" 2>&1) &
runner=$!
found=
for _ in $(seq 1 30000); do
    grep -q -- "$FROM" "$bench/bench-daemon.err" 2>/dev/null && { found=1; break; }
    kill -0 "$runner" 2>/dev/null || break
    sleep 0.01
done
[ -n "$found" ] || { echo "the bench never printed \"$FROM\""; wait "$runner"; tail -5 "$OUT/bench.txt"; exit 1; }
# The bench runs the daemon inside gpumux: the process with a thread named gpumuxd-core.
# A setting may start its daemon just after its progress line: look for up to 3 s.
daemon=
for _ in $(seq 1 300); do
    daemon=$(ps -eLo pid,comm | awk '$2=="gpumuxd-core"{print $1}' | sort -u | tail -1)
    [ -n "$daemon" ] && break
    sleep 0.01
done
[ -n "$daemon" ] || { echo "no daemon running when \"$FROM\" appeared"; wait "$runner"; exit 1; }
device=$(pgrep -P "$daemon" | head -1)
pids=$daemon${device:+,$device}
echo "recording $pids (daemon ${daemon}, device process ${device:-none}) for $SECONDS_TO_RECORD s from \"$FROM\""
# -p follows only the threads alive when recording starts; a launcher thread started later (a
# client's context) is missed: PERF_ALL=1 records every CPU instead, reported by process as before.
scope=(-p "$pids"); [ -n "${PERF_ALL:-}" ] && scope=(-a)
$P record -F "$FREQ" --call-graph dwarf,8192 "${scope[@]}" -o /tmp/profile-daemon.data -- sleep "$SECONDS_TO_RECORD" 2>&1 | tail -1
wait "$runner"; echo "bench exit $?"
cp "$bench/logs.tgz" "$OUT/logs.tgz" 2>/dev/null
report() { $P report -i /tmp/profile-daemon.data --stdio "$@" 2>/dev/null | grep -v '^#' | grep -v '^$'; }
report --no-children --sort comm,symbol -g none | head -80 > "$OUT/flat.txt"
report --children --comm gpumuxd-core --sort symbol -g none | head -150 > "$OUT/core.txt"
[ -n "$device" ] && report --children --pid "$device" --sort symbol -g none | head -150 > "$OUT/device.txt"
# The device process's main thread alone (the launcher thread is `gpumux-launcher`).
[ -n "$device" ] && report --children --pid "$device" --comm gpumuxd --sort symbol -g none | head -200 > "$OUT/device-main.txt"
[ -n "$device" ] && report --children --pid "$device" --comm gpumux-launcher --sort symbol -g none | head -100 > "$OUT/launcher.txt"
echo "--- self time, by thread and function"; cut -c1-140 "$OUT/flat.txt" | head -30
echo "--- the core, with callees"; cut -c1-140 "$OUT/core.txt" | head -40
[ -n "$device" ] && { echo "--- the device process, with callees"; cut -c1-140 "$OUT/device.txt" | head -40; }
exit 0

#!/usr/bin/env bash
# Issue 39's last goal, "with nothing oversubscribed, no measurable cost", as an A/B in one device
# call: the daemon with oversubscription on (the default: address-stable buffers, the restore gates
# and moves looked for per request) against the daemon with it off (`GPUMUX_OVERSUBSCRIBE=off`,
# the same as `gpumuxd --oversubscribe off`: plain cuMemAlloc buffers, nothing ever evicted), the
# same binary, alternating on off, off on, ... (docs/oversubscription.md, "Turning it off").
#
#   scripts/oversubscribe-cost-gpu.sh [BIN_DIR [OUTDIR]]
#
# BIN_DIR: what scripts/device-build.sh makes (gpumuxd, gpumux, the `oversubscribe` example client).
# OUTDIR:  default $OUT/oversubscribe-cost, else /tmp/oversubscribe-cost; each run in OUTDIR/NN-on|off/.
# ROUNDS (default 4): each round runs both arms, so every figure has ROUNDS values per arm (with 2,
# one arm slower in both by chance happens one time in six).
# PARTS (default "bench alloc"), each part for all runs before the next:
#   alloc  a daemon of its own (cuda:0) and one client timing ALLOC_COUNT (default 1000) allocations,
#          each followed by its free, of each of ALLOC_MIB (default 1,256) MiB: p50, p99 and mean per
#          call, from the client (an allocation from 2 MiB on is 4 driver calls on, 1 off);
#   bench  `gpumux bench daemon --only BENCH_ONLY` (default overhead,programs; with --rate-clients 1,8
#          --program-copy-mib 64): launch + sync p50/p99, 2 ms apart, launch rates, the programs.
# LIMIT (default 200): seconds each bench run may take; BENCH_ARGS: more bench arguments (--quick).
# Prints a table last: each figure's values per arm in run order, their means, off / on (the ratio of
# the means: above 1 means off is higher), and whether the arms' ranges overlap (within noise). Drift
# rows: native launch + sync, a pure-CPU loop timed before each bench run, and the device process's
# own pure-CPU steps (an unbind, getting a stream: code that oversubscription does not touch), from
# the daemons' logs beside the launch command's time.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-${BIN:-$root/target/device/main}}")
OUTDIR=$(realpath -m "${2:-${OUT:-/tmp}/oversubscribe-cost}")
ROUNDS=${ROUNDS:-4} PARTS=${PARTS:-bench alloc} LIMIT=${LIMIT:-200}
ALLOC_MIB=${ALLOC_MIB:-1,256} ALLOC_COUNT=${ALLOC_COUNT:-1000} BENCH_ONLY=${BENCH_ONLY:-overhead,programs}
for b in gpumuxd gpumux oversubscribe; do
    [ -x "$BIN/$b" ] || { echo "oversubscribe-cost-gpu: no $b in $BIN (scripts/device-build.sh makes it)" >&2; exit 2; }
done
cd "$root"
mkdir -p "$OUTDIR"
source "$root/scripts/nvrtc-path.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
echo "build $(cat "$BIN/commit" 2>/dev/null || echo unknown), $(date -u +%Y-%m-%dT%H:%MZ), ROUNDS=$ROUNDS, PARTS=$PARTS"
status=0

# alloc DIR MODE: a daemon with oversubscription MODE and the client's allocation timings.
alloc() {
    local dir=$1 mode=$2 sock=$1/g.sock daemon
    rm -f "$sock"
    "$BIN/gpumuxd" --device cuda:0 --socket "$sock" --oversubscribe "$mode" 2>"$dir/alloc-daemon.log" &
    daemon=$!
    for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
    if [ -S "$sock" ]; then
        timeout 120 "$BIN/oversubscribe" --socket "$sock" --alloc-cost "$ALLOC_MIB" --count "$ALLOC_COUNT" \
            >"$dir/alloc.json" 2>"$dir/alloc.err" || { echo "alloc ($mode): failed: $(tail -2 "$dir/alloc.err")"; status=1; }
    else
        echo "alloc ($mode): the daemon did not start: $(tail -3 "$dir/alloc-daemon.log")"; status=1
    fi
    kill -TERM "$daemon" 2>/dev/null
    wait "$daemon" 2>/dev/null
    # Whether the allocations leave the host busy after their process is gone (the driver's
    # deferred frees): the share of all CPUs busy over the next 3 s.
    after_busy > "$dir/after-busy.txt"
}

# after_busy: the share of all CPUs busy (not idle or iowait) over the next 3 s, %, from /proc/stat.
after_busy() {
    local a b
    a=$(awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
    sleep 3
    b=$(awk '/^cpu / {print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat)
    python3 -c "a=[int(x) for x in '$a'.split()]; b=[int(x) for x in '$b'.split()]
busy, idle = b[0]-a[0], b[1]-a[1]
print(round(100 * busy / max(1, busy + idle), 2))"
}

# plain MODE FILE...: whether the daemons' logs say their device made plain cuMemAlloc buffers
# (gpumux-cuda logs it when oversubscription is off), as MODE asks; a mismatch fails the run.
plain() {
    local mode=$1 n
    shift
    n=$(cat "$@" 2>/dev/null | grep -c "every buffer is a cuMemAlloc")
    if { [ "$mode" = off ] && [ "$n" -eq 0 ]; } || { [ "$mode" = on ] && [ "$n" -gt 0 ]; }; then
        echo "  MISMATCH: oversubscription $mode, but $n log line(s) say the device made plain cuMemAlloc buffers"
        status=1
    else
        echo "  $n log line(s) say the device made plain cuMemAlloc buffers (oversubscription $mode)"
    fi
}

# cpu_probe DIR: a fixed pure-CPU loop's time, ms: how fast this host's CPUs ran just then (the
# table's drift row; a VM's neighbours and turbo move every daemon figure together).
cpu_probe() {
    python3 -c "
import time
t = time.perf_counter()
s = 0
for i in range(2_000_000):
    s += i * i
print(round((time.perf_counter() - t) * 1e3, 2))" > "$1/cpu-probe.txt" 2>/dev/null
}

# Each part for all runs before the next part (bench first by default): the alloc part's thousands
# of large allocations and frees never come right before a bench run of either arm.
for part in $PARTS; do
    i=0
    for ((r = 0; r < ROUNDS; r++)); do
        if ((r % 2 == 0)); then order=(on off); else order=(off on); fi
        for mode in "${order[@]}"; do
            i=$((i + 1))
            dir=$(printf "%s/%02d-%s" "$OUTDIR" "$i" "$mode")
            mkdir -p "$dir"
            echo "$mode" > "$dir/build"
            t0=$(date +%s)
            case $part in
                alloc) alloc "$dir" "$mode"; plain "$mode" "$dir/alloc-daemon.log" ;;
                bench)
                    cpu_probe "$dir"
                    GPUMUX_OVERSUBSCRIBE=$mode timeout "$LIMIT" bash scripts/bench-daemon-gpu.sh "$BIN" "$dir" -- \
                        --only "$BENCH_ONLY" --rate-clients 1,8 --program-copy-mib 64 ${BENCH_ARGS:-} >"$dir/run.txt" 2>&1 ||
                        { echo "bench ($mode): exit $? (tail of $dir/run.txt:)"; tail -3 "$dir/run.txt"; status=1; }
                    mkdir -p "$dir/logs" && tar xzf "$dir/logs.tgz" -C "$dir/logs" 2>/dev/null
                    plain "$mode" "$dir"/logs/*.log ;;
                *) echo "no such part: $part (alloc, bench)"; exit 2 ;;
            esac
            echo "run $i, $part, oversubscription $mode: $(($(date +%s) - t0)) s"
        done
    done
done
python3 scripts/oversubscribe-cost-summary.py "$OUTDIR"/[0-9][0-9]-* | tee "$OUTDIR/summary.txt"
exit $status

#!/usr/bin/env bash
# Issue 42's second goal on a GPU: the daemon's four example clients recorded on the GPU
# (`gpumuxd --record`), replayed in the simulator (`gpumux replay`): ANTT and STP within 10 %.
#
#   scripts/replay-gpu.sh [BIN_DIR] [OUT]
#
# BIN_DIR: what scripts/device-build.sh makes (default target/device/main; $BIN also works).
# OUT:     recordings, workloads, tables (default $OUT/replay, else /tmp/replay).
# Per policy (REPLAY_POLICIES, default "ppq-even-drain spatial-even"):
#   1. a daemon on REPLAY_DEVICE (below) recording to OUT/POLICY/alone.jsonl runs the
#      four clients (Rust vector_add and histogram, C matmul and stencil) one after another;
#   2. a fresh daemon recording to OUT/POLICY/shared.jsonl runs them all at once;
#   3. `gpumux replay shared.jsonl --alone alone.jsonl --policy POLICY` simulates the shared run
#      on REPLAY_TARGET (default: sim:h200 or sim:h100 by the GPU's name) with the kernels timed
#      from the alone recording, and prints per client the alone and shared turnarounds recorded
#      and simulated, ANTT and STP of both, and a PASS/FAIL line against the 10 % goal.
# REPLAY_CALIBRATION: a `gpumux calibrate` file whose device section (preemption cost) the
# simulator takes; without it the replay drains and keeps SMs until a launch's end, as gpumux's
# CUDA backend does, and copies run at the speed recorded.
# REPLAY_DEVICE defaults to cuda:0,own-sms: each launch on SMs of its own, as the simulator
# models it (the CUDA device's default co-locates launches of one priority on every SM at a
# share of each, so their warps share each SM's issue slots, which the simulator does not model;
# REPLAY_DEVICE=cuda:0 measures that set-up).
# The probe (once, before the policies; REPLAY_PROBE=0 skips it): a daemon under spatial-even
# recording to OUT/probe/probe.jsonl runs each client other than vector_add, started once the
# probe's first kernels are recorded, beside vector_add clients run one after another in a loop (PROBE_ARGS, default "--size 16777216 --repeat 4000":
# the same --size as VECTOR_ADD_ARGS, so that its alone time is in the alone recordings, and
# launches under the daemon's limit of 4096 queued operations, since vector_add syncs only at its
# end; the loop stops after the client ends), each on half the SMs. Each policy is then replayed
# a second time with `--probe OUT/probe/probe.jsonl`: every kernel's memory intensity and the
# device's saturation ratio κ fitted from how each kernel and the probe slowed each other
# (docs/calibration.md, "Memory intensity beside a probe"), printed as "(probe)" lines in the
# summary (replay-probe.txt / .json). The exit status counts the probe replays (the plain ones
# are printed for comparison). The end of stdout repeats, per policy, the clients' table, the
# fitted intensities and the summary.
# Client sizes (each client's --size and --repeat; sized for tens of ms on an H200, the first
# figures to tune if a client runs only a few ms alone):
#   VECTOR_ADD_ARGS (default "--size 16777216 --repeat 400"), HISTOGRAM_ARGS ("--size 67108864
#   --repeat 100"), MATMUL_ARGS ("--size 1024 --repeat 40"), STENCIL_ARGS ("--size 4096 --repeat 500").
# Exits non-zero if the probe recording or any policy's probe replay failed or missed the goal.
# Needs no Python.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-${BIN:-$root/target/device/main}}")
OUT=$(realpath -m "${2:-${OUT:-/tmp}/replay}")
cd "$root"
for b in gpumuxd gpumux vector_add histogram matmul stencil; do
    [ -x "$BIN/$b" ] || { echo "replay-gpu: no $b in $BIN (scripts/device-build.sh makes it)" >&2; exit 2; }
done
POLICIES=${REPLAY_POLICIES:-ppq-even-drain spatial-even}
DEVICE=${REPLAY_DEVICE:-cuda:0,own-sms}
declare -A ARGS=(
    [vector_add]=${VECTOR_ADD_ARGS:---size 16777216 --repeat 400}
    [histogram]=${HISTOGRAM_ARGS:---size 67108864 --repeat 100}
    [matmul]=${MATMUL_ARGS:---size 1024 --repeat 40}
    [stencil]=${STENCIL_ARGS:---size 4096 --repeat 500}
)
clients=(vector_add histogram matmul stencil)
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[[ $DEVICE == cuda:* ]] && source "$root/scripts/nvrtc-path.sh"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

start_daemon() { # policy socket log record
    rm -f "$2"
    "$BIN/gpumuxd" --device "$DEVICE" --policy "$1" --socket "$2" --record "$4" 2>"$3" &
    daemon_pid=$!
    for _ in $(seq 1 300); do
        [ -S "$2" ] && return 0
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "daemon did not start; its log:"; tail -20 "$3"; return 1
}
stop_daemon() { kill -TERM "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; }
run_client() { # name socket log
    # shellcheck disable=SC2086 # the arguments are words
    timeout 600 "$BIN/$1" --socket "$2" ${ARGS[$1]} >"$3" 2>&1
}

fails=0
results=()
probe_rec=
if [ "${REPLAY_PROBE:-1}" != 0 ]; then
    pdir="$OUT/probe"; mkdir -p "$pdir"; sock="$OUT/probe.sock"; rm -f "$pdir/probe.jsonl"
    echo "== probe: each client beside vector_add (spatial-even, half the SMs each)"
    if start_daemon spatial-even "$sock" "$pdir/daemon.log" "$pdir/probe.jsonl"; then
        ok=1
        for c in histogram matmul stencil; do
            rm -f "$pdir/stop"
            # vector_add after vector_add until the client has ended (each run syncs only at its
            # end, so each stays under the daemon's queued-operations limit).
            (
                i=0
                while [ ! -e "$pdir/stop" ]; do
                    i=$((i + 1))
                    # shellcheck disable=SC2086 # the arguments are words
                    "$BIN/vector_add" --socket "$sock" ${PROBE_ARGS:---size 16777216 --repeat 4000} \
                        >"$pdir/probe-$c.$i.log" 2>&1 || { echo "  probe run $i beside $c failed: $(tail -3 "$pdir/probe-$c.$i.log")"; break; }
                done
                echo "  probe beside $c: $i vector_add runs"
            ) &
            probe_pid=$!
            # The client comes once the probe's kernels run: a probe kernel recorded since (the
            # recorder writes within a millisecond while busy), then PROBE_LEAD more seconds.
            kernels() { grep -c '"type":"kernel","name":"vector_add"' "$pdir/probe.jsonl" 2>/dev/null || true; }
            before=$(kernels)
            for _ in $(seq 1 200); do
                sleep 0.05
                [ "$(kernels)" -gt "${before:-0}" ] && break
            done
            sleep "${PROBE_LEAD:-0}"
            run_client "$c" "$sock" "$pdir/$c.log" || { ok=0; echo "  $c failed beside the probe: $(tail -3 "$pdir/$c.log")"; }
            touch "$pdir/stop"
            wait "$probe_pid"
        done
        stop_daemon
        [ $ok = 1 ] && probe_rec="$pdir/probe.jsonl"
    fi
    [ -n "$probe_rec" ] || { results+=("FAIL probe: the probe recording failed (see $pdir)"); fails=$((fails + 1)); }
fi
for policy in $POLICIES; do
    dir="$OUT/$policy"; mkdir -p "$dir"; sock="$OUT/$policy.sock"
    echo "== $policy: each client alone"
    rm -f "$dir/alone.jsonl" "$dir/shared.jsonl"
    start_daemon "$policy" "$sock" "$dir/daemon-alone.log" "$dir/alone.jsonl" || { results+=("FAIL $policy: daemon start"); fails=$((fails + 1)); continue; }
    ok=1
    for c in "${clients[@]}"; do
        run_client "$c" "$sock" "$dir/$c.alone.log" || { ok=0; echo "  $c failed alone: $(tail -3 "$dir/$c.alone.log")"; }
    done
    stop_daemon
    echo "== $policy: the four at once"
    start_daemon "$policy" "$sock" "$dir/daemon-shared.log" "$dir/shared.jsonl" || { results+=("FAIL $policy: daemon start"); fails=$((fails + 1)); continue; }
    pids=()
    for c in "${clients[@]}"; do run_client "$c" "$sock" "$dir/$c.shared.log" & pids+=($!); done
    for i in "${!clients[@]}"; do
        wait "${pids[$i]}" || { ok=0; echo "  ${clients[$i]} failed shared: $(tail -3 "$dir/${clients[$i]}.shared.log")"; }
    done
    stop_daemon
    [ $ok = 1 ] || { results+=("FAIL $policy: a client failed (see $dir)"); fails=$((fails + 1)); continue; }
    echo "== $policy: replay"
    replay=("$BIN/gpumux" replay "$dir/shared.jsonl" --alone "$dir/alone.jsonl" --policy "$policy"
        -o "$dir/workload.toml" --json "$dir/replay.json")
    [ -n "${REPLAY_TARGET:-}" ] && replay+=(--device "$REPLAY_TARGET")
    [ -n "${REPLAY_CALIBRATION:-}" ] && replay+=(--calibration "$REPLAY_CALIBRATION")
    if "${replay[@]}" >"$dir/replay.txt" 2>"$dir/replay.err"; then
        cat "$dir/replay.txt"
        verdict=$(grep -E '^(PASS|FAIL):' "$dir/replay.txt" | tail -1)
        figures=$(grep -E '^ANTT recorded' "$dir/replay.txt" | tail -1)
        results+=("${verdict%%:*} $policy (m = 0, not counted): $figures")
    else
        cat "$dir/replay.err"
        results+=("FAIL $policy: gpumux replay failed (see $dir/replay.err)"); fails=$((fails + 1))
    fi
    if [ -n "$probe_rec" ]; then
        echo "== $policy: replay with memory intensities fitted beside the probe"
        replay=("$BIN/gpumux" replay "$dir/shared.jsonl" --alone "$dir/alone.jsonl" --policy "$policy"
            --probe "$probe_rec" --json "$dir/replay-probe.json")
        [ -n "${REPLAY_TARGET:-}" ] && replay+=(--device "$REPLAY_TARGET")
        [ -n "${REPLAY_CALIBRATION:-}" ] && replay+=(--calibration "$REPLAY_CALIBRATION")
        if "${replay[@]}" >"$dir/replay-probe.txt" 2>"$dir/replay-probe.err"; then
            cat "$dir/replay-probe.txt"
            verdict=$(grep -E '^(PASS|FAIL):' "$dir/replay-probe.txt" | tail -1)
            figures=$(grep -E '^ANTT recorded' "$dir/replay-probe.txt" | tail -1)
            kappa=$(grep -oE 'κ [0-9.]+ \(as good: [0-9.-]+' "$dir/replay-probe.txt" | head -1)
            results+=("${verdict%%:*} $policy (probe; $kappa): $figures")
            [[ $verdict == PASS* ]] || fails=$((fails + 1))
        else
            cat "$dir/replay-probe.err"
            results+=("FAIL $policy (probe): gpumux replay failed (see $dir/replay-probe.err)"); fails=$((fails + 1))
        fi
    fi
done

echo
echo "== per policy: clients, and the intensities fitted beside the probe (full tables in $OUT/*/replay*.txt)"
for policy in $POLICIES; do
    f="$OUT/$policy/replay-probe.txt"
    [ -f "$f" ] || f="$OUT/$policy/replay.txt"
    [ -f "$f" ] || continue
    echo "-- $policy ($(basename "$f"))"
    sed -n '2,/^ANTT recorded/p' "$f"
    sed -n '/^memory intensity beside the probe/,/^note:/p' "$f" | grep -v '^note:'
    grep -E '^note: probe:' "$f"
done
[ -f "$OUT/probe/probe.jsonl" ] && echo "probe recording: $(grep -c '"kind":"op"' "$OUT/probe/probe.jsonl") operations"
echo
echo "== summary (goal: simulated ANTT and STP within 10 % of the GPU's; tables in $OUT/*/replay.txt)"
printf '%s\n' "${results[@]}" | tee "$OUT/summary.txt"
exit $((fails > 0))

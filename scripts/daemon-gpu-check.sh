#!/usr/bin/env bash
# gpumuxd on a real GPU: correctness of the daemon with clients' own kernels.
#
#   scripts/daemon-gpu-check.sh [BIN_DIR] [OUTDIR]
#
# BIN_DIR: what scripts/device-build.sh makes (default target/device/main; $BIN also works).
# OUTDIR:  logs and outputs (default $OUT/daemon-check, else /tmp/daemon-check).
# DAEMON_CHECKS: which checks (default "clients kill fault limits pipeline"); DAEMON_DEVICE (default cuda:0);
# LCG_ARGS: the pipeline check's example arguments (default the examples' own: 16 chunks of 16 MiB, 2048 steps,
# 7 timed repetitions); PIPELINE_ROUNDS: runs of each side of the pipeline (default 4); LCG_TIMING=old: the
# examples time as fe4d877 did (for an A/B: LCG_TIMING=old PIPELINE_ROUNDS=4 LCG_ARGS="--repeat 5");
# KILL_WARMUP: churning clients killed before the kill test's baseline (default 1).
# Needs a GPU and python3 with CuPy (the native reference). Checks:
#   1. four client programs (Rust vector_add and histogram, C matmul and stencil) at once under
#      ppq-even-drain, fcfs, ppq-excl-cs, dss-cs and spatial-even: each output must equal the
#      same kernel run natively (examples/clients/native.py), byte for byte;
#   2. the kill test: 20 clients killed with SIGKILL at random points while three others run;
#      afterwards the daemon holds no client memory and no SM, device memory (cuMemGetInfo, from
#      a fresh process) is back at its baseline, and a new client still runs correctly;
#   3. a faulting kernel (out-of-bounds write) in one client while another runs matmuls: the
#      culprit gets KernelFault, the bystander ContextLost naming its lost work, the daemon
#      rebuilds its device and both go on;
#   4. launch limits (issue 36, case 0): the CI property test `launch_limits` against this
#      daemon on the GPU: random launch shapes at CUDA's limits ±1, each runs (its block 0
#      writes a word read back) or fails its own client with the limit named, while another
#      client launches throughout; the daemon never stops (BIN_DIR/tests/launch_limits, from
#      `scripts/device-build.sh`).
#   5. the CUDA runtime patterns of issue 40 (examples/clients/stream_pipeline.rs, event_timing.rs):
#      a copy/compute pipeline over 4 streams ordered by stream waits, and a kernel timed with
#      events, each through the daemon and natively (native_lcg.py, CuPy, the same streams and
#      events): outputs byte-equal to native and checked against the CPU; the pipeline's time
#      within 10% of native and below its copies' time plus its kernels' time (overlap): each
#      side run PIPELINE_ROUNDS times, interleaved (N D, D N, ...), each run a warm-up and 7
#      timed repetitions, the medians of all of a side's repetitions compared
#      (scripts/pipeline-times.py; every run's figures in the output, the pooled ones in the
#      summary, with the event-timed kernel's on each side).
#      Then the CI test `pitched_async_copies` against daemons on the GPU: pitched copies
#      (a linear copy per row on the GPU) between buffers and host memory round-trip with their gaps untouched,
#      copies that do not wait are ordered by their streams and events (BIN_DIR/tests/).
# Prints PASS/FAIL per check and a summary last; exits non-zero if any failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-${BIN:-$root/target/device/main}}")
OUT=$(realpath -m "${2:-${OUT:-/tmp}/daemon-check}")
cd "$root"
[ -x "$BIN/gpumuxd" ] || { echo "daemon-gpu-check: no gpumuxd in $BIN (scripts/device-build.sh makes it)" >&2; exit 2; }
CHECKS=${DAEMON_CHECKS:-clients kill fault limits pipeline}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NVRTC for the daemon's compiles: the CUDA toolkit's, or the pip wheel's.
source "$root/scripts/nvrtc-path.sh"
wants() { [[ " $CHECKS " == *" $1 "* ]]; }
fails=0
results=()
note() { results+=("$1"); echo "$1"; }
pass() { note "PASS $1"; }
fail() { note "FAIL $1"; fails=$((fails + 1)); }

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

# Free device memory as cuMemGetInfo reports it, from a fresh process (its own
# context costs the same every time, so before and after compare).
free_mem() { python3 -c 'import cupy; print(cupy.cuda.runtime.memGetInfo()[0])'; }

start_daemon() { # policy socket log
    rm -f "$2"
    "$BIN/gpumuxd" --device "${DAEMON_DEVICE:-cuda:0}" --policy "$1" --socket "$2" 2>"$3" &
    daemon_pid=$!
    for _ in $(seq 1 300); do
        [ -S "$2" ] && return 0
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "daemon did not start; its log:"; tail -20 "$3"; return 1
}
stop_daemon() { kill -TERM "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; }

# Every client takes --socket, --out and --check.
clients=(vector_add histogram matmul stencil)
run_client() { # name socket outfile log
    timeout 120 "$BIN/$1" --socket "$2" --check --out "$3" >"$4" 2>&1
}

echo "== native reference (CuPy)"
if python3 examples/clients/native.py --out-dir "$OUT/native" >"$OUT/native.log" 2>&1; then
    pass "native reference written"
else
    fail "native reference: $(tail -3 "$OUT/native.log")"
fi

echo "== 1. four clients at once, per policy"
wants clients && for policy in ppq-even-drain fcfs ppq-excl-cs dss-cs spatial-even; do
    dir="$OUT/$policy"; mkdir -p "$dir"
    sock="$OUT/$policy.sock"
    start_daemon "$policy" "$sock" "$dir/daemon.log" || { fail "$policy: daemon start"; continue; }
    t0=$(date +%s%N)
    pids=()
    for c in "${clients[@]}"; do
        run_client "$c" "$sock" "$dir/$c.bin" "$dir/$c.log" & pids+=($!)
    done
    ok=1
    for i in "${!clients[@]}"; do
        c=${clients[$i]}
        if ! wait "${pids[$i]}"; then ok=0; echo "  $c failed: $(tail -3 "$dir/$c.log")"; continue; fi
        if ! cmp -s "$dir/$c.bin" "$OUT/native/$c.bin"; then ok=0; echo "  $c: output differs from native"; fi
    done
    t=$((($(date +%s%N) - t0) / 1000000))
    "$BIN/gpumux" ps --socket "$sock" --json >"$dir/ps.json" 2>&1
    stop_daemon
    if [ $ok = 1 ]; then pass "$policy: 4 clients, outputs equal native (${t} ms)"; else fail "$policy: see $dir"; fi
done

echo "== 2. kill test: 20 SIGKILLs while 3 clients run"
dir="$OUT/kill"; mkdir -p "$dir"; sock="$OUT/kill.sock"
if ! wants kill; then echo "  (not asked for)"
elif start_daemon ppq-even-drain "$sock" "$dir/daemon.log"; then
    # Warm up first, at the concurrency of the test (the three clients and a
    # churning one at once): the daemon's own pools (streams, worker control
    # records, the compile cache) grow to the most used at once and stay; the
    # baseline is after that. Run 13 measured -4 MiB without this warm-up.
    # The warm-up kills ${KILL_WARMUP:-1} churning client(s) too (run 17: the first
    # kills on the H100 cost 4 MiB once, and no more over 20 further kills).
    warmers=()
    for c in vector_add histogram matmul; do run_client "$c" "$sock" "$dir/$c.bin" "$dir/$c.warm.log" & warmers+=($!); done
    for w in $(seq 1 "${KILL_WARMUP:-1}"); do
        "$BIN/fault_check" churn --socket "$sock" >"$dir/churn.warm$w.log" 2>&1 & warm=$!
        sleep 0.3; kill -9 "$warm"; wait "$warm" 2>/dev/null
    done
    wait "${warmers[@]}"; sleep 0.5
    "$BIN/gpumux" ps --socket "$sock" --json >"$dir/ps-before.json"
    before=$(free_mem)
    others=()
    for c in vector_add histogram matmul; do
        ( for r in 1 2 3 4 5; do run_client "$c" "$sock" "$dir/$c.bin" "$dir/$c.$r.log" || exit 1; \
          cmp -s "$dir/$c.bin" "$OUT/native/$c.bin" || exit 2; done ) & others+=($!)
    done
    RANDOM=13
    for k in $(seq 1 20); do
        "$BIN/fault_check" churn --socket "$sock" >"$dir/churn.$k.log" 2>&1 &
        victim=$!
        sleep "0.$((RANDOM % 9 + 1))"
        kill -9 "$victim"; wait "$victim" 2>/dev/null
    done
    ok=1
    for i in "${!others[@]}"; do wait "${others[$i]}" || { ok=0; echo "  other client $i failed"; }; done
    sleep 1
    "$BIN/gpumux" ps --socket "$sock" --json >"$dir/ps.json"
    accounting() { python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["memory_used"], sum(c["sms_held"] for c in s["clients"]), sum(c["memory_used"] for c in s["clients"]))' "$1"; }
    used=$(accounting "$dir/ps.json")
    after=$(free_mem)
    # A second round of 20 kills: a leak per killed client would lower free
    # memory again; a pool or the driver's allocator keeping a page would not.
    for k in $(seq 21 40); do
        "$BIN/fault_check" churn --socket "$sock" >"$dir/churn.$k.log" 2>&1 &
        victim=$!
        sleep "0.$((RANDOM % 9 + 1))"
        kill -9 "$victim"; wait "$victim" 2>/dev/null
    done
    sleep 1
    "$BIN/gpumux" ps --socket "$sock" --json >"$dir/ps2.json"
    used2=$(accounting "$dir/ps2.json")
    after2=$(free_mem)
    run_client vector_add "$sock" "$dir/new.bin" "$dir/new.log" && cmp -s "$dir/new.bin" "$OUT/native/vector_add.bin" || ok=0
    stop_daemon
    echo "  daemon accounting (memory_used, SMs held, client memory): $used after 20 kills, $used2 after 40"
    echo "  free device memory: baseline $before, after 20 kills $after ($((after - before))), after 40 $after2 ($((after2 - after)) more)"
    [ "$used" = "0 0 0" ] && [ "$used2" = "0 0 0" ] || ok=0
    [ "$before" = "$after" ] || { echo "  device free memory changed by $((after - before)) bytes"; ok=0; }
    if [ $ok = 1 ]; then pass "kill test: others correct, accounting 0, free memory back to baseline ($after B), new client ok"; else fail "kill test: see $dir"; fi
else
    fail "kill test: daemon start"
fi

echo "== 3. a faulting kernel"
dir="$OUT/fault"; mkdir -p "$dir"; sock="$OUT/fault.sock"
if ! wants fault; then echo "  (not asked for)"
elif start_daemon ppq-even-drain "$sock" "$dir/daemon.log"; then
    "$BIN/fault_check" bystander --socket "$sock" --seconds 60 >"$dir/bystander.log" 2>&1 & by=$!
    sleep 3
    "$BIN/fault_check" culprit --socket "$sock" >"$dir/culprit.log" 2>&1; culprit=$?
    wait $by; bystander=$?
    run_client vector_add "$sock" "$dir/after.bin" "$dir/after.log" && cmp -s "$dir/after.bin" "$OUT/native/vector_add.bin"; after=$?
    "$BIN/gpumux" ps --socket "$sock" --json >"$dir/ps.json"
    stop_daemon
    cat "$dir/culprit.log" "$dir/bystander.log"
    if [ $culprit = 0 ] && [ $bystander = 0 ] && [ $after = 0 ]; then
        pass "fault: culprit told, bystander told what it lost, daemon rebuilt and serves new clients correctly"
    else
        fail "fault: culprit $culprit, bystander $bystander, new client $after (see $dir)"
    fi
else
    fail "fault: daemon start"
fi

echo "== 4. launch limits"
dir="$OUT/limits"; mkdir -p "$dir"
if ! wants limits; then echo "  (not asked for)"
elif [ ! -x "$BIN/tests/launch_limits" ]; then fail "limits: no $BIN/tests/launch_limits (scripts/device-build.sh)"
elif GPUMUXD_TEST_BIN="$BIN/gpumuxd" GPUMUXD_TEST_DEVICE=${DAEMON_DEVICE:-cuda:0} GPUMUXD_TEST_LOG=info \
        "$BIN/tests/launch_limits" --nocapture >"$dir/test.log" 2>&1; then
    pass "limits: every launch shape ran (its mark read back) or failed its own client with the limit; bystander untouched"
else
    # The panic's own lines first (the daemon's log follows them and would push them out of a tail).
    grep -A6 "panicked at" "$dir/test.log"; tail -20 "$dir/test.log"
    fail "limits: $(grep -A1 "panicked at" "$dir/test.log" | tail -1 | cut -c1-200) (see $dir/test.log)"
fi

echo "== 5. a 4-stream pipeline with stream waits, and a kernel timed with events (issue 40)"
dir="$OUT/pipeline"; mkdir -p "$dir"; sock="$OUT/pipeline.sock"
# A figure `key=N` of a log line.
figure() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" "$2" | head -1; }
# One run of a side, native (CuPy) or daemon (stream_pipeline, against the daemon started
# below): its output in $dir/SIDE.ROUND.bin, its log in .log.
# shellcheck disable=SC2086 # LCG_ARGS is a list of arguments
pipeline_run() { # side round
    if [ "$1" = native ]; then
        python3 examples/clients/native_lcg.py pipeline --out "$dir/native.$2.bin" ${LCG_ARGS:-} >"$dir/native.$2.log" 2>&1
    else
        timeout 300 "$BIN/stream_pipeline" --socket "$sock" --check --out "$dir/daemon.$2.bin" ${LCG_ARGS:-} >"$dir/daemon.$2.log" 2>&1
    fi
}
# The GPU's clocks, temperature and compute processes, the gpumuxd processes (pid, parent,
# seconds alive) and the three processes with the most CPU time per second alive, before and
# after the rounds: a daemon, device process or client left by an earlier check shows here
# beside this check's daemon and its device process, and so does a clock or a temperature that
# moved between the rounds.
gpu_state() {
    echo "  $1: GPU $(nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,pstate --format=csv,noheader 2>&1);" \
        "compute processes: $(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 | tr '\n' ';');" \
        "gpumuxd processes: $(ps -C gpumuxd -o pid=,ppid=,etimes= | tr -s ' \n' ' ');" \
        "busiest (pid %cpu s command): $(ps -eo pid=,pcpu=,etimes=,comm= --sort=-pcpu | head -3 | tr -s ' \n' ' ')"
}
rounds=${PIPELINE_ROUNDS:-4}
# shellcheck disable=SC2086 # LCG_ARGS is a list of arguments
if ! wants pipeline; then echo "  (not asked for)"
elif [ ! -x "$BIN/stream_pipeline" ] || [ ! -x "$BIN/event_timing" ]; then
    fail "pipeline: no stream_pipeline / event_timing in $BIN (scripts/device-build.sh)"
elif ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
    fail "pipeline: PIPELINE_ROUNDS=$rounds is not a number > 0"
elif start_daemon ppq-even-drain "$sock" "$dir/daemon.log"; then
    # The pipeline's time: each side run $rounds times, each run a warm-up and 7 timed
    # repetitions, the sides' runs next to each other in the order N D, D N, N D, ... so that a
    # drift (clocks, temperature, what earlier checks left) falls on both; one daemon serves
    # every daemon run, idle while a native one runs. scripts/pipeline-times.py pools each side's
    # repetitions and compares the medians.
    gpu_state before
    piped=0
    for r in $(seq 1 "$rounds"); do
        if [ $((r % 2)) = 1 ]; then order="native daemon"; else order="daemon native"; fi
        for side in $order; do
            pipeline_run "$side" "$r" || { piped=1; echo "  $side run $r failed: $(tail -2 "$dir/$side.$r.log")"; }
        done
    done
    gpu_state after
    timeout 300 "$BIN/event_timing" --socket "$sock" --check --out "$dir/timing.bin" ${LCG_ARGS:-} >"$dir/timing.log" 2>&1; timed=$?
    python3 examples/clients/native_lcg.py timing --out "$dir/native-timing.bin" ${LCG_ARGS:-} >"$dir/native-timing.log" 2>&1; ntimed=$?
    stop_daemon
    cat "$dir"/native.1.log "$dir"/daemon.1.log "$dir"/native-timing.log "$dir"/timing.log
    tk=$(figure kernel_ms "$dir/timing.log"); ntk=$(figure kernel_ms "$dir/native-timing.log")
    differs=""; natives=(); daemons=()
    for r in $(seq 1 "$rounds"); do
        for side in native daemon; do
            cmp -s "$dir/$side.$r.bin" "$dir/native.1.bin" || differs="$differs $side.$r.bin"
        done
        natives+=("$dir/native.$r.log"); daemons+=("$dir/daemon.$r.log")
    done
    if [ $piped != 0 ]; then fail "pipeline: a run failed (see $dir/{native,daemon}.*.log)"
    elif [ -n "$differs" ]; then fail "pipeline: output differs from native's first run:$differs"
    elif python3 scripts/pipeline-times.py --limit 1.10 --native "${natives[@]}" --daemon "${daemons[@]}" >"$dir/times.txt" 2>&1; then
        cat "$dir/times.txt"; pass "pipeline: outputs equal native; $(tail -1 "$dir/times.txt" | sed 's/^pipeline: //')"
    else
        cat "$dir/times.txt"; fail "pipeline: $(tail -1 "$dir/times.txt" | sed 's/^pipeline: //')"
    fi
    if [ $timed != 0 ]; then fail "event timing: event_timing failed (see $dir/timing.log)"
    elif [ $ntimed != 0 ]; then fail "event timing: the native run: $(tail -2 "$dir/native-timing.log")"
    elif ! cmp -s "$dir/timing.bin" "$dir/native-timing.bin"; then fail "event timing: output differs from native"
    else pass "event timing: output equals native; kernel ${tk} ms by gpumux events against ${ntk} ms by CUDA events"
    fi
    if [ ! -x "$BIN/tests/pitched_async_copies" ]; then fail "copies: no $BIN/tests/pitched_async_copies (scripts/device-build.sh)"
    elif GPUMUXD_TEST_BIN="$BIN/gpumuxd" GPUMUXD_TEST_DEVICE=${DAEMON_DEVICE:-cuda:0} GPUMUXD_TEST_LOG=info \
            "$BIN/tests/pitched_async_copies" --test-threads 1 >"$dir/copies.log" 2>&1; then
        pass "copies: pitched copies (one request each) and copies that do not wait round-trip on the GPU"
    else
        tail -20 "$dir/copies.log"; fail "copies: see $dir/copies.log"
    fi
else
    fail "pipeline: daemon start"
fi

echo
echo "== summary"
printf '%s\n' "${results[@]}"
exit $((fails > 0))

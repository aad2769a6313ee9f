#!/usr/bin/env bash
# One gpumuxd serving every GPU of a 2-GPU machine (issue 38; docs/multi-gpu.md, "One daemon, several GPUs").
#
#   scripts/multi-gpu-daemon-check.sh [BIN_DIR] [OUTDIR]
#
# BIN_DIR: what scripts/device-build.sh makes (default target/device/main; $BIN also works).
# OUTDIR:  logs and outputs (default $OUT/multi-gpu-check, else /tmp/multi-gpu-check).
# MULTI_DEVICE: the daemon's device (default cuda:all); MULTI_ONE: the one-GPU device of the STP runs
# (default cuda:0); MULTI_POLICY (default the daemon's default); MULTI_GPUS: the GPUs served (default: nvidia-smi's count);
# PLACE_REPEAT: launches per client in check 1 (default 3000);
# STP_ARGS_<client>: a client's arguments in the STP runs (defaults below: about a second of GPU work each).
# Needs 2 GPUs or more and python3 with CuPy (the native reference). Checks:
#   1. placement and outputs: the four example clients (Rust vector_add and histogram, C matmul and
#      stencil) at once on `cuda:all` under the default placement: each output equals the native
#      kernel's (examples/clients/native.py) byte for byte, and `gpumux ps --json` taken while all
#      four are connected shows them spread over the GPUs (2 and 2 on two GPUs);
#   2. pins: vector_add with GPUMUX_GPU=1 runs on GPU 1 (the daemon's log says where each client
#      went) with the native output; GPUMUX_GPU=<number of GPUs> is refused naming the GPUs served;
#   3. co-run STP: the four clients made longer (STP_ARGS_*), each alone on a daemon of GPU 0, then
#      the four at once on a daemon of GPU 0, then on the daemon of every GPU; STP = sum of T_alone /
#      T_shared over the clients (each client's wall time, process start to exit). Prints both STPs
#      and their ratio beside the issue's goal (>= 1.9x); a goal not met is printed, not a failure;
#   4. the same goal with loops of ~2 s alone natively: `gpumux bench daemon --device $MULTI_DEVICE
#      --only multi-gpu`, its tables printed: four identical SGEMM clients that each fill a GPU (the
#      goal's case), two triads and two FMA loops declaring their class (default placement and
#      least-loaded), and triad, FMA, SGEMM, histogram; each with the best ratio its mix allows;
#      outputs must equal the loops alone (MULTI_BENCH=0 skips it; MULTI_BENCH_ARGS).
#   5. moving a client (`gpumuxd --rebalance`, docs/multi-gpu.md): the CI test
#      `a_moved_client_keeps_every_byte_of_a_buffer_of_several_pieces_and_its_kernel_works` (BIN_DIR/tests/multi_gpu,
#      from scripts/device-build.sh) against `gpumuxd --device $MULTI_REBALANCE_DEVICE --rebalance` (default
#      cuda:0,1), once with each GPU's device in a child process and once in the daemon's: clients a and c
#      placed on GPU 0, b on GPU 1; a fills a 67 MiB buffer (more than one 64 MiB staging piece); b leaves;
#      a, idle, moves to GPU 1 at its next request; every byte of its buffer and its scale kernel's output
#      there equal the expected ones. MULTI_ONLY=rebalance runs only this check (no CuPy needed).
#   6. the links the simulator models (docs/multi-gpu.md, "The simulated links"): `gpumux-cuda-check links`
#      times peer copies between GPUs 0 and 1 and host copies to and from each, 4 KiB to 1 GiB, and prints
#      the model fitted to each link beside the preset's (MULTI_LINKS=0 skips it; MULTI_ONLY=links runs only
#      this check). Fails only if it cannot run.
#   7. one launch split over GPUs by the daemon (docs/split.md, "Splitting in the daemon"): the CI
#      tests `a_compute_bound_kernel_split_over_two_gpus_is_bitwise_equal_to_one_gpu` and
#      `a_kernel_with_global_atomics_is_refused...` (BIN_DIR/tests/split_launch) against
#      `gpumuxd --device $MULTI_SPLIT_DEVICE` (default cuda:0,1): an FMA loop (SPLIT_FMA_N threads,
#      default 2^21; SPLIT_FMA_ITERS, default 1,000,000) run whole on GPU 0, then split over both GPUs with
#      the shadow merge and with declared slices, every output byte equal to the whole run's; a kernel
#      with global atomics refused naming them. Prints the median times and the ratio beside the issue's
#      goal (>= 1.9x; not met is printed, not a failure). MULTI_ONLY=split runs only this check.
# Prints PASS/FAIL per check and a summary last (JSON in OUTDIR/multi-gpu.json); exits non-zero if a check failed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-${BIN:-$root/target/device/main}}")
OUT=$(realpath -m "${2:-${OUT:-/tmp}/multi-gpu-check}")
cd "$root"
[ -x "$BIN/gpumuxd" ] || { echo "multi-gpu-daemon-check: no gpumuxd in $BIN (scripts/device-build.sh makes it)" >&2; exit 2; }
DEVICE=${MULTI_DEVICE:-cuda:all}
ONE=${MULTI_ONE:-cuda:0}
POLICY_ARGS=()
[ -n "${MULTI_POLICY:-}" ] && POLICY_ARGS=(--policy "$MULTI_POLICY")
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
source "$root/scripts/nvrtc-path.sh"
fails=0
results=()
note() { results+=("$1"); echo "$1"; }
pass() { note "PASS $1"; }
fail() { note "FAIL $1"; fails=$((fails + 1)); }

nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
ngpus=${MULTI_GPUS:-$(grep -c . "$OUT/gpu.txt")}
[ "$ngpus" -ge 2 ] || { echo "multi-gpu-daemon-check: $ngpus GPU(s) here; it needs 2 or more" >&2; exit 2; }

# The clients queue thousands of launches without a sync (--repeat): above the default 4096 in flight.
config="$OUT/gpumuxd.toml"
printf '[[allow]]\nuid = %s\nqueued_ops = 100000\n' "$(id -u)" >"$config"
start_daemon() { # device socket log
    rm -f "$2"
    "$BIN/gpumuxd" --device "$1" "${POLICY_ARGS[@]}" --config "$config" --socket "$2" 2>"$3" &
    daemon_pid=$!
    for _ in $(seq 1 300); do
        [ -S "$2" ] && return 0
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "daemon did not start; its log:"; tail -20 "$3"; return 1
}
stop_daemon() { kill -TERM "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; }

# 5. (module doc) A client moved between GPUs keeps its bytes and its kernels work there.
rebalance_check() {
    local dev=${MULTI_REBALANCE_DEVICE:-cuda:0,1} dir="$OUT/rebalance"
    echo "== 5. --rebalance on $dev: an idle client moves to an emptied GPU with its bytes"
    mkdir -p "$dir"
    if [ ! -x "$BIN/tests/multi_gpu" ]; then
        fail "rebalance: no $BIN/tests/multi_gpu (scripts/device-build.sh)"
    elif GPUMUXD_TEST_BIN="$BIN/gpumuxd" GPUMUXD_TEST_MULTI_DEVICE=$dev GPUMUXD_TEST_LOG=info timeout 600 \
            "$BIN/tests/multi_gpu" a_moved_client_keeps_every_byte --test-threads 1 --nocapture >"$dir/test.log" 2>&1 \
            && grep -q '^test result: ok. 1 passed' "$dir/test.log"; then
        grep -E '^--device-(in-)?process: a moved' "$dir/test.log" | sed 's/^/  /'
        grep -o 'client [0-9]* `a` moved from GPU 0 to GPU 1[^"]*' "$dir/test.log" | sed 's/^/  daemon: /'
        pass "rebalance: a moved from GPU 0 to GPU 1 (device process and in-process), bytes and kernel output equal"
    else
        tail -30 "$dir/test.log"; fail "rebalance: see $dir/test.log"
    fi
}
# 6. (module doc) The links the simulator models, timed: `gpumux-cuda-check links`.
links_check() {
    echo "== 6. the links of GPUs 0 and 1 (gpumux-cuda-check links)"
    local dir="$OUT/links"; mkdir -p "$dir"
    if [ ! -x "$BIN/gpumux-cuda-check" ]; then
        fail "links: no $BIN/gpumux-cuda-check (scripts/device-build.sh)"
    elif timeout 300 "$BIN/gpumux-cuda-check" --json "$dir/links.json" links >"$dir/links.txt" 2>&1; then
        cat "$dir/links.txt"
        pass "links: peer and host copies timed, the model fitted to each link (table above; $dir/links.json)"
    else
        cat "$dir/links.txt"
        fail "links: gpumux-cuda-check links exited non-zero (see $dir/links.txt)"
    fi
}
# 7. (module doc) One launch split over the GPUs by the daemon, bitwise equal to one GPU.
split_check() {
    local dev=${MULTI_SPLIT_DEVICE:-cuda:0,1} dir="$OUT/split"
    echo "== 7. one launch split over the GPUs of $dev by the daemon"
    mkdir -p "$dir"
    if [ ! -x "$BIN/tests/split_launch" ]; then
        fail "split: no $BIN/tests/split_launch (scripts/device-build.sh)"
    elif GPUMUXD_TEST_BIN="$BIN/gpumuxd" GPUMUXD_TEST_MULTI_DEVICE=$dev GPUMUXD_TEST_LOG=info \
            GPUMUXD_SPLIT_FMA_N=${SPLIT_FMA_N:-2097152} GPUMUXD_SPLIT_FMA_ITERS=${SPLIT_FMA_ITERS:-1000000} timeout 600 \
            "$BIN/tests/split_launch" a_compute_bound_kernel_split a_kernel_with_global_atomics --test-threads 1 --nocapture \
            >"$dir/test.log" 2>&1 && grep -q '^test result: ok. 2 passed' "$dir/test.log"; then
        grep -E '^split (shadow|slices):' "$dir/test.log" | sed 's/^/  /'
        grep -o '`fma_loop` split over GPUs[^"]*' "$dir/test.log" | tail -2 | sed 's/^/  daemon: /'
        pass "split: fma_loop split over GPUs 0 and 1 by the daemon, bitwise equal to one GPU with both merges; hist refused"
    else
        tail -30 "$dir/test.log"; fail "split: see $dir/test.log"
    fi
}
# The PASS/FAIL lines, then the exit status: non-zero if a check failed.
summary() {
    echo
    echo "== summary"
    printf '%s\n' "${results[@]}"
    exit $((fails > 0))
}
case ${MULTI_ONLY:-} in
    links) links_check; summary ;;
    split) split_check; summary ;;
    rebalance) rebalance_check; summary ;;
esac

clients=(vector_add histogram matmul stencil)
# The STP runs' sizes: each client about a second of kernels on an H200, no --check (part 1 checked the outputs).
: "${STP_ARGS_vector_add:=--size 134217728 --repeat 2000}"
: "${STP_ARGS_histogram:=--size 536870912 --repeat 2000}"
: "${STP_ARGS_matmul:=--size 2048 --repeat 600}"
: "${STP_ARGS_stencil:=--size 16384 --repeat 2000}"
stp_args() { local v="STP_ARGS_$1"; echo "${!v}"; }

echo "== native reference (CuPy, GPU 0)"
if python3 examples/clients/native.py --out-dir "$OUT/native" >"$OUT/native.log" 2>&1; then
    pass "native reference written"
else
    fail "native reference: $(tail -3 "$OUT/native.log")"
fi

# The GPU of each example client in a ps --json, once all four are listed: "name gpu" lines.
placed() { python3 - "$1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
for c in s["clients"]:
    if c["name"] != "gpumux ps":
        print(c["name"], c["gpu"])
EOF
}

echo "== 1. four clients at once on $DEVICE: outputs and placement"
dir="$OUT/placement"; mkdir -p "$dir"; sock="$OUT/multi.sock"
if start_daemon "$DEVICE" "$sock" "$dir/daemon.log"; then
    pids=()
    for c in "${clients[@]}"; do
        # The default sizes (the native outputs'), launched ${PLACE_REPEAT:-3000} times: long enough
        # that all four are connected together; each launch gives the same output (examples/clients/README.md).
        timeout 300 "$BIN/$c" --socket "$sock" --check --repeat "${PLACE_REPEAT:-3000}" --out "$dir/$c.bin" >"$dir/$c.log" 2>&1 &
        pids+=($!)
    done
    # ps only once all four are placed: a ps connection is a client too, and
    # one placed while they connect would count in least-loaded's choice.
    for _ in $(seq 1 3000); do
        [ "$(grep -c 'connected on GPU' "$dir/daemon.log")" -ge 4 ] && break
        sleep 0.01
    done
    "$BIN/gpumux" ps --socket "$sock" --json >"$dir/ps.json" 2>/dev/null || true
    seen=$(placed "$dir/ps.json" 2>/dev/null)
    ok=1
    for i in "${!clients[@]}"; do
        c=${clients[$i]}
        if ! wait "${pids[$i]}"; then ok=0; echo "  $c failed: $(tail -3 "$dir/$c.log")"; continue; fi
        cmp -s "$dir/$c.bin" "$OUT/native/$c.bin" || { ok=0; echo "  $c: output differs from native"; }
    done
    # Where each went, from the daemon's log (every client, even one too quick for ps).
    grep -o '`[a-z_]*` (pid [0-9]*, uid [0-9]*) connected on GPU [0-9]*' "$dir/daemon.log" | sed 's/`//g; s/ (pid.*on GPU / /' >"$dir/placed.txt"
    stop_daemon
    if [ $ok = 1 ]; then pass "4 clients on $DEVICE: outputs equal native"; else fail "4 clients on $DEVICE: outputs (see $dir)"; fi
    echo "  placed (daemon log): $(tr '\n' ' ' <"$dir/placed.txt")"
    echo "  seen together by gpumux ps: $(echo "$seen" | tr '\n' ' ')"
    per_gpu=$(awk '{print $2}' "$dir/placed.txt" | sort | uniq -c | awk '{print $1}' | sort -n | tr '\n' ' ')
    want=$(python3 -c "n=$ngpus; k=4; print(' '.join(str(x) for x in sorted([k//n + (1 if i < k % n else 0) for i in range(n)]) if x))")
    if [ "$(echo $per_gpu)" = "$want" ]; then pass "placement spread: clients per GPU $per_gpu(least-loaded: $want)"
    else fail "placement spread: clients per GPU $per_gpu, expected $want (see $dir/placed.txt)"; fi
    if [ "$(echo "$seen" | grep -c .)" -ge 4 ]; then
        pass "gpumux ps --json shows the four with their GPUs: $(echo "$seen" | awk '{print $2}' | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
    else
        note "NOTE gpumux ps never saw all four at once (they finished within a poll); the daemon log above has the placement"
    fi
else
    fail "daemon start on $DEVICE"
fi

echo "== 2. pins"
dir="$OUT/pins"; mkdir -p "$dir"
if start_daemon "$DEVICE" "$sock" "$dir/daemon.log"; then
    if GPUMUX_GPU=1 timeout 120 "$BIN/vector_add" --socket "$sock" --check --out "$dir/vector_add.bin" >"$dir/pinned.log" 2>&1 \
        && cmp -s "$dir/vector_add.bin" "$OUT/native/vector_add.bin" \
        && grep -q '`vector_add` (pid [0-9]*, uid [0-9]*) connected on GPU 1' "$dir/daemon.log"; then
        pass "GPUMUX_GPU=1: vector_add ran on GPU 1, output equals native"
    else
        fail "GPUMUX_GPU=1: see $dir/pinned.log and $dir/daemon.log"
    fi
    if GPUMUX_GPU=$ngpus timeout 60 "$BIN/vector_add" --socket "$sock" >"$dir/refused.log" 2>&1; then
        fail "GPUMUX_GPU=$ngpus was not refused"
    elif grep -q "no GPU $ngpus" "$dir/refused.log"; then
        pass "GPUMUX_GPU=$ngpus refused: $(grep -o "no GPU $ngpus[^(]*" "$dir/refused.log" | head -1)"
    else
        fail "GPUMUX_GPU=$ngpus failed without naming the GPUs: $(tail -2 "$dir/refused.log")"
    fi
    stop_daemon
else
    fail "daemon start for the pins"
fi

echo "== 3. co-run STP: the four clients on $ONE and on $DEVICE"
dir="$OUT/stp"; mkdir -p "$dir"
ms_now() { echo $(($(date +%s%N) / 1000000)); }
run_timed() { # client socket log -> prints ms, or FAIL
    local t0; t0=$(ms_now)
    # shellcheck disable=SC2046
    if timeout 600 "$BIN/$1" --socket "$2" $(stp_args "$1") >"$3" 2>&1; then echo $(($(ms_now) - t0)); else echo FAIL; fi
}
corun() { # device tag -> "client ms" lines in $dir/<tag>.txt
    start_daemon "$1" "$sock" "$dir/$2.daemon.log" || return 1
    : >"$dir/$2.txt"
    for c in "${clients[@]}"; do
        ( echo "$c $(run_timed "$c" "$sock" "$dir/$2.$c.log")" >>"$dir/$2.txt" ) &
    done
    wait $(jobs -p | grep -v "^$daemon_pid\$")
    stop_daemon
}
: >"$dir/alone.txt"
if start_daemon "$ONE" "$sock" "$dir/alone.daemon.log"; then
    for c in "${clients[@]}"; do echo "$c $(run_timed "$c" "$sock" "$dir/alone.$c.log")" >>"$dir/alone.txt"; done
    stop_daemon
fi
corun "$ONE" one
corun "$DEVICE" all
if grep -q FAIL "$dir"/alone.txt "$dir"/one.txt "$dir"/all.txt || [ "$(cat "$dir"/{alone,one,all}.txt | grep -c .)" -ne 12 ]; then
    fail "STP runs: a client failed (see $dir)"
else
    python3 - "$dir" "$OUT/multi-gpu.json" "$ngpus" <<'EOF' | tee "$dir/stp.txt"
import json, sys
d, out, ngpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
read = lambda t: {l.split()[0]: float(l.split()[1]) for l in open(f"{d}/{t}.txt") if l.strip()}
alone, one, many = read("alone"), read("one"), read("all")
stp = lambda shared: sum(alone[c] / shared[c] for c in alone)
s1, s2 = stp(one), stp(many)
print("| client | alone on GPU 0, ms | 4 on GPU 0, ms | 4 on every GPU, ms |")
print("|---|---|---|---|")
for c in alone:
    print(f"| {c} | {alone[c]:.0f} | {one[c]:.0f} | {many[c]:.0f} |")
print(f"| STP | | {s1:.2f} | {s2:.2f} |")
print()
print("| goal | measured | target | anchor |")
print("|---|---|---|---|")
print(f"| 4 clients on {ngpus} GPUs under the default placement, STP against the same on 1 GPU | {s2 / s1:.2f}x | >= 1.9x | (none in the seeds) |")
json.dump({"alone_ms": alone, "one_gpu_ms": one, "all_gpus_ms": many, "stp_one": s1, "stp_all": s2,
           "ratio": s2 / s1, "gpus": ngpus}, open(out, "w"), indent=1)
EOF
    ratio=$(python3 -c "import json; print(f\"{json.load(open('$OUT/multi-gpu.json'))['ratio']:.2f}\")")
    pass "STP runs complete: $ratio x the one-GPU STP"
    python3 -c "import sys; sys.exit(0 if $ratio >= 1.9 else 1)" || note "GOAL NOT MET: STP ratio $ratio x < 1.9x"
fi

# 4. The goal with clients that each fill a GPU (the example clients above leave one mostly idle):
# gpumux bench daemon's multi-gpu experiment (docs/multi-gpu.md, "The STP goal"). MULTI_BENCH=0 skips it;
# MULTI_BENCH_ARGS adds to its arguments (e.g. --corun-seconds 4).
if [ "${MULTI_BENCH:-1}" != 0 ]; then
    echo "== 4. four GPU-filling clients (gpumux bench daemon --only multi-gpu) on $DEVICE against its first GPU"
    dir="$OUT/bench"; mkdir -p "$dir"
    # shellcheck disable=SC2086
    if timeout 900 "$BIN/gpumux" bench daemon --device "$DEVICE" --only multi-gpu ${MULTI_POLICY:+--policy "$MULTI_POLICY"} \
        --logs "$dir/logs" --json "$dir/multi-gpu-bench.json" ${MULTI_BENCH_ARGS:-} >"$dir/bench.txt" 2>"$dir/bench.err"; then
        cat "$dir/bench.txt"
        verdict=$(python3 - "$dir/multi-gpu-bench.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))["multi_gpu"]
bad = [f"{c['name']}:{r['kernel']}" for c in m["cases"] for r in c["rows"] if not r["outputs_equal"]]
# The goal's case is `identical` (four GPU-filling clients); the others print their ratio beside the best their mix allows.
goal = next(c for c in m["cases"] if c["name"] == "identical")
others = ";".join(f"{c['name']}:" + "/".join(f"{r['placement']}={r['ratio']:.2f}x" for r in c["runs"]) + f"(best={c['best_ratio']:.2f}x)"
                  for c in m["cases"] if c["name"] != "identical")
print("ok" if not bad else "outputs-differ:" + ",".join(bad), f"{goal['runs'][0]['ratio']:.2f}", goal["met"], others)
EOF
)
        read -r ok ratio met others <<<"$verdict"
        if [ "$ok" = ok ]; then pass "GPU-filling clients: outputs equal each alone; identical clients' STP ratio ${ratio}x; ${others}"
        else fail "GPU-filling clients: $verdict (see $dir)"; fi
        [ "$met" = True ] || note "GOAL NOT MET with four identical GPU-filling clients: STP ratio ${ratio}x < 1.9x"
    else
        fail "gpumux bench daemon --only multi-gpu: $(tail -3 "$dir/bench.err")"
    fi
fi

rebalance_check
split_check

[ "${MULTI_LINKS:-1}" != 0 ] && links_check

summary

#!/usr/bin/env bash
# Device memory oversubscription on a real GPU (issue 39; docs/daemon.md, "Memory oversubscription").
#
#   scripts/oversubscribe-gpu.sh [BIN_DIR] [OUTDIR]
#
# BIN_DIR: what scripts/device-build.sh makes (default target/device/main; needs gpumuxd, gpumux and
#          the `oversubscribe` example client). OUTDIR: logs and outputs (default $OUT/oversubscribe,
#          else /tmp/oversubscribe).
# FRACTION (default 0.6): each client's share of the GPU's memory; ROUNDS (default 4) and STEPS
# (default 50): each client runs ROUNDS rounds of STEPS kernels over its whole buffer, with a sync
# after each round (where the daemon may evict it). DAEMON_DEVICE (default cuda:0).
# Host memory: two clients' buffers evicted at rest, and one more during an exchange (the pinned
# host pool's chunks): about 3 x FRACTION x the device memory handed out (pinned, at most
# swap_memory). With less RAM than that and 24 GiB more (an H200, 141 GB, at 0.6: ~254 GB; the
# nvidia-h200 kind has 128 GiB, nvidia-h200-x4 512 GiB), the daemons hand out less of the GPU
# (`--device-memory`, whole GiB: DEVICE_MEMORY=BYTES sets it) so that the three clients of FRACTION
# of it still oversubscribe it while the host holds their copies; the table says the cap. Needs
# python3 with CuPy (the native pinned-copy baseline).
#
#   1. each client alone (seeds 1, 2, 3), one after another: its output and time;
#   2. the three at once: each output must equal its alone output byte for byte (a 64-bit digest
#      of every word with its index, and the first and last 4 KiB); makespan against the sum of
#      the alone times;
#   3. an urgent client (priority 5, 5 % of the memory, URGENT_ROUNDS rounds: default 16 x ROUNDS,
#      several seconds, so that it spans several of its neighbours' swaps) alone, then beside two
#      clients that swap: its time (rate) lost, and its output equal; the line also says how many
#      evictions and restores ran while it ran and how long its neighbours' runs took against alone
#      (the policy's reserves keep long-block neighbours off its SMs while it is active, so they
#      mostly wait for it: docs/oversubscription.md, "The urgent client"). This phase runs on a second
#      daemon started with --swap-keep 0, so that the two really swap (out and back at every sync
#      between rounds): with the default kept time, each runs to its end once it has the memory and
#      nothing moves. Two controls say where a loss comes from (CONTROLS=0 leaves them out): the
#      urgent client beside two clients of CONTROL_FRACTION (default 0.3) that fit and never swap
#      (what sharing the GPU costs it, swapping aside), and beside two that swap on a daemon whose
#      copy pool has CONTROL_THREADS threads (default 16, GPUMUX_SWAP_COPY_THREADS: what more host
#      copy threads cost it, and the rates they reach), and on one with no pinned host pool, every
#      move through the ring (GPUMUX_SWAP_PINNED=0: what the pool changes, its cost and rates), and
#      on one whose straight moves are paced at CONTROL_PACE GB/s (default 46, 83 % of the link;
#      GPUMUX_SWAP_PACE: does a move at the link's full rate cost the urgent client?).
#      One more control, beside ONE client of FRACTION that fits and never swaps, says what sharing
#      the GPU with kernels as long as the swapping neighbours' costs (their blocks stride over
#      FRACTION of the memory, twice the fit control's). CONTROLS=urgent runs only these two;
#   4. the daemons' evictions and restores (their logs: bytes, ms, GB/s each; most come from
#      phase 3) against a native pinned cudaMemcpy of the same direction in the same run (CuPy).
# Prints the issue's goals table last; exits non-zero if a measured goal fails.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-${BIN:-$root/target/device/main}}")
OUT=$(realpath -m "${2:-${OUT:-/tmp}/oversubscribe}")
cd "$root"
for b in gpumuxd oversubscribe; do
    [ -x "$BIN/$b" ] || { echo "oversubscribe-gpu: no $b in $BIN (scripts/device-build.sh makes it)" >&2; exit 2; }
done
mkdir -p "$OUT"
source "$root/scripts/nvrtc-path.sh"
FRACTION=${FRACTION:-0.6} ROUNDS=${ROUNDS:-4} STEPS=${STEPS:-50}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
gpu_mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -1)   # MiB
gpu_bytes=$((gpu_mem * 1024 * 1024))
host_bytes=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) * 1024))
# The device memory the daemons hand out: all of the GPU, unless the host cannot hold three
# clients' copies (then whole GiB that it can), or DEVICE_MEMORY says.
capped="" cap_args=()
need=$(python3 -c "print(int(3 * $FRACTION * $gpu_bytes) + (24 << 30))")
if [ -z "${DEVICE_MEMORY:-}" ] && [ "$need" -gt "$host_bytes" ]; then
    DEVICE_MEMORY=$(python3 -c "print(int(($host_bytes - (24 << 30)) / (3 * $FRACTION)) >> 30 << 30)")
fi
mem_bytes=$gpu_bytes
if [ -n "${DEVICE_MEMORY:-}" ]; then
    mem_bytes=$DEVICE_MEMORY cap_args=(--device-memory "$DEVICE_MEMORY")
    capped=" (device memory CAPPED at $((DEVICE_MEMORY >> 30)) GiB of the GPU's $((gpu_bytes >> 30)) GiB: --device-memory; this host has $((host_bytes >> 30)) GiB of RAM)"
    echo "oversubscribe-gpu: the daemons hand out $DEVICE_MEMORY bytes of the GPU$capped"
fi
swap=$(python3 -c "print(int(3 * $FRACTION * $mem_bytes) + (4 << 30))")
echo "GPU $((gpu_bytes >> 20)) MiB ($((mem_bytes >> 20)) MiB handed out), host $((host_bytes >> 30)) GiB, each client $FRACTION of it, swap_memory $((swap >> 30)) GiB"

echo "== native pinned copies (CuPy)"
copy_bytes=$(python3 -c "print(min(8 << 30, int($FRACTION * $mem_bytes) // 4))")
python3 - "$copy_bytes" >"$OUT/native.txt" 2>"$OUT/native.log" <<'EOF'
import sys, time, cupy
n = int(sys.argv[1])
dev = cupy.cuda.alloc(n)
host = cupy.cuda.alloc_pinned_memory(n)
s = cupy.cuda.Stream(non_blocking=True)
rt = cupy.cuda.runtime
def best(kind, dst, src):
    times = []
    for _ in range(5):
        s.synchronize(); t = time.perf_counter()
        rt.memcpyAsync(dst, src, n, kind, s.ptr); s.synchronize()
        times.append(time.perf_counter() - t)
    return n / min(times) / 1e9
d2h = best(rt.memcpyDeviceToHost, host.ptr, dev.ptr)
h2d = best(rt.memcpyHostToDevice, dev.ptr, host.ptr)
print(f"{d2h:.2f} {h2d:.2f}")
EOF
read -r native_d2h native_h2d <"$OUT/native.txt" || { echo "native copies failed: $(tail -3 "$OUT/native.log")"; exit 1; }
echo "native pinned: device to host $native_d2h GB/s, host to device $native_h2d GB/s ($((copy_bytes >> 20)) MiB)"

# What pinning a host copy in place costs (cudaHostRegister), fresh and already faulted in as huge
# pages (what the mover's host copies are), and a DMA straight into it: whether evictions and
# restores could skip the pinned ring's CPU copies, which host memory bandwidth bounds. Not a goal.
python3 - "$copy_bytes" >"$OUT/register.txt" 2>"$OUT/register.log" <<'EOF'
import ctypes, mmap, sys, time, cupy
n = int(sys.argv[1])
rt = cupy.cuda.runtime
dev = cupy.cuda.alloc(n)
s = cupy.cuda.Stream(non_blocking=True)
def region(faulted):
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    if faulted:
        ctypes.memset(addr, 1, n)
    return m, addr
out = []
for faulted in (False, True):
    m, addr = region(faulted)
    t = time.perf_counter(); rt.hostRegister(addr, n, 0); reg = time.perf_counter() - t
    s.synchronize(); t = time.perf_counter()
    rt.memcpyAsync(addr, dev.ptr, n, rt.memcpyDeviceToHost, s.ptr); s.synchronize()
    d2h = time.perf_counter() - t
    t = time.perf_counter(); rt.memcpyAsync(dev.ptr, addr, n, rt.memcpyHostToDevice, s.ptr); s.synchronize()
    h2d = time.perf_counter() - t
    t = time.perf_counter(); rt.hostUnregister(addr); unreg = time.perf_counter() - t
    out.append(f"{'faulted-in THP' if faulted else 'fresh'}: register {n / reg / 1e9:.1f} GB/s, unregister {n / unreg / 1e9:.1f} GB/s, "
               f"DMA out {n / d2h / 1e9:.1f} / in {n / h2d / 1e9:.1f} GB/s")
print("; ".join(out))
EOF
register_line=$(cat "$OUT/register.txt" 2>/dev/null)
echo "host register: ${register_line:-failed: $(tail -2 "$OUT/register.log")}"

sock=$OUT/g.sock
# The pinned host pool each daemon grows from its start (GPUMUX_SWAP_AHEAD): the three clients' bytes,
# what their exchanges hold in host copies at most (the third exchange evicts the third client while
# the other two are out; pinning fresh memory runs at 6-7 GB/s, too slow to grow it between rounds).
# SWAP_AHEAD=BYTES sets it; 0: none, the pool grows once the clients oversubscribe the device. The
# clients start once it has grown, so that growing it slows no alone run; its time, rate and CPU
# are in the table.
SWAP_AHEAD=${SWAP_AHEAD:-$(python3 -c "print(int(3 * $FRACTION * $mem_bytes))")}
start_daemon() { # log [more gpumuxd arguments]
    local log=$1
    shift
    daemon_log=$log
    rm -f "$sock"
    GPUMUX_SWAP_AHEAD=$SWAP_AHEAD "$BIN/gpumuxd" --device "${DAEMON_DEVICE:-cuda:0}" --socket "$sock" --swap-memory "$swap" \
        ${cap_args[@]+"${cap_args[@]}"} "$@" 2>"$log" &
    daemon=$!
    for _ in $(seq 1 300); do [ -S "$sock" ] && break; sleep 0.1; done
    [ -S "$sock" ] || { echo "the daemon did not start:"; tail -20 "$log"; exit 1; }
    if [ "$SWAP_AHEAD" != 0 ] && [ "${GPUMUX_SWAP_PINNED:-}" != 0 ]; then
        for _ in $(seq 1 900); do grep -q "pinned host pool grown ahead" "$log" && break; sleep 0.1; done
        local grown_line
        grown_line=$(grep -h -o "pinned host pool grown ahead by .*" "$log" | head -1 | cut -c1-200)
        echo "${grown_line:-the pinned host pool did not grow in 90 s}"
    fi
}
start_daemon "$OUT/daemon.log"
client() { # seed outfile jsonfile [more arguments]
    local seed=$1 out=$2 json=$3
    shift 3
    "$BIN/oversubscribe" --socket "$sock" --fraction "$FRACTION" --rounds "$ROUNDS" --steps "$STEPS" \
        --name "c$seed" --seed "$seed" --out "$out" "$@" >"$json" 2>&1
}
# The urgent client of goal 4: 5 % of the memory, priority 5, URGENT_ROUNDS rounds.
URGENT_ROUNDS=${URGENT_ROUNDS:-$((16 * ROUNDS))} CONTROLS=${CONTROLS:-1}
CONTROL_FRACTION=${CONTROL_FRACTION:-0.3} CONTROL_THREADS=${CONTROL_THREADS:-16}
urgent() { client 9 "$1" "$2" --fraction 0.05 --priority 5 --rounds "$URGENT_ROUNDS"; }
seconds_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['seconds'])" "$1"; }
now() { date +%s.%N; }
ge() { python3 -c "import sys; sys.exit(0 if $1 >= $2 else 1)"; }
verdict() { if "$@"; then echo PASS; else echo FAIL; fi; }

echo "== each alone"
alone_sum=0 ok=1
for i in 1 2 3; do
    t=$(now)
    client "$i" "$OUT/alone$i.bin" "$OUT/alone$i.json" || { ok=0; echo "alone $i failed: $(tail -2 "$OUT/alone$i.json")"; }
    dt=$(python3 -c "print($(now) - $t)")
    alone_sum=$(python3 -c "print($alone_sum + $dt)")
    echo "alone c$i: $dt s $(cat "$OUT/alone$i.json")"
done
grep -c "evicted .* bytes" "$OUT/daemon.log" >"$OUT/evictions-alone.txt"

echo "== the three at once"
t=$(now)
pids=()
for i in 1 2 3; do client "$i" "$OUT/shared$i.bin" "$OUT/shared$i.json" & pids+=($!); done
for p in "${pids[@]}"; do wait "$p" || ok=0; done
makespan=$(python3 -c "print($(now) - $t)")
for i in 1 2 3; do echo "shared c$i: $(cat "$OUT/shared$i.json")"; done
"$BIN/gpumux" ps --socket "$sock" >"$OUT/ps.txt" 2>&1 || true

kill -TERM "$daemon"; wait "$daemon" 2>/dev/null
# Evictions and restores in the current daemon's log so far: "E R".
moves_now() { echo "$(grep -c "evicted [0-9]* bytes" "$daemon_log") $(grep -c "restored [0-9]* bytes" "$daemon_log")"; }
# The urgent client beside two others (seeds 1 and 2) of fraction $2, as run $1; sets `loss` (%) and
# `during` (the moves while the urgent client ran: whether its neighbours really swapped beside it),
# compares every output with alone (the beside ones only at FRACTION, where alone ran them).
beside() { # tag fraction [neighbours, default 2]
    local tag=$1 f=$2 n=${3:-2} pids=() i same=1 e0 r0 e1 r1
    for i in $(seq 1 "$n"); do client "$i" "$OUT/$tag$i.bin" "$OUT/$tag$i.json" --fraction "$f" & pids+=($!); done
    sleep 1   # the two have allocated (and, oversubscribed, started swapping)
    read -r e0 r0 <<<"$(moves_now)"
    urgent "$OUT/urgent-$tag.bin" "$OUT/urgent-$tag.json" || ok=0
    read -r e1 r1 <<<"$(moves_now)"
    during="$((e1 - e0)) evictions and $((r1 - r0)) restores while it ran"
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    if [ "$f" = "$FRACTION" ]; then
        for i in $(seq 1 "$n"); do cmp -s "$OUT/alone$i.bin" "$OUT/$tag$i.bin" || { ok=0 same=0; echo "$tag c$i's output differs from alone"; }; done
        # What the urgent client's priority cost them: their runs beside it against alone.
        local took="" alone_took=""
        for i in $(seq 1 "$n"); do
            took="$took${took:+, }$(seconds_of "$OUT/$tag$i.json" 2>/dev/null || echo "?")"
            alone_took="$alone_took${alone_took:+, }$(seconds_of "$OUT/alone$i.json" 2>/dev/null || echo "?")"
        done
        during="$during; the neighbours ran $took s (alone $alone_took s)"
    fi
    loss="" ub=$(seconds_of "$OUT/urgent-$tag.json") || return 1
    [ $same = 1 ] || return 1
    loss=$(python3 -c "print(f'{(1 - $ua / $ub) * 100:.1f}')")
    cmp -s "$OUT/urgent-alone.bin" "$OUT/urgent-$tag.bin" || { loss=""; echo "urgent-$tag: output differs from alone"; return 1; }
}
pool_threads() { grep -o 'host copies on [0-9]* threads' "$1" | head -1; }

echo "== an urgent client that fits, alone, then beside two clients that swap (a daemon with --swap-keep 0)"
start_daemon "$OUT/daemon-swapping.log" --swap-keep 0
urgent_verdict="-" urgent_measured="not measured" controls=""
if urgent "$OUT/urgent-alone.bin" "$OUT/urgent-alone.json" && ua=$(seconds_of "$OUT/urgent-alone.json"); then
    if beside beside "$FRACTION"; then
        urgent_measured="alone $ua s, beside two swapping $ub s: rate lost $loss % ($during; $(pool_threads "$OUT/daemon-swapping.log"))"
        urgent_verdict=$(verdict ge 10 "$loss")
    else
        urgent_measured="the urgent client failed or differed beside: $(tail -1 "$OUT/urgent-beside.json")" urgent_verdict=FAIL
    fi
    echo "urgent: $urgent_measured"
    if [ "$CONTROLS" = 1 ]; then
        echo "== control: the urgent client beside two clients of $CONTROL_FRACTION that fit (nothing swaps)"
        ev_before=$(grep -c "evicted [0-9]* bytes" "$OUT/daemon-swapping.log")
        beside fit "$CONTROL_FRACTION" && controls="beside two that fit and never swap: lost $loss %"
        ev_fit=$(($(grep -c "evicted [0-9]* bytes" "$OUT/daemon-swapping.log") - ev_before))
        controls="${controls:-beside two that fit: failed} ($ev_fit evictions meanwhile)"
        echo "control: $controls"
    fi
    if [ "$CONTROLS" = 1 ] || [ "$CONTROLS" = urgent ]; then
        # The swapping neighbours' kernels stride over FRACTION of the memory, the fit control's
        # over CONTROL_FRACTION: their blocks last longer. One neighbour of FRACTION fits and never
        # swaps: what sharing the GPU with such kernels costs the urgent client, swapping aside.
        echo "== control: the urgent client beside one client of $FRACTION (nothing swaps)"
        ev_before=$(grep -c "evicted [0-9]* bytes" "$OUT/daemon-swapping.log")
        t="beside one of $FRACTION that fits: failed"
        beside one "$FRACTION" 1 && t="beside one of $FRACTION that fits and never swaps: lost $loss %"
        t="$t ($(($(grep -c "evicted [0-9]* bytes" "$OUT/daemon-swapping.log") - ev_before)) evictions meanwhile)"
        controls="${controls:+$controls; }$t"
        echo "control: $t"
    fi
fi
kill -TERM "$daemon"; wait "$daemon" 2>/dev/null
# Moves' rates in a daemon log: "evictions R GB/s (N), restores R GB/s (N)" (restores of zeros left out).
rates_of() {
    awk '/evicted [0-9]+ bytes/ {for (i = 1; i <= NF; i++) { if ($i == "evicted") b = $(i + 1); if ($i == "copied") ms = $(i + 2) } n++; B += b; M += ms}
        /restored [0-9]+ bytes/ && !/as zeros/ {for (i = 1; i <= NF; i++) { if ($i == "restored") rb = $(i + 1); if ($i == "in") rms = $(i + 1) } rn++; RB += rb; RM += rms}
        END {printf "evictions %.2f GB/s (%d), restores %.2f GB/s (%d)", (M > 0 ? B / (M / 1000) / 1e9 : 0), n, (RM > 0 ? RB / (RM / 1000) / 1e9 : 0), rn}' "$1"
    printf ', %s' "$(straight "$1")"
}
# Bytes moved straight from or into pinned memory (the pinned host pool), of all moved: "S % of B GB straight".
straight() {
    awk '(/evicted [0-9]+ bytes/ || (/restored [0-9]+ bytes/ && !/as zeros/)) {p = 0; for (i = 1; i <= NF; i++) { if ($i == "evicted" || $i == "restored") b = $(i + 1); if ($i == "straight") p = $(i - 2) } B += b; S += b * p / 100}
        END {printf "%.0f %% of %.0f GB straight from pinned memory", (B > 0 ? 100 * S / B : 0), B / 1e9}' "$@"
}
# The urgent client beside two that swap, on a daemon (--swap-keep 0) with one more setting in its environment.
control_daemon() { # tag VAR value
    local tag=$1 var=$2 value=$3 t ok_goals=$ok
    echo "== control: beside two that swap, on a daemon with $var=$value"
    export "$var=$value"   # the daemon's device process inherits it
    start_daemon "$OUT/daemon-$tag.log" --swap-keep 0
    unset "$var"
    if beside "$tag" "$FRACTION"; then t="lost $loss %"; else t="FAILED (a client failed or its output differs)"; fi
    ok=$ok_goals   # a control's failure is its own line's, not the goals'
    kill -TERM "$daemon"; wait "$daemon" 2>/dev/null
    controls="$controls; beside two swapping with $var=$value ($(pool_threads "$OUT/daemon-$tag.log")): $t, $(rates_of "$OUT/daemon-$tag.log")"
    echo "control: $controls"
}
if [ "$CONTROLS" = 1 ] && [ -n "${ua:-}" ]; then
    control_daemon threads GPUMUX_SWAP_COPY_THREADS "$CONTROL_THREADS"
    control_daemon ring GPUMUX_SWAP_PINNED 0
fi
if { [ "$CONTROLS" = 1 ] || [ "$CONTROLS" = urgent ]; } && [ -n "${ua:-}" ]; then
    control_daemon paced GPUMUX_SWAP_PACE "${CONTROL_PACE:-46}"
fi

equal=PASS
for i in 1 2 3; do
    cmp -s "$OUT/alone$i.bin" "$OUT/shared$i.bin" || equal=FAIL
    [ -s "$OUT/shared$i.bin" ] || equal=FAIL
done
[ $ok = 1 ] || equal=FAIL
# The daemons' moves (both logs): "evicted N bytes at A: host memory in P ms, copied in C ms (R GB/s)" and
# "restored N bytes at A (memory created and mapped in M ms) in T ms (R GB/s)" (its device process logs them);
# a restore of a buffer born evicted ("... at A as zeros ...") is a memset, not a copy: left out of the rate.
read -r evictions ev_rate <<<"$(awk '/evicted [0-9]+ bytes/ {for (i = 1; i <= NF; i++) { if ($i == "evicted") b = $(i + 1); if ($i == "copied") ms = $(i + 2) } n++; B += b; M += ms}
    END {printf "%d %.2f\n", n, (M > 0 ? B / (M / 1000) / 1e9 : 0)}' "$OUT/daemon.log" "$OUT/daemon-swapping.log")"
read -r restores re_rate <<<"$(awk '/restored [0-9]+ bytes/ && !/as zeros/ {for (i = 1; i <= NF; i++) { if ($i == "restored") b = $(i + 1); if ($i == "in") ms = $(i + 1) } n++; B += b; M += ms}
    END {printf "%d %.2f\n", n, (M > 0 ? B / (M / 1000) / 1e9 : 0)}' "$OUT/daemon.log" "$OUT/daemon-swapping.log")"
# The pinned pool grown ahead of the moves (its device process logs each growth): "N growths,
# B GB at R GB/s, CPU C s on the mover's thread".
grown() {
    awk '/pinned host pool grown ahead by/ {for (i = 1; i <= NF; i++) { if ($i == "by") b = $(i + 1); if ($i == "in" && $(i + 2) == "ms") ms = $(i + 1); if ($i == "mover'"'"'s") c = $(i - 4) } n++; B += b; M += ms; C += c}
        END {printf "pool grown ahead %d times, %.1f GB at %.1f GB/s, CPU %.2f s on the mover'"'"'s thread", n, B / 1e9, (M > 0 ? B / (M / 1000) / 1e9 : 0), C}' "$@"
}
# Host memory found for evictions (a fresh copy's allocation), and device memory created and mapped for restores.
pinning=$(awk '/evicted [0-9]+ bytes/ {for (i = 1; i <= NF; i++) if ($i == "memory" && $(i + 1) == "in") ms = $(i + 2); M += ms} END {printf "%.0f", M}' "$OUT/daemon.log" "$OUT/daemon-swapping.log")
mapping=$(awk '/restored [0-9]+ bytes/ {for (i = 1; i <= NF; i++) if ($i == "mapped") ms = $(i + 2); M += ms} END {printf "%.0f", M}' "$OUT/daemon.log" "$OUT/daemon-swapping.log")
ratio=$(python3 -c "print(f'{$makespan / $alone_sum:.3f}')")
mk=$(verdict ge 1.15 "$ratio")
evp=$(verdict ge "$ev_rate" "$(python3 -c "print(0.8 * $native_d2h)")")
rep=$(verdict ge "$re_rate" "$(python3 -c "print(0.8 * $native_h2d)")")
[ "$evictions" -gt 0 ] || { evp="FAIL (no eviction)"; }

{
    echo
    echo "== goals (issue 39) on $(cut -d, -f1 "$OUT/gpu.txt"), build $(cat "$BIN/commit" 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F)$capped"
    echo "| goal | measured | verdict |"
    echo "|---|---|---|"
    echo "| 3 clients, each $FRACTION of the device memory handed out ($((mem_bytes >> 20)) MiB${DEVICE_MEMORY:+, capped}), kernels over all of it: outputs bitwise equal to alone | $equal | $equal |"
    echo "| makespan <= 1.15x the sum of alone times | $(printf %.2f "$makespan") s / $(printf %.2f "$alone_sum") s = ${ratio}x | $mk |"
    echo "| eviction throughput >= 80% of native pinned device-to-host | $ev_rate GB/s over $evictions evictions vs $native_d2h GB/s (host memory found besides: $pinning ms in all) | $evp |"
    echo "| restore throughput >= 80% of native pinned host-to-device | $re_rate GB/s over $restores restores vs $native_h2d GB/s (device memory created and mapped besides: $mapping ms in all) | $rep |"
    echo "| (not a goal) the moves above: pinned host pool | $(straight "$OUT/daemon.log" "$OUT/daemon-swapping.log"); $(grown "$OUT/daemon.log" "$OUT/daemon-swapping.log"); $(grep -h -o 'device memory unmapped and released after it, [0-9.]* ms' "$OUT/daemon.log" "$OUT/daemon-swapping.log" | awk '{M += $(NF - 1)} END {printf "evictions unmapped and released device memory in %.0f ms in all", M}') | - |"
    echo "| a high-priority client that fits loses <= 10% of its rate beside two swapping | $urgent_measured | $urgent_verdict |"
    [ -z "$controls" ] || echo "| (controls for the line above, not goals) | $controls | - |"
    echo "| (not a goal) pinning a host copy in place, $((copy_bytes >> 20)) MiB | ${register_line:-failed} | - |"
    echo "| nothing oversubscribed: existing benchmarks within noise | the on/off A/B: scripts/oversubscribe-cost-gpu.sh BIN OUT (part swap-cost) | - |"
} | tee "$OUT/goals.md"
[ "$equal" = PASS ] && [ "$mk" = PASS ] && [ "${evp%% *}" = PASS ] && [ "$rep" = PASS ] && [ "${urgent_verdict%% *}" != FAIL ]

#!/usr/bin/env bash
# The re-check after a change, in one device call: the named parts in turn, each under its own
# time limit, each part's whole output kept under OUTDIR and a short summary printed (the device
# tool brings back only the last lines and a few files, so the summary is what is read).
#
#   scripts/device-session.sh [-o OUTDIR] BIN_DIR PART...
#
# BIN_DIR: what scripts/device-build.sh makes (`--tests` for the `check` part's test binaries).
# OUTDIR:  default $OUT/session, else /tmp/session; PART's output in OUTDIR/PART.txt.
# PART, in the order given (a part may be given twice, e.g. with other variables between calls):
#   check      daemon-gpu-check.sh, gpu-check.sh's check phase, client_gpu and swap_gpu
#   programs   bench daemon --only programs (64 MiB copies): the chain, the stencil, the copies
#   stamps     programs with GPUMUX_STAMPS set (issue 35's stage stamps), then `gpumux stamps`: each
#              stage's pace per kernel of the chain (docs/program-speed.md, "Stage stamps")
#   syncs      bench daemon --only overhead --rate-clients 1 with GPUMUX_STAMPS set, then `gpumux stamps
#              --syncs`: a launch + sync stage by stage, back to back and 2 ms apart (issue 35;
#              docs/daemon.md, "Where a launch + sync's time goes"); SYNCS_ARGS adds bench arguments
#              (not --daemon-args=--device-in-process: the bench's own in-process daemon then fails)
#   copy-beside bench daemon --only copy-beside: the chain alone and beside a client copying 1 GiB
#   overhead   bench daemon --only overhead --rate-clients 1,8
#   priority   bench daemon --only priority (the default configuration only)
#   corun      bench daemon --only corun (the default configuration only)
#   hostile    bench daemon --hostile, 15 s phases
#   multi      multi-gpu-daemon-check.sh (2 GPUs or more)
#   rebalance  multi-gpu-daemon-check.sh's client move (2 GPUs or more)
#   multi-stp  bench daemon --device cuda:0,1 --only multi-gpu (2 GPUs or more)
#   split      split-gpu-check.sh (2 GPUs or more)
#   swap       oversubscribe-gpu.sh, CONTROLS=0 ROUNDS=2 unless set
#   swap-cost  oversubscribe-cost-gpu.sh: oversubscription on against off (alloc cost, overhead,
#              programs), alternating, ROUNDS=4 unless set
#   rt         rt-run-gpu.sh, RT_SECONDS=4 unless set (2 GPUs or more)
#   replay     replay-gpu.sh
# LIMIT_<part> (seconds) overrides a part's time limit; variables such as GPUMUX_* pass through
# to the daemons. Exit status: 0 if every part passed.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp}/session
[ "${1:-}" = -o ] && { out=$2; shift 2; }
[ $# -ge 2 ] || { sed -n '2,30p' "$0" >&2; exit 2; }
bin=$(realpath -m "$1"); shift
mkdir -p "$out"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
status=0
t_start=$(date +%s)

# run PART LIMIT COMMAND...: the command's output into OUTDIR/PART.txt, its status and time.
run() {
    local part=$1 limit=$2; shift 2
    local var=LIMIT_${part//-/_}
    limit=${!var:-$limit}
    local t0 rc
    t0=$(date +%s)
    timeout "$limit" "$@" >"$out/$part.txt" 2>&1
    rc=$?
    echo "### $part: rc $rc, $(( $(date +%s) - t0 )) s$([ $rc -eq 124 ] && echo " (over its limit of $limit s)")"
    [ $rc -ne 0 ] && status=1
    return $rc
}
bench_rows() { grep -E "$1" "$2" 2>/dev/null | grep -v '^\[' | cut -c1-160; }
# a bench's tables (its first line names the device; notes follow the tables)
bench_table() { grep -v -E '^\[|^$' "$1" 2>/dev/null | grep -v '^note:' | cut -c1-160 | head -"$2"; }
needs_two() { [ "$gpus" -ge 2 ] || { echo "### $1: skipped, $gpus GPU(s) here (needs 2)"; return 1; }; }

for part in "$@"; do
    case $part in
        check)
            run check-daemon 300 "$root/scripts/daemon-gpu-check.sh" "$bin" "$out/daemon-check"
            grep -E "^(PASS|FAIL)" "$out/check-daemon.txt" | awk '!seen[$0]++' | cut -c1-200   # its summary repeats them
            GPUMUX_PHASES=check run check-cuda 120 "$root/scripts/gpu-check.sh" "$bin/gpumux-cuda-check" "$out/gpu-check"
            grep -E "exactly-once|gpu-check: (PASS|FAIL)|MISMATCH" "$out/check-cuda.txt" | tail -3
            run check-tests 240 "$root/scripts/cuda-device-tests.sh" "$bin/tests/client_gpu" "$bin/tests/swap_gpu"
            grep -E "^=== [a-z_]+:|FAILED|panicked" "$out/check-tests.txt" | cut -c1-200 | tail -8 ;;
        programs)
            run programs 150 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/programs" -- --only programs --program-copy-mib 64
            bench_rows '^(chain|stencil|copy)' "$out/programs/bench-daemon.txt" ;;
        stamps)
            sdir=$out/stamps-dir; rm -rf "$sdir"; mkdir -p "$sdir"
            GPUMUX_STAMPS=$sdir run stamps 180 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/stamps" -- --only programs --program-copy-mib 64
            bench_rows '^(chain|stencil|copy)' "$out/stamps/bench-daemon.txt"
            "$bin/gpumux" stamps "$sdir" --min-run 400 > "$out/stamps-report.txt" 2>&1 || status=1
            cut -c1-220 "$out/stamps-report.txt"
            # The raw stamps, compressed (the device tool brings back only small files).
            tar czf "$out/stamps-raw.tgz" -C "$sdir" . && rm -rf "$sdir" ;;
        copy-beside)
            run copy-beside 240 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/copy-beside" -- --only copy-beside
            grep -E '^(chain|copy-beside): |FAILED' "$out/copy-beside/bench-daemon.txt" | cut -c1-200 ;;
        syncs)
            sdir=$out/syncs-dir; rm -rf "$sdir"; mkdir -p "$sdir"
            # shellcheck disable=SC2086 # SYNCS_ARGS is a list of arguments
            GPUMUX_STAMPS=$sdir run syncs 120 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/syncs" -- \
                --only overhead --rate-clients 1 --rate-launches 2000 ${SYNCS_ARGS:-}
            bench_rows '^(native|gpumuxd|added)[ ,]' "$out/syncs/bench-daemon.txt"
            "$bin/gpumux" stamps "$sdir" --syncs > "$out/syncs-report.txt" 2>&1 || status=1
            cut -c1-200 "$out/syncs-report.txt"
            tar czf "$out/syncs-raw.tgz" -C "$sdir" . && rm -rf "$sdir" ;;
        overhead)
            run overhead 240 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/overhead" -- --only overhead --rate-clients 1,8
            bench_table "$out/overhead/bench-daemon.txt" 24 ;;
        priority)
            run priority 300 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/priority" -- --only priority --priority-policies ""
            bench_table "$out/priority/bench-daemon.txt" 24 ;;
        corun)
            run corun 300 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/corun" -- --only corun --corun-policies ""
            bench_table "$out/corun/bench-daemon.txt" 20 ;;
        hostile)
            run hostile 120 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/hostile" -- --hostile --hostile-seconds 15 --device cuda:0
            tail -20 "$out/hostile/bench-daemon.txt" | cut -c1-200 ;;
        multi)
            needs_two multi || continue
            run multi 300 "$root/scripts/multi-gpu-daemon-check.sh" "$bin" "$out/multi-check"
            sed -n '/^== summary/,$p' "$out/multi.txt" | cut -c1-200 | head -20 ;;
        rebalance)
            needs_two rebalance || continue
            MULTI_ONLY=rebalance run rebalance 120 "$root/scripts/multi-gpu-daemon-check.sh" "$bin" "$out/rebalance-check"
            sed -n '/^== summary/,$p' "$out/rebalance.txt" | cut -c1-200 ;;
        multi-stp)
            needs_two multi-stp || continue
            run multi-stp 300 "$root/scripts/bench-daemon-gpu.sh" "$bin" "$out/multi-stp" -- --device cuda:0,1 --only multi-gpu
            tail -20 "$out/multi-stp/bench-daemon.txt" | cut -c1-200 ;;
        split)
            needs_two split || continue
            run split 300 "$root/scripts/split-gpu-check.sh" "$bin" "$out/split-check"
            sed -n '/^=== summary/,$p' "$out/split.txt" | cut -c1-200 | head -25 ;;
        swap)
            CONTROLS=${CONTROLS:-0} ROUNDS=${ROUNDS:-2} run swap 500 "$root/scripts/oversubscribe-gpu.sh" "$bin" "$out/swap-check"
            tail -20 "$out/swap.txt" | cut -c1-200 ;;
        swap-cost)
            ROUNDS=${ROUNDS:-4} run swap-cost 420 "$root/scripts/oversubscribe-cost-gpu.sh" "$bin" "$out/swap-cost"
            grep -E '^run [0-9]|MISMATCH|failed|did not start|^bench \(' "$out/swap-cost.txt" | cut -c1-160
            sed -n '/^oversubscription on against off/,$p' "$out/swap-cost.txt" | cut -c1-160 ;;
        rt)
            needs_two rt || continue
            RT_SECONDS=${RT_SECONDS:-4} run rt 300 "$root/scripts/rt-run-gpu.sh" "$bin" "$out/rt-check"
            tail -30 "$out/rt.txt" | cut -c1-200 ;;
        replay)
            run replay 300 "$root/scripts/replay-gpu.sh" "$bin" "$out/replay-check"
            sed -n '/^== summary/,$p' "$out/replay.txt" | cut -c1-200 | head -25 ;;
        *)
            echo "### $part: no such part (see the header of $0)"; status=1 ;;
    esac
done
echo "### device-session: status $status, $(( $(date +%s) - t_start )) s, $gpus GPU(s), parts: $*"
exit $status

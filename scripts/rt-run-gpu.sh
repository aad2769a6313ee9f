#!/usr/bin/env bash
# GPU-SPARC task sets run for real through one gpumuxd on 2 GPUs (issue 38 item 4;
# docs/rt.md, "Running a task set for real (`gpumux rt run`)").
#
#   scripts/rt-run-gpu.sh [BIN_DIR] [OUTDIR]
#
# BIN_DIR: what scripts/device-build.sh makes (default target/device/main; $BIN also works);
#          `gpumux rt run` there starts `gpumux daemon --device $RT_DEVICE` itself (its device
#          processes are the gpumuxd beside it).
# OUTDIR:  each run's table and JSON (default $OUT/rt-run, else /tmp/rt-run).
# RT_SECONDS: seconds of releases per run (default 15); RT_DEVICE (default cuda:0,1).
# Runs, each a `gpumux rt run ... --json`:
#   * examples/rt/table4-chunked.toml and table4.toml (the paper's Table IV set, our stage
#     estimates) at --unit-ms 0.1 (periods 20 / 50 / 90 ms: the same analysis, ten times the
#     jobs), under single, local and gema (the paper's Single-GPU, LOCAL and GEMA);
#   * examples/rt/gema-vs-local.toml at --unit-ms 0.5, under local and gema: a set GEMA
#     schedules and LOCAL does not;
#   * examples/rt/small-sim.toml (the CI set) under gema and local;
#   * table4-chunked.toml under single with --dispatch partitioned (the paper's prototype's
#     Single-GPU runs: each task's kernels on one GPU of its own), beside the global bounds.
# Prints each run's measured-versus-bound table, then a summary: per run the analysis's verdict,
# the tasks it bounds within their bound, the violations and WCET overruns, the deadline misses;
# and the gain of GEMA over LOCAL: sets schedulable by analysis, and tasks with no miss measured.
# Exits non-zero if a run failed to run or any task the analysis bounds went over its bound
# (VIOLATION or WCET overrun): issue 38's goal is 0 such tasks.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
BIN=$(realpath -m "${1:-${BIN:-$root/target/device/main}}")
OUT=$(realpath -m "${2:-${OUT:-/tmp}/rt-run}")
SECONDS_EACH=${RT_SECONDS:-15}
DEVICE=${RT_DEVICE:-cuda:0,1}
cd "$root"
[ -x "$BIN/gpumux" ] && [ -x "$BIN/gpumuxd" ] || { echo "rt-run-gpu: no gpumux/gpumuxd in $BIN (scripts/device-build.sh makes them)" >&2; exit 2; }
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
source "$root/scripts/nvrtc-path.sh"
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
ngpus=$(grep -c . "$OUT/gpu.txt")
[ "$ngpus" -ge 2 ] || { echo "rt-run-gpu: $ngpus GPU(s) here; it needs 2" >&2; exit 2; }
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' | tee "$OUT/commit.txt"

fails=0
# name file unit methods... (RUN_ARGS: more arguments of these runs)
RUN_ARGS=()
run_set() {
    local name=$1 file=$2 unit=$3; shift 3
    for m in "$@"; do
        echo
        echo "== $name, $m ($file, 1 unit = $unit ms, $SECONDS_EACH s${RUN_ARGS[*]:+, ${RUN_ARGS[*]}})"
        "$BIN/gpumux" rt run "$file" --method "$m" --device "$DEVICE" --seconds "$SECONDS_EACH" \
            --unit-ms "$unit" "${RUN_ARGS[@]}" --json "$OUT/$name-$m.json" 2>"$OUT/$name-$m.err" | tee "$OUT/$name-$m.txt"
        rc=${PIPESTATUS[0]}
        if [ ! -s "$OUT/$name-$m.json" ]; then
            echo "FAIL $name/$m did not run: $(tail -3 "$OUT/$name-$m.err")"
            fails=$((fails + 1))
        elif [ "$rc" -ne 0 ]; then
            echo "FAIL $name/$m: a task went over its bound (see above; $(tail -1 "$OUT/$name-$m.err"))"
            fails=$((fails + 1))
        fi
    done
}
run_set table4-chunked examples/rt/table4-chunked.toml 0.1 single local gema
run_set table4 examples/rt/table4.toml 0.1 local gema
run_set gema-vs-local examples/rt/gema-vs-local.toml 0.5 local gema
run_set small examples/rt/small-sim.toml 1 gema local
# The paper's prototype ran Single-GPU mode partitioned (P2 and P3 on one GPU, P1 on the other):
# its Table IV verdicts, beside the global analysis's bounds (a reference only: not its model).
RUN_ARGS=(--dispatch partitioned)
run_set table4-chunked-partitioned examples/rt/table4-chunked.toml 0.1 single
RUN_ARGS=()

echo
echo "== summary ($DEVICE, $SECONDS_EACH s a run)"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, sys
out = sys.argv[1]
runs = {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    r = json.load(open(f))
    runs[os.path.basename(f)[:-5]] = r
print(f"{'run':<26} {'analysis':<15} {'bounded ok':>10} {'violations':>10} {'overruns':>8} {'misses':>7} {'jobs':>6}  worst/R of bounded tasks")
for name, r in runs.items():
    bounded = [t for t in r["tasks"] if t["verdict"]["verdict"] != "not_checked"]
    ok = sum(t["verdict"]["verdict"] == "within_bound" for t in bounded)
    ratios = " ".join(f"{t['name']}:{t['worst_ms'] / t['bound_ms']:.2f}" for t in bounded if t["worst_ms"] and t["bound_ms"])
    print(f"{name:<26} {'schedulable' if r['schedulable_by_analysis'] else 'not schedulable':<15} "
          f"{ok:>4} of {len(bounded):<3} {r['violations']:>10} {r['overruns']:>8} {r['misses']:>7} "
          f"{sum(t['jobs'] for t in r['tasks']):>6}  {ratios}")
print()
print("where the time went (tasks over their bound or whose subtasks overran by 1 ms a job or more):")
for name, r in runs.items():
    for t in r["tasks"]:
        if t["verdict"]["verdict"] in ("violation", "overrun") or t.get("overrun_ms", 0) >= 1.0:
            subs = t.get("subtasks") or []
            slow = [f"{j + 1}:{s['resource']} held {s['held_over_stated']:.1f}xC, worst {s['worst_ms']:.2f} ms (C {s['stated_ms']:.2f}, w {s['w_ms']:.2f})"
                    for j, s in enumerate(subs) if s["held_over_stated"] > 1.1 or s["worst_ms"] > s["w_ms"]]
            print(f"  {name}/{t['name']} ({t['mode']}, over {t['overrun_ms']:.2f} ms a job, kernels per GPU {t.get('launches_per_gpu')}): "
                  + ("; ".join(slow) if slow else ("no subtask over 1.1x C or over its w" if subs else "no per-subtask data")))
print()
print("GEMA over LOCAL (issue 38: the schedulability GEMA gains, on real runs):")
for s in sorted({n.rsplit('-', 1)[0] for n in runs}):
    g, l = runs.get(f"{s}-gema"), runs.get(f"{s}-local")
    if not g or not l:
        continue
    met = lambda r: sum(t["misses"] == 0 for t in r["tasks"])
    print(f"  {s:<16} analysis: gema {'schedulable' if g['schedulable_by_analysis'] else 'not'}, local "
          f"{'schedulable' if l['schedulable_by_analysis'] else 'not'}; measured: tasks with no miss "
          f"gema {met(g)} of {len(g['tasks'])}, local {met(l)} of {len(l['tasks'])}; misses gema {g['misses']}, local {l['misses']}")
PY
if [ "$fails" -eq 0 ]; then
    echo "PASS every task the analysis bounds stayed within its bound in every run"
else
    echo "FAIL $fails run(s) failed or went over a bound (above)"
fi
exit $((fails > 0))

#!/usr/bin/env python3
"""The pipeline check's times (daemon-gpu-check.sh, check 5): pools every timed repetition of
every run of each side and compares the medians.

    pipeline-times.py --limit 1.10 --native N1.log N2.log ... --daemon D1.log D2.log ...

Each log is one run of native_lcg.py pipeline (--native) or of stream_pipeline (--daemon), in
the order the runs were made; both print `pipeline_reps_ms=a,b,...` (and copies_, kernels_):
every timed repetition in ms. Run i of one side is paired with run i of the other, made next to
it. Prints, per pair, each run's median and minimum and their ratio (one such ratio is what the
check compared up to fe4d877), then the pooled figures. The check passes when the daemon's
pooled median is within LIMIT x the native pooled median, and below the daemon's own copies
alone plus kernels alone (pooled medians: the stages overlap). The last line says so in words,
ratio first, for the check's PASS/FAIL line. Exit status 0 pass, 1 fail, 2 a log without its
figures (or runs that do not pair).
"""
import argparse
import re
import statistics
import sys


def die(words):
    """A log without its figures, or runs that do not pair: status 2, not a failed comparison."""
    print(f"pipeline: {words}")
    sys.exit(2)


def reps(path, key):
    """The `{key}_reps_ms` list of a log, as floats."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        die(f"{path}: {e}")
    m = re.search(rf"\b{key}_reps_ms=([0-9.,]+)", text)
    if not m:
        die(f"no {key}_reps_ms in {path} (its end: {text.strip()[-300:]!r})")
    try:
        return [float(x) for x in m.group(1).split(",")]
    except ValueError:
        die(f"{path}: {key}_reps_ms={m.group(1)} is not a list of numbers")


def pooled(paths, key):
    return [x for p in paths for x in reps(p, key)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=float, required=True, help="the daemon's median over the native median, at most")
    ap.add_argument("--native", nargs="+", required=True)
    ap.add_argument("--daemon", nargs="+", required=True)
    a = ap.parse_args()
    if len(a.native) != len(a.daemon):
        die(f"{len(a.native)} native runs against {len(a.daemon)} daemon runs")

    print("pipeline times in ms, median / min of each run's repetitions:")
    for i, (n, d) in enumerate(zip(a.native, a.daemon), 1):
        nr, dr = reps(n, "pipeline"), reps(d, "pipeline")
        nm, dm = statistics.median(nr), statistics.median(dr)
        print(f"  run {i}: native {nm:.3f} / {min(nr):.3f}, daemon {dm:.3f} / {min(dr):.3f}: {dm / nm:.3f}x")
    n, d = pooled(a.native, "pipeline"), pooled(a.daemon, "pipeline")
    nm, dm = statistics.median(n), statistics.median(d)
    ratio = dm / nm
    print(
        f"  pooled: native {nm:.3f} / {min(n):.3f} ({len(n)} repetitions), daemon {dm:.3f} / {min(d):.3f} "
        f"({len(d)}): medians {ratio:.3f}x (limit {a.limit:.2f}x), minimums {min(d) / min(n):.3f}x"
    )
    c, k = statistics.median(pooled(a.daemon, "copies")), statistics.median(pooled(a.daemon, "kernels"))
    print(f"  daemon: copies alone {c:.3f}, kernels alone {k:.3f} (pooled medians), their sum {c + k:.3f}")

    within, overlap = dm <= a.limit * nm, dm < c + k
    runs = f"{len(a.daemon)} run{'s' if len(a.daemon) > 1 else ''}"
    words = (
        f"{ratio:.3f}x (limit {a.limit:.2f}x): {dm:.3f} ms against {nm:.3f} natively, medians of {len(d)} and "
        f"{len(n)} repetitions over {runs} a side (fastest {min(d):.3f} against {min(n):.3f}); "
        f"{'below' if overlap else 'NOT below'} copies {c:.3f} + kernels {k:.3f} ms "
        f"({'overlap' if overlap else 'no overlap'})"
    )
    print(f"pipeline: {words}")
    sys.exit(0 if within and overlap else 1)


if __name__ == "__main__":
    main()

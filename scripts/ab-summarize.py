#!/usr/bin/env python3
"""Summarizes an A/B of two gpumux builds from `gpumux bench daemon` JSON reports.

    ab-summarize.py RUN_DIR...   (each RUN_DIR/bench-daemon.json, RUN_DIR/build holds the build's name)

Per figure of the overhead experiment (launches/s per client count, the daemon's launch + sync
p50 and p99, and the added p50 where there is a native reference) and of the priority experiment
(for each block time, the first gpumux setting's urgent p50 and p99 and the low-priority client's
rate against the urgent kernels interleaved natively), prints each build's values
in run order, their mean and median, and in how many of the pairs (the i-th run of one build
with the i-th of the other, run next to each other) the second build did better. Runs of one
instance vary by +-20% (docs/benchmarks.md, "Reading the figures"): read the pairs won, not one mean.
"""
import json
import statistics
import sys
from pathlib import Path


def figures(report):
    """Figure name -> (value, higher_is_better) of one report."""
    o = report.get("overhead") or {}
    out = {}
    for k, rate in o.get("daemon_launches_per_s") or []:
        out[f"launches/s, {k} client(s)"] = (rate, True)
    for key, name in [("daemon_p50_us", "launch + sync p50 µs"), ("daemon_p99_us", "launch + sync p99 µs"),
                      ("added_p50_us", "added p50 µs")]:
        if o.get(key) is not None:
            out[name] = (o[key], False)
    # The daemon's rows of the priority experiment: the first gpumux setting per block time
    # (the configuration asked for with --policy; the baselines are the same processes in both).
    seen = set()
    for row in report.get("priority") or []:
        b, setting = row.get("block_us"), row.get("setting", "")
        if not setting.startswith("gpumux") or b in seen:
            continue
        seen.add(b)
        out[f"urgent p50 µs, {b} µs blocks"] = (row["hp_p50_us"], False)
        out[f"urgent p99 µs, {b} µs blocks"] = (row["hp_p99_us"], False)
        if row.get("lp_vs_streams") is not None:
            out[f"LP rate vs streams, {b} µs blocks"] = (row["lp_vs_streams"], True)
    return out


def main(dirs):
    runs = []
    for d in dirs:
        d = Path(d)
        try:
            build = (d / "build").read_text().strip()
            report = json.loads((d / "bench-daemon.json").read_text())
        except (OSError, ValueError) as e:
            print(f"{d}: no report ({e})")
            continue
        runs.append((build, figures(report)))
    builds = list(dict.fromkeys(b for b, _ in runs))
    if len(builds) != 2:
        print(f"expected two builds, found {builds}")
        return 1
    a, b = builds
    names = list(dict.fromkeys(n for _, f in runs for n in f))
    print(f"A = {a}, B = {b}; {sum(1 for x, _ in runs if x == a)} and {sum(1 for x, _ in runs if x == b)} runs")
    for n in names:
        va = [f[n][0] for x, f in runs if x == a and n in f]
        vb = [f[n][0] for x, f in runs if x == b and n in f]
        higher = next(f[n][1] for _, f in runs if n in f)
        pairs = list(zip(va, vb))
        won = sum(1 for x, y in pairs if (y > x if higher else y < x))
        def fmt(v, higher=higher):
            # Ratios (the LP's rate) with three decimals; rates as integers; µs with one.
            return f"{v:.3f}" if abs(v) < 10 else (f"{v:,.0f}" if higher else f"{v:.1f}")
        print(f"\n{n} ({'higher' if higher else 'lower'} is better)")
        for label, v in [(a, va), (b, vb)]:
            if v:
                print(f"  {label:>12}: {' / '.join(fmt(x) for x in v)}  mean {fmt(statistics.mean(v))}, "
                      f"median {fmt(statistics.median(v))}")
        if pairs:
            print(f"  {b} better in {won} of {len(pairs)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

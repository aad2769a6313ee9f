#!/usr/bin/env python3
"""The table of scripts/oversubscribe-cost-gpu.sh: the daemon with oversubscription on against off.

    oversubscribe-cost-summary.py RUN_DIR...

Each RUN_DIR holds `build` (`on` or `off`), and `alloc.json` (the `oversubscribe --alloc-cost`
client's lines) and/or `bench-daemon.json` (`gpumux bench daemon`). Per figure: each arm's values in
run order, their means, off / on (the ratio of the means), and whether the two arms' ranges overlap
("within noise": no value of one arm lies beyond every value of the other). The native rows of the
bench, a pure-CPU loop timed before each bench run and the device process's pure-CPU steps (from
the daemons' logs) are printed too: they say how much the machine itself drifted between runs.
"""
import json
import re
import statistics
import sys
from pathlib import Path


def bench_figures(report, failed):
    """Figure name -> (value, higher_is_better) of one `gpumux bench daemon` report; programs whose
    output differed from their reference go to `failed`."""
    out = {}
    o = report.get("overhead") or {}
    for key, name in [("daemon_p50_us", "launch + sync p50 µs"), ("daemon_p99_us", "launch + sync p99 µs"),
                      ("native_p50_us", "native launch + sync p50 µs (drift)")]:
        if o.get(key) is not None:
            out[name] = (o[key], False)
    for row in o.get("idle") or []:
        if row["setting"].startswith("gpumuxd"):
            out[f"{row['setting']}: p50 µs"] = (row["p50_us"], False)
            out[f"{row['setting']}: p99 µs"] = (row["p99_us"], False)
    for k, rate in o.get("daemon_launches_per_s") or []:
        out[f"launches/s, {k} client(s)"] = (rate, True)
    for setting, k, rate in o.get("breakdown_rates") or []:
        out[f"launches/s, {k} clients, {setting}"] = (rate, True)
    for row in o.get("breakdown") or []:
        out[f"launch + sync p50 µs, {row['setting']}"] = (row["p50_us"], False)
    for row in report.get("programs") or []:
        name = row["program"] if row["setting"] != "native" else f"{row['program']}, native (drift)"
        out[f"{name}: median ms"] = (row["median_ms"], False)
        check = row.get("check") or {}
        if check.get("status") == "failed":
            failed.append(f"{name}: {check.get('detail')}")
    return out


# The device process's load line and the CUDA device's launch line (docs/daemon.md, "Where the
# core's and the device process's time goes"): what each step took per call.
DEVICE_STEPS = [
    (re.compile(r"device process: busy .*?(\d+) launch commands: [\d.]+%, ([\d.]+) µs each"), "launch command µs"),
    (re.compile(r"device process: busy .*? binds: [\d.]+%, ([\d.]+) µs each"), "bind µs"),
    (re.compile(r"device process: busy .*? unbinds: [\d.]+%, ([\d.]+) µs each"), "unbind µs (pure CPU, drift)"),
    (re.compile(r"CUDA device: \d+ launch commands, mean µs each: [\d.]+ in all, ([\d.]+) getting a stream"),
     "getting a stream µs (pure CPU, drift)"),
]


def log_figures(logs):
    """Figure name -> (value, False) of the device process's steps, from the daemons' logs (one
    per configuration of the bench: `gpumux_<configuration>.log`)."""
    out = {}
    for log in sorted(logs):
        config = log.stem.removeprefix("gpumux_").replace("__", ", ").replace("_", " ")
        text = log.read_text(errors="replace")
        for pattern, name in DEVICE_STEPS:
            found = pattern.findall(text)
            if found:
                value = found[-1][-1] if isinstance(found[-1], tuple) else found[-1]
                out[f"device process, {config}: {name}"] = (float(value), False)
    return out


def alloc_figures(lines):
    """Figure name -> (value, False) of the `--alloc-cost` client's JSON lines."""
    out = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        mib = r["alloc_cost_mib"]
        for call in ("alloc", "free"):
            for stat in ("p50", "p99", "mean"):
                out[f"{call} {mib} MiB, {stat} µs"] = (r[f"{call}_{stat}_us"], False)
    return out


def main(dirs):
    runs, failed = [], []
    for d in map(Path, dirs):
        try:
            arm = (d / "build").read_text().strip()
        except OSError as e:
            print(f"{d}: no arm ({e})")
            continue
        figs = {}
        try:
            figs.update(alloc_figures((d / "alloc.json").read_text().splitlines()))
        except (OSError, ValueError, KeyError) as e:
            if (d / "alloc.json").exists():
                print(f"{d}: unreadable alloc.json ({e})")
        try:
            figs.update(bench_figures(json.loads((d / "bench-daemon.json").read_text()), failed))
        except OSError:
            pass
        except (ValueError, KeyError) as e:
            print(f"{d}: unreadable bench-daemon.json ({e})")
        try:
            figs["host CPUs busy % in the 3 s after the alloc part"] = (float((d / "after-busy.txt").read_text()), False)
        except (OSError, ValueError):
            pass
        try:
            figs["host CPU loop ms (drift)"] = (float((d / "cpu-probe.txt").read_text()), False)
        except (OSError, ValueError):
            pass
        figs.update(log_figures((d / "logs").glob("gpumux_*.log")))
        if not figs:
            print(f"{d}: nothing measured")
        runs.append((arm, figs))
    arms = ["on", "off"]
    names = list(dict.fromkeys(n for _, f in runs for n in f))
    print(f"\noversubscription on against off: {sum(a == 'on' for a, _ in runs)} and "
          f"{sum(a == 'off' for a, _ in runs)} runs, alternating")
    fmt = lambda v: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"
    width = max([len(n) for n in names] + [10])
    print(f"{'figure':<{width}} | {'on (run order)':<24} | {'off (run order)':<24} | {'mean on':>9} | "
          f"{'mean off':>9} | off / on | within noise")
    apart = 0
    for n in names:
        vals = {a: [f[n][0] for x, f in runs if x == a and n in f] for a in arms}
        if not vals["on"] or not vals["off"]:
            print(f"{n:<{width}} | {' / '.join(map(fmt, vals['on'])):<24} | "
                  f"{' / '.join(map(fmt, vals['off'])):<24} | one arm has no value")
            continue
        on, off = statistics.mean(vals["on"]), statistics.mean(vals["off"])
        ratio = off / on if on else float("nan")
        overlap = min(vals["on"]) <= max(vals["off"]) and min(vals["off"]) <= max(vals["on"])
        apart += not overlap and "drift" not in n
        print(f"{n:<{width}} | {' / '.join(map(fmt, vals['on'])):<24} | {' / '.join(map(fmt, vals['off'])):<24} | "
              f"{fmt(on):>9} | {fmt(off):>9} | {ratio:8.3f} | {'yes' if overlap else 'NO'}")
    print(f"\n{apart} figure(s) whose arms do not overlap (drift rows aside); "
          "lower is better except launches/s")
    for f in failed:
        print(f"OUTPUT DIFFERED: {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

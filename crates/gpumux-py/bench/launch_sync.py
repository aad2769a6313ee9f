"""The Python client's launch + sync against the Rust client's (issue 41's
goal: at most 3 µs more at the p50), one empty kernel at a time, against
one daemon.

    # on the simulated device, a daemon started here:
    python crates/gpumux-py/bench/launch_sync.py --gpumuxd target/release/gpumuxd \
        --rust-bench target/release/examples/launch_bench
    # against a running daemon (a GPU's):
    python crates/gpumux-py/bench/launch_sync.py --socket /tmp/g.sock --rust-bench BIN/launch_bench

The Rust side is crates/gpumux-client/examples/launch_bench.rs. The two run
in turns (Rust, Python, Rust, Python, ...: `--rounds`), so a drift of the
machine shows in both; the p50 of each is the median of the rounds' p50s,
and the difference the median of the rounds' differences (each round's
Python p50 minus the Rust p50 just before it: a drift between rounds, which
moved one round's Python p50 below Rust's on the H200, cancels). Each side
also reports its own cost of a launch with no wait (`launch_us`), the client
side alone. Prints a line per round and one JSON line last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from typing import Iterator, List, Optional

import gpumux

EMPTY = 'extern "C" __global__ void empty() {}'
#: Launches timed together for `launch_us` (as launch_bench.rs).
BATCH = 500


def percentile(sorted_us: List[float], p: float) -> float:
    """As launch_bench.rs: the sample at round((n - 1) * p)."""
    return sorted_us[round((len(sorted_us) - 1) * p)]


def python_round(socket: str, n: int, warmup: int, block_ns: int) -> dict:
    with gpumux.connect(socket, name="launch_bench (python)") as c:
        k = c.compile(EMPTY).kernel("empty")
        k.sim_block_ns = block_ns
        sync = c.synchronize
        clock = time.perf_counter_ns
        us = []
        for i in range(warmup + n):
            t0 = clock()
            k(1, 1, ())
            sync()
            if i >= warmup:
                us.append((clock() - t0) / 1e3)
        # The client's own cost of a launch, as launch_bench.rs's `launch_us`:
        # batches of BATCH launches with no wait, each batch then synced.
        batches = []
        for _ in range(-(-n // BATCH)):
            t0 = clock()
            for _ in range(BATCH):
                k(1, 1, ())
            batches.append((clock() - t0) / 1e3 / BATCH)
            sync()
    us.sort()
    batches.sort()
    return {"client": "python", "n": n, "p50_us": percentile(us, 0.5), "p90_us": percentile(us, 0.9),
            "p99_us": percentile(us, 0.99), "launch_us": batches[len(batches) // 2]}


def rust_round(exe: str, socket: str, n: int, warmup: int, block_ns: int) -> dict:
    out = subprocess.run([exe, "--socket", socket, "--n", str(n), "--warmup", str(warmup),
                          "--sim-block-ns", str(block_ns)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


@contextlib.contextmanager
def daemon_socket(args: argparse.Namespace) -> Iterator[str]:
    if args.socket:
        yield args.socket
    else:
        with gpumux.sim.daemon(args.device, binary=args.gpumuxd) as d:
            yield d.socket


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--socket", help="a running daemon's socket (else one is started on --device)")
    p.add_argument("--device", default="sim:h100")
    p.add_argument("--gpumuxd", help="the daemon binary to start (else $GPUMUXD or PATH)")
    p.add_argument("--rust-bench", required=True, help="the launch_bench example binary")
    p.add_argument("--n", type=int, default=3000, help="timed launches per round")
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sim-block-ns", type=int, default=1000)
    p.add_argument("--goal-us", type=float, default=3.0, help="exit 1 if Python's p50 is more above Rust's")
    args = p.parse_args(argv)
    rust: List[dict] = []
    py: List[dict] = []
    with daemon_socket(args) as socket:
        for r in range(args.rounds):
            rust.append(rust_round(args.rust_bench, socket, args.n, args.warmup, args.sim_block_ns))
            py.append(python_round(socket, args.n, args.warmup, args.sim_block_ns))
            print(f"round {r + 1}: p50 rust {rust[-1]['p50_us']:.2f} µs, python {py[-1]['p50_us']:.2f} µs; "
                  f"p99 rust {rust[-1]['p99_us']:.2f}, python {py[-1]['p99_us']:.2f}; launch alone "
                  f"rust {rust[-1].get('launch_us', float('nan')):.3f}, python {py[-1]['launch_us']:.3f}",
                  file=sys.stderr)
        with gpumux.connect(socket) as c:
            device = c.device
    rust_p50 = statistics.median(x["p50_us"] for x in rust)
    py_p50 = statistics.median(x["p50_us"] for x in py)
    diff = statistics.median(p["p50_us"] - r["p50_us"] for r, p in zip(rust, py))
    # The client side alone (no daemon in it): where a difference comes from.
    rust_launch = statistics.median(x.get("launch_us", float("nan")) for x in rust)
    py_launch = statistics.median(x["launch_us"] for x in py)
    print(json.dumps({"device": device, "n": args.n, "rounds": args.rounds, "rust_p50_us": round(rust_p50, 2),
                      "python_p50_us": round(py_p50, 2), "python_minus_rust_p50_us": round(diff, 2),
                      "rust_launch_us": round(rust_launch, 3), "python_launch_us": round(py_launch, 3),
                      "goal_us": args.goal_us, "meets_goal": diff <= args.goal_us}))
    return 0 if diff <= args.goal_us else 1


if __name__ == "__main__":
    sys.exit(main())

"""What the example programs share, apart from their kernels: options, the
timed launches, the check and the one-line JSON report. Plain NumPy, and
whichever `cp` the program imported (gpumux.cupy or CuPy)."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable, List, Tuple

import numpy as np


def options(doc: str, n: int, reps: int) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("--cupy", action="store_true", help="run on CuPy instead of gpumuxd")
    p.add_argument("--n", type=int, default=n, help="problem size")
    p.add_argument("--reps", type=int, default=reps, help="timed launches")
    p.add_argument("--out", help="save the result here (.npy)")
    return p.parse_args()


def timed(cp: Any, launch: Callable[[], None], reps: int) -> float:
    """ms per launch of `reps` launches, after one untimed (which compiles)."""
    launch()
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        launch()
    cp.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def report(cp: Any, args: argparse.Namespace, program: str, result: Any, inputs: List[Tuple[Any, np.ndarray]],
           expect: Callable[[], np.ndarray], rtol: float, ms: float) -> int:
    """Checks `result` against `expect()` within `rtol` (on a simulated device,
    which computes nothing, that the `(device, host)` inputs round-trip
    instead), saves it if asked, prints the JSON line; the exit status."""
    out = cp.asnumpy(result)
    if getattr(cp, "is_simulated", lambda: False)():  # gpumux's own: False on CuPy
        check = "inputs round-trip (simulated device: kernels compute nothing)"
        ok = all(np.array_equal(cp.asnumpy(d), h) for d, h in inputs)
    else:
        check = f"equal to NumPy (float64 reference, rtol {rtol:g})"
        ok = bool(np.allclose(out, expect(), rtol=rtol, atol=rtol))
    if args.out:
        np.save(args.out, out)
    print(json.dumps({"program": program, "backend": "cupy" if args.cupy else "gpumux", "n": args.n,
                      "ms_per_launch": round(ms, 4), "check": check, "ok": ok}))
    return 0 if ok else 1

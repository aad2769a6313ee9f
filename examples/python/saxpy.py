"""SAXPY in CuPy's style: out = a * x + y with a RawKernel, checked against NumPy.

    python examples/python/saxpy.py            # through gpumuxd (GPUMUX_SOCKET), as written
    python examples/python/saxpy.py --cupy     # the same program on CuPy

The program is CuPy code: `--cupy` changes only which module is `cp` (the
one line a CuPy program changes to run through gpumuxd). On a simulated
device kernels compute nothing, so there it checks only that the inputs
round-trip. Prints one JSON line: backend, size, ms per launch, the check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

SOURCE = r'''
extern "C" __global__ void saxpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cupy", action="store_true", help="run on CuPy instead of gpumuxd")
    p.add_argument("--n", type=int, default=1 << 24)
    p.add_argument("--reps", type=int, default=20, help="timed launches")
    p.add_argument("--out", help="save the result here (.npy)")
    args = p.parse_args()
    if args.cupy:
        import cupy as cp
    else:
        import gpumux.cupy as cp  # the one changed line: `import cupy as cp` on CuPy

    rng = np.random.default_rng(0)
    hx = rng.standard_normal(args.n, dtype=np.float32)
    hy = rng.standard_normal(args.n, dtype=np.float32)
    a = np.float32(2.5)

    saxpy = cp.RawKernel(SOURCE, "saxpy")
    x, y = cp.asarray(hx), cp.asarray(hy)
    out = cp.empty(args.n, dtype=cp.float32)
    block = 256
    grid = ((args.n + block - 1) // block,)
    saxpy(grid, (block,), (a, x, y, out, np.int32(args.n)))  # warm-up (compiles)
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(args.reps):
        saxpy(grid, (block,), (a, x, y, out, np.int32(args.n)))
    cp.cuda.Device().synchronize()
    ms = (time.perf_counter() - t0) / args.reps * 1e3
    result = cp.asnumpy(out)

    simulated = getattr(cp, "is_simulated", lambda: False)()
    if simulated:
        check = "inputs round-trip (simulated device: kernels compute nothing)"
        ok = np.array_equal(cp.asnumpy(x), hx) and np.array_equal(cp.asnumpy(y), hy)
    else:
        expect = (a.astype(np.float64) * hx + hy).astype(np.float32)
        ok = bool(np.allclose(result, expect, rtol=1e-6, atol=1e-6))
        check = "equal to NumPy (rtol 1e-6)"
    if args.out:
        np.save(args.out, result)
    print(json.dumps({"program": "saxpy", "backend": "cupy" if args.cupy else "gpumux", "n": args.n,
                      "ms_per_launch": round(ms, 4), "check": check, "ok": bool(ok)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

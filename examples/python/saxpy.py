"""SAXPY in CuPy's style: out = a * x + y with a RawKernel, checked against NumPy.

    python examples/python/saxpy.py            # through gpumuxd (GPUMUX_SOCKET), as written
    python examples/python/saxpy.py --cupy     # the same program on CuPy

The program is CuPy code: `--cupy` changes only which module is `cp` (the
one line a CuPy program changes to run through gpumuxd). On a simulated
device kernels compute nothing, so there it checks only that the inputs
round-trip. Prints one JSON line: backend, size, ms per launch, the check
(harness.py).
"""

from __future__ import annotations

import sys

import numpy as np

import harness

SOURCE = r'''
extern "C" __global__ void saxpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
'''


def main() -> int:
    args = harness.options(__doc__, n=1 << 24, reps=20)
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
    ms = harness.timed(cp, lambda: saxpy(grid, (block,), (a, x, y, out, np.int32(args.n))), args.reps)
    return harness.report(cp, args, "saxpy", out, [(x, hx), (y, hy)],
                          lambda: np.float64(a) * hx + hy, rtol=1e-6, ms=ms)


if __name__ == "__main__":
    sys.exit(main())

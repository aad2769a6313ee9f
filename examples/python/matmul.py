"""A tiled matrix multiply in CuPy's style: C = A @ B with a RawModule, its
tiles in dynamic shared memory, checked against NumPy.

    python examples/python/matmul.py            # through gpumuxd (GPUMUX_SOCKET), as written
    python examples/python/matmul.py --cupy     # the same program on CuPy

As saxpy.py: `--cupy` changes only which module is `cp`; on a simulated
device only the inputs' round trip is checked. Prints one JSON line.
"""

from __future__ import annotations

import sys

import numpy as np

import harness

# TILE comes from the options; the two tiles live in dynamic shared memory
# (the launch's shared_mem), as CuPy programs pass it.
SOURCE = r'''
extern "C" __global__ void matmul(const float* A, const float* B, float* C, int n) {
    extern __shared__ float tiles[];
    float* As = tiles;
    float* Bs = tiles + TILE * TILE;
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int t = 0; t < (n + TILE - 1) / TILE; ++t) {
        int ac = t * TILE + tx, br = t * TILE + ty;
        As[ty * TILE + tx] = (row < n && ac < n) ? A[row * n + ac] : 0.0f;
        Bs[ty * TILE + tx] = (br < n && col < n) ? B[br * n + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; ++k) acc += As[ty * TILE + k] * Bs[k * TILE + tx];
        __syncthreads();
    }
    if (row < n && col < n) C[row * n + col] = acc;
}
'''
TILE = 16


def main() -> int:
    args = harness.options(__doc__, n=1024, reps=10)
    if args.cupy:
        import cupy as cp
    else:
        import gpumux.cupy as cp  # the one changed line: `import cupy as cp` on CuPy

    n = args.n
    rng = np.random.default_rng(1)
    ha = rng.standard_normal((n, n), dtype=np.float32)
    hb = rng.standard_normal((n, n), dtype=np.float32)

    module = cp.RawModule(code=SOURCE, options=(f"-DTILE={TILE}",))
    matmul = module.get_function("matmul")
    a, b = cp.asarray(ha), cp.asarray(hb)
    c = cp.zeros((n, n), dtype=cp.float32)
    grid = ((n + TILE - 1) // TILE, (n + TILE - 1) // TILE)
    shared = 2 * TILE * TILE * np.dtype(np.float32).itemsize
    ms = harness.timed(cp, lambda: matmul(grid, (TILE, TILE), (a, b, c, np.int32(n)), shared_mem=shared), args.reps)
    return harness.report(cp, args, "matmul", c, [(a, ha), (b, hb)],
                          lambda: ha.astype(np.float64) @ hb.astype(np.float64), rtol=1e-3, ms=ms)


if __name__ == "__main__":
    sys.exit(main())

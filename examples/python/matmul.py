"""A tiled matrix multiply in CuPy's style: C = A @ B with a RawModule, its
tiles in dynamic shared memory, checked against NumPy.

    python examples/python/matmul.py            # through gpumuxd (GPUMUX_SOCKET), as written
    python examples/python/matmul.py --cupy     # the same program on CuPy

As saxpy.py: `--cupy` changes only which module is `cp`; on a simulated
device only the inputs' round trip is checked. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

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
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cupy", action="store_true", help="run on CuPy instead of gpumuxd")
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--reps", type=int, default=10, help="timed launches")
    p.add_argument("--out", help="save the result here (.npy)")
    args = p.parse_args()
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
    block = (TILE, TILE)
    shared = 2 * TILE * TILE * np.dtype(np.float32).itemsize
    matmul(grid, block, (a, b, c, np.int32(n)), shared_mem=shared)  # warm-up
    cp.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(args.reps):
        matmul(grid, block, (a, b, c, np.int32(n)), shared_mem=shared)
    cp.cuda.Device().synchronize()
    ms = (time.perf_counter() - t0) / args.reps * 1e3
    result = cp.asnumpy(c)

    simulated = getattr(cp, "is_simulated", lambda: False)()
    if simulated:
        check = "inputs round-trip (simulated device: kernels compute nothing)"
        ok = np.array_equal(cp.asnumpy(a), ha) and np.array_equal(cp.asnumpy(b), hb)
    else:
        expect = ha.astype(np.float64) @ hb.astype(np.float64)
        ok = bool(np.allclose(result, expect, rtol=1e-3, atol=1e-3))
        check = "equal to NumPy (float64 reference, rtol 1e-3)"
    if args.out:
        np.save(args.out, result)
    print(json.dumps({"program": "matmul", "backend": "cupy" if args.cupy else "gpumux", "n": n,
                      "ms_per_launch": round(ms, 4), "check": check, "ok": bool(ok)}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

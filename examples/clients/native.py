#!/usr/bin/env python3
"""Runs the four example kernels natively with CuPy (no gpumux) on the same
inputs as the clients, and writes the same output files, so the GPU check can
compare the daemon's outputs with native ones byte for byte:

    python3 examples/clients/native.py --out-dir native/
    cmp native/vector_add.bin daemon/vector_add.bin   # etc.
"""
import argparse
import pathlib

import cupy as cp
import numpy as np

KERNELS = pathlib.Path(__file__).resolve().parent / "kernels"


def kernel(name):
    return cp.RawKernel((KERNELS / f"{name}.cu").read_text(), name)


def vector_add():
    n = 1 << 20
    i = np.arange(n, dtype=np.int64)
    a = cp.asarray(((i % 1000) * 0.5).astype(np.float32))
    b = cp.asarray((((i * 7) % 1000) * 0.25).astype(np.float32))
    c = cp.zeros(n, dtype=np.float32)
    kernel("vector_add")(((n + 255) // 256,), (256,), (a, b, c, np.int32(n)))
    return c


def histogram():
    n = 1 << 20
    i = np.arange(n, dtype=np.uint64)
    data = cp.asarray((((i * 2654435761) & 0xFFFFFFFF) >> 24).astype(np.uint8))
    bins = cp.zeros(256, dtype=np.uint32)
    kernel("histogram")((128,), (256,), (data, np.int32(n), bins))
    return bins


def matmul():
    n = 256
    i = np.arange(n * n, dtype=np.int64)
    a = cp.asarray((((i * 7) % 17 - 8) * 0.125).astype(np.float32))
    b = cp.asarray((((i * 5) % 13 - 6) * 0.25).astype(np.float32))
    c = cp.zeros(n * n, dtype=np.float32)
    kernel("matmul")((n // 16, n // 16), (16, 16), (a, b, c, np.int32(n)))
    return c


def stencil():
    nx, ny = 512, 512
    y, x = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    grid = cp.asarray(((x * 3 + y * 5) % 16).astype(np.float32).ravel())
    out = cp.zeros(nx * ny, dtype=np.float32)
    kernel("stencil")((nx // 16, ny // 16), (16, 16), (grid, out, np.int32(nx), np.int32(ny)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out-dir", type=pathlib.Path, required=True)
    args = p.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, run in [("vector_add", vector_add), ("histogram", histogram), ("matmul", matmul), ("stencil", stencil)]:
        out = run()
        cp.cuda.Device().synchronize()
        path = args.out_dir / f"{name}.bin"
        path.write_bytes(cp.asnumpy(out).astype(out.dtype.newbyteorder("<")).tobytes())
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()

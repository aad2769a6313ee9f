#!/usr/bin/env python3
"""The two LCG examples (stream_pipeline.rs, event_timing.rs) natively with
CuPy, no gpumux: the same input, kernel (kernels/lcg.cu), chunks, streams and
events, so the GPU check compares outputs byte for byte and times side by side:

    python3 examples/clients/native_lcg.py pipeline --out native/pipeline.bin [--chunks N] [--chunk-mib M]
        [--iters K] [--repeat R] [--pageable]
    python3 examples/clients/native_lcg.py timing --out native/timing.bin [same options]

pipeline: chunk c is copied in on the copy-in stream (cudaMemcpyAsync from
pinned memory), compute stream c % 2 waits for the copy's event
(cudaStreamWaitEvent) and runs the kernel, the copy-out stream waits for the
kernel's event and copies the chunk back; prints pipeline_ms, and copies_ms
and kernels_ms (the same copies alone, the same kernels alone), medians of R.
timing: the kernel over all the input between two events, R times; prints
kernel_ms (cudaEventElapsedTime, median) and host_ms (launch + synchronize).
Both print the same key=value figures as the examples.
"""
import argparse
import pathlib
import time

import cupy as cp
import cupyx
import numpy as np

KERNEL = cp.RawKernel((pathlib.Path(__file__).resolve().parent / "kernels" / "lcg.cu").read_text(), "lcg")


def host(n, pageable):
    return np.empty(n, dtype=np.uint32) if pageable else cupyx.empty_pinned((n,), dtype=np.uint32)


def inputs(n, pageable):
    i = np.arange(n, dtype=np.uint64)
    h = host(n, pageable)
    h[:] = ((i * 2654435761) & 0xFFFFFFFF).astype(np.uint32)
    return h


def launch(d_in, d_out, n, iters, stream):
    # RawKernel launches on the current stream.
    with stream:
        KERNEL(((n + 255) // 256,), (256,), (d_in, d_out, np.int32(n), np.int32(iters)))


# cudaMemcpyAsync itself: whether ndarray.set / get block differs between CuPy versions.
H2D, D2H = 1, 2


def copy_in(d, h, stream):
    cp.cuda.runtime.memcpyAsync(d.data.ptr, h.ctypes.data, h.nbytes, H2D, stream.ptr)


def copy_out(h, d, stream):
    cp.cuda.runtime.memcpyAsync(h.ctypes.data, d.data.ptr, d.nbytes, D2H, stream.ptr)


def ms_since(t):
    return (time.perf_counter() - t) * 1e3


def pipeline(a):
    m = a.chunk_mib << 18
    n = a.chunks * m
    h_in, h_out = inputs(n, a.pageable), host(n, a.pageable)
    d_in, d_out = cp.empty(n, dtype=cp.uint32), cp.empty(n, dtype=cp.uint32)
    s_in, s_out = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    compute = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
    part = [slice(c * m, (c + 1) * m) for c in range(a.chunks)]
    copy_in(d_in[part[0]], h_in[part[0]], s_in)
    s_in.synchronize()
    launch(d_in[part[0]], d_out[part[0]], m, a.iters, compute[0])  # warm-up
    compute[0].synchronize()
    copies, kernels, piped = [], [], []
    for _ in range(a.repeat):
        t = time.perf_counter()
        for p in part:
            copy_in(d_in[p], h_in[p], s_in)
            s_in.synchronize()  # as the gpumux example's copies: each done before the next
        for p in part:
            copy_out(h_out[p], d_out[p], s_out)
            s_out.synchronize()
        copies.append(ms_since(t))

        t = time.perf_counter()
        for p in part:
            launch(d_in[p], d_out[p], m, a.iters, compute[0])
        compute[0].synchronize()
        kernels.append(ms_since(t))

        d_out.fill(0)
        h_out[:] = 0
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        for c, p in enumerate(part):
            copy_in(d_in[p], h_in[p], s_in)
            arrived = cp.cuda.Event(disable_timing=True)
            arrived.record(s_in)
            k = compute[c % 2]
            k.wait_event(arrived)
            launch(d_in[p], d_out[p], m, a.iters, k)
            computed = cp.cuda.Event(disable_timing=True)
            computed.record(k)
            s_out.wait_event(computed)
            copy_out(h_out[p], d_out[p], s_out)
        s_out.synchronize()
        piped.append(ms_since(t))
    p, cps, k = np.median(piped), np.median(copies), np.median(kernels)
    print(
        f"native pipeline: {a.chunks} chunks of {a.chunk_mib} MiB, {a.iters} steps: pipeline_ms={p:.3f} "
        f"copies_ms={cps:.3f} kernels_ms={k:.3f} overlap={'yes' if p < cps + k else 'no'}; "
        f"{'pageable' if a.pageable else 'pinned'} host memory"
    )
    return h_out


def timing(a):
    n = a.chunks * (a.chunk_mib << 18)
    h = inputs(n, a.pageable)
    d_in, d_out = cp.asarray(h), cp.empty(n, dtype=cp.uint32)
    s = cp.cuda.Stream(non_blocking=True)
    launch(d_in, d_out, n, a.iters, s)  # warm-up
    s.synchronize()
    events, hosts = [], []
    for _ in range(a.repeat):
        t = time.perf_counter()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(s)
        launch(d_in, d_out, n, a.iters, s)
        end.record(s)
        end.synchronize()
        hosts.append(ms_since(t))
        events.append(cp.cuda.get_elapsed_time(start, end))
    print(
        f"native timing: {n} elements, {a.iters} steps: kernel_ms={np.median(events):.4f} (events, median of "
        f"{a.repeat}) host_ms={np.median(hosts):.4f} (launch + wait)"
    )
    return cp.asnumpy(d_out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["pipeline", "timing"])
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--chunk-mib", type=int, default=16)
    ap.add_argument("--iters", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pageable", action="store_true")
    ap.add_argument("--check", action="store_true", help="accepted for the examples' argument lists; ignored")
    a = ap.parse_args()
    out = pipeline(a) if a.mode == "pipeline" else timing(a)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    np.asarray(out, dtype=np.uint32).tofile(a.out)


if __name__ == "__main__":
    main()

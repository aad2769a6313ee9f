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
and kernels_ms (the same copies alone, the same kernels alone), medians of R
(7 by default) after one untimed repetition of all three, pipeline_min_ms, and
every repetition's times (*_reps_ms, which the GPU check pools over runs).
timing: the kernel over all the input between two events, R times after one
untimed; prints kernel_ms (cudaEventElapsedTime, median) and host_ms (launch +
synchronize). Both print the same key=value figures as the examples.
LCG_TIMING=old times as fe4d877 did (a warm-up of one chunk, or of one
launch), as the examples do (lcg_common.rs), for an A/B in one build.
"""
import argparse
import os
import pathlib
import sys
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


def reps(v):
    """Repetitions as the examples print them: a,b,c in ms, in the order measured."""
    return ",".join(f"{x:.3f}" for x in v)


def old_timing():
    v = os.environ.get("LCG_TIMING", "new")
    if v not in ("old", "new"):
        sys.exit(f'native_lcg.py: LCG_TIMING={v!r}: "old" or "new" (the default)')
    return v == "old"


def pipeline(a):
    m = a.chunk_mib << 18
    n = a.chunks * m
    h_in, h_out = inputs(n, a.pageable), host(n, a.pageable)
    d_in, d_out = cp.empty(n, dtype=cp.uint32), cp.empty(n, dtype=cp.uint32)
    s_in, s_out = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    compute = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
    part = [slice(c * m, (c + 1) * m) for c in range(a.chunks)]
    # Warm-up: repetition 0 is not timed, as in stream_pipeline.rs.
    warm_ups = 1
    if old_timing():
        copy_in(d_in[part[0]], h_in[part[0]], s_in)
        s_in.synchronize()
        launch(d_in[part[0]], d_out[part[0]], m, a.iters, compute[0])
        compute[0].synchronize()
        warm_ups = 0
    copies, kernels, piped = [], [], []
    for rep in range(warm_ups + a.repeat):
        timed = rep >= warm_ups
        t = time.perf_counter()
        for p in part:
            copy_in(d_in[p], h_in[p], s_in)
            s_in.synchronize()  # as the gpumux example's copies: each done before the next
        for p in part:
            copy_out(h_out[p], d_out[p], s_out)
            s_out.synchronize()
        if timed:
            copies.append(ms_since(t))

        t = time.perf_counter()
        for p in part:
            launch(d_in[p], d_out[p], m, a.iters, compute[0])
        compute[0].synchronize()
        if timed:
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
        if timed:
            piped.append(ms_since(t))
    print(
        f"native pipeline: repetitions: pipeline_reps_ms={reps(piped)} copies_reps_ms={reps(copies)} "
        f"kernels_reps_ms={reps(kernels)}"
    )
    # The upper median of an even count, as the examples' median.
    p, cps, k = (sorted(v)[len(v) // 2] for v in (piped, copies, kernels))
    print(
        f"native pipeline: {a.chunks} chunks of {a.chunk_mib} MiB, {a.iters} steps: pipeline_ms={p:.3f} "
        f"pipeline_min_ms={min(piped):.3f} copies_ms={cps:.3f} kernels_ms={k:.3f} "
        f"overlap={'yes' if p < cps + k else 'no'}; medians of {a.repeat} after {warm_ups} untimed; "
        f"{'pageable' if a.pageable else 'pinned'} host memory"
    )
    return h_out


def timing(a):
    n = a.chunks * (a.chunk_mib << 18)
    h = inputs(n, a.pageable)
    d_in, d_out = cp.asarray(h), cp.empty(n, dtype=cp.uint32)
    s = cp.cuda.Stream(non_blocking=True)
    # Warm-up: one untimed repetition, events and all (event_timing.rs's too).
    warm_ups = 1
    if old_timing():
        launch(d_in, d_out, n, a.iters, s)
        s.synchronize()
        warm_ups = 0
    events, hosts = [], []
    for rep in range(warm_ups + a.repeat):
        t = time.perf_counter()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(s)
        launch(d_in, d_out, n, a.iters, s)
        end.record(s)
        end.synchronize()
        if rep >= warm_ups:
            hosts.append(ms_since(t))
            events.append(cp.cuda.get_elapsed_time(start, end))
    print(f"native timing: repetitions: kernel_reps_ms={reps(events)}")
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
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--pageable", action="store_true")
    ap.add_argument("--check", action="store_true", help="accepted for the examples' argument lists; ignored")
    a = ap.parse_args()
    if min(a.chunks, a.chunk_mib, a.iters, a.repeat) < 1:
        ap.error("--chunks, --chunk-mib, --iters and --repeat need a number > 0")
    out = pipeline(a) if a.mode == "pipeline" else timing(a)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    np.asarray(out, dtype=np.uint32).tofile(a.out)


if __name__ == "__main__":
    main()

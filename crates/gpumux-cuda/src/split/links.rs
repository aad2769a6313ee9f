//! Timing the links of a split's GPUs (issue 38, item 5): peer copies
//! between two GPUs and copies between pinned host memory and each GPU, the
//! copies a split and a move between GPUs make. `gpumux-cuda-check links`
//! fits the simulator's link model (`gpumux_sim::links`: latency + bytes /
//! bandwidth) to these times.
//!
//! Each copy is timed on the host, from the call that queues it to the end
//! of the stream's wait: what a caller pays, call and completion included,
//! which is what the model's latency stands for.

use super::run::SplitGpus;
use super::SplitError;
use crate::runtime::{check, DeviceBuffer, Gpu, HostMapped, Stream};
use cudarc::driver::sys as cu;
use std::time::Instant;

type Result<T> = std::result::Result<T, SplitError>;

/// A buffer of GPU `gpu` of the split, freed in its own context.
struct OnGpu<'g> {
    gpus: &'g SplitGpus,
    gpu: usize,
    buf: Option<DeviceBuffer>,
}

impl<'g> OnGpu<'g> {
    fn new(gpus: &'g SplitGpus, gpu: usize, bytes: usize) -> Result<OnGpu<'g>> {
        bind(gpus, gpu)?;
        Ok(OnGpu { gpus, gpu, buf: Some(DeviceBuffer::new(bytes)?) })
    }

    fn ptr(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.ptr)
    }
}

impl Drop for OnGpu<'_> {
    fn drop(&mut self) {
        let _ = bind(self.gpus, self.gpu);
        self.buf.take();
    }
}

/// GPU `i` of the split, or why not.
fn gpu_at(gpus: &SplitGpus, i: usize) -> Result<&Gpu> {
    gpus.gpu(i).ok_or_else(|| SplitError::Invalid(format!("no GPU {i} in a split of {}", gpus.len())))
}

fn bind(gpus: &SplitGpus, i: usize) -> Result<()> {
    Ok(gpu_at(gpus, i)?.bind()?)
}

/// Times `reps` copies (after one untimed) made by `copy` on `stream`: ns each.
fn timed(reps: u32, stream: &Stream, copy: &dyn Fn() -> Result<()>) -> Result<Vec<f64>> {
    copy()?;
    stream.sync()?;
    let mut ns = Vec::with_capacity(reps as usize);
    for _ in 0..reps {
        let t = Instant::now();
        copy()?;
        stream.sync()?;
        ns.push(t.elapsed().as_nanos() as f64);
    }
    Ok(ns)
}

/// `reps` peer copies of `bytes` from GPU `from` to GPU `to` of the split
/// (`cuMemcpyPeerAsync` on a stream of `to`): each one's time, ns.
pub fn time_peer_copies(gpus: &SplitGpus, from: usize, to: usize, bytes: usize, reps: u32) -> Result<Vec<f64>> {
    if from == to {
        return Err(SplitError::Invalid(format!("a peer copy from GPU {from} to itself")));
    }
    let src = OnGpu::new(gpus, from, bytes)?;
    let dst = OnGpu::new(gpus, to, bytes)?;
    let (src_ctx, dst_ctx) = (gpu_at(gpus, from)?.raw_context(), gpu_at(gpus, to)?.raw_context());
    bind(gpus, to)?;
    let stream = Stream::low(gpu_at(gpus, to)?)?;
    let copy = || -> Result<()> {
        // SAFETY: both buffers hold `bytes` in their contexts and outlive the copy (synced before they drop).
        Ok(check("cuMemcpyPeerAsync", unsafe {
            cu::cuMemcpyPeerAsync(dst.ptr(), dst_ctx, src.ptr(), src_ctx, bytes, stream.raw)
        })?)
    };
    timed(reps, &stream, &copy)
}

/// `reps` copies of `bytes` between pinned host memory and GPU `gpu`
/// (`cuMemcpyHtoDAsync` when `up`, else `cuMemcpyDtoHAsync`): each one's time, ns.
pub fn time_host_copies(gpus: &SplitGpus, gpu: usize, up: bool, bytes: usize, reps: u32) -> Result<Vec<f64>> {
    let dev = OnGpu::new(gpus, gpu, bytes)?;
    let host = HostMapped::new(bytes.max(4))?;
    bind(gpus, gpu)?;
    let stream = Stream::low(gpu_at(gpus, gpu)?)?;
    let copy = || -> Result<()> {
        // SAFETY: `host` is pinned and holds `bytes`, the device buffer too; both outlive the copy.
        let r = unsafe {
            if up {
                cu::cuMemcpyHtoDAsync_v2(dev.ptr(), host.host_ptr().cast(), bytes, stream.raw)
            } else {
                cu::cuMemcpyDtoHAsync_v2(host.host_mut_ptr().cast(), dev.ptr(), bytes, stream.raw)
            }
        };
        Ok(check(if up { "cuMemcpyHtoDAsync" } else { "cuMemcpyDtoHAsync" }, r)?)
    };
    timed(reps, &stream, &copy)
}

//! A GPU kept full of fixed-time blocks, natively and as workers: how much
//! of its block rate a low-priority client keeps when its kernels run as
//! preemptible workers (`gpumux bench daemon`'s "LP alone" column), and where
//! the rest goes, read from the GPU's own clock.
//!
//! Every block spins for `block_us` of `%globaltimer` (the same kernel as the
//! daemon bench's filler) and stamps when it started and ended and on which
//! SM. From the stamps, per launch: the mean number of blocks running at once
//! on an SM (the occupancy the launch achieved), the mean time a block took
//! (its spin plus whatever came between its start stamp and its end), and the
//! mean gap on an SM between one block's end and the start of the next block
//! that took its place.

use anyhow::{ensure, Result};
use gpumux_cuda::launch_plan::Chunk;
use gpumux_cuda::preempt::{SmMask, WorkerLaunch};
use gpumux_cuda::runtime::{DeviceBuffer, Event, Gpu, Params, Stream};
use serde::Serialize;

/// The filler: spins, then stamps (start, end, SM) for its block.
const SOURCE: &str = r#"
static __device__ __forceinline__ unsigned long long fill_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
static __device__ __forceinline__ unsigned int fill_smid() {
    unsigned int s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}
extern "C" __global__ void fill(unsigned long long ns, unsigned long long* stamps, unsigned int pause_ns) {
    const unsigned long long t0 = fill_now();
    while (fill_now() - t0 < ns) {
        if (pause_ns != 0u) __nanosleep(pause_ns);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned long long b = blockIdx.x;
        stamps[3 * b] = t0;
        stamps[3 * b + 1] = fill_now();
        stamps[3 * b + 2] = fill_smid();
    }
}
"#;

const THREADS: u32 = 256;

/// One launch of the filler, as the GPU clock saw it.
#[derive(Clone, Debug, Serialize)]
pub struct FillRow {
    /// `native`, `workers, chunk 1`, `workers, chunk auto`.
    pub mode: String,
    /// The spinning threads' sleep between clock reads, ns.
    pub pause_ns: u32,
    /// Spin per block, µs.
    pub block_us: u64,
    /// Blocks of the launch.
    pub blocks: u32,
    /// Launch time (events), median of the repetitions, µs.
    pub elapsed_us: f64,
    /// Blocks per second over that time, as a share of the native launch's.
    pub rate_vs_native: f64,
    /// Blocks running at once on an SM, averaged over the SMs' busy spans.
    pub blocks_per_sm: f64,
    /// Mean block time from its start stamp to its end stamp, µs.
    pub block_time_us: f64,
    /// Mean gap on an SM from a block's end to the next start there, µs.
    pub refill_gap_us: f64,
}

/// Per-SM concurrency, block time and refill gap from (start, end, sm) stamps.
fn analyse(stamps: &[u64]) -> (f64, f64, f64) {
    let mut by_sm: std::collections::BTreeMap<u64, Vec<(u64, u64)>> = Default::default();
    for s in stamps.chunks_exact(3) {
        by_sm.entry(s[2]).or_default().push((s[0], s[1]));
    }
    let (mut busy, mut span, mut durations, mut n) = (0f64, 0f64, 0f64, 0f64);
    let (mut gaps, mut gap_n) = (0f64, 0f64);
    for blocks in by_sm.values_mut() {
        let lo = blocks.iter().map(|b| b.0).min().unwrap_or(0);
        let hi = blocks.iter().map(|b| b.1).max().unwrap_or(0);
        span += hi.saturating_sub(lo) as f64;
        for b in blocks.iter() {
            busy += b.1.saturating_sub(b.0) as f64;
            durations += b.1.saturating_sub(b.0) as f64;
            n += 1.0;
        }
        // Each end is followed (on this SM) by the earliest start at or after it
        // that no earlier end took: pair sorted ends with sorted later starts.
        let mut ends: Vec<u64> = blocks.iter().map(|b| b.1).collect();
        let mut starts: Vec<u64> = blocks.iter().map(|b| b.0).collect();
        ends.sort_unstable();
        starts.sort_unstable();
        let mut j = 0;
        for e in ends {
            while j < starts.len() && starts[j] < e {
                j += 1;
            }
            if j == starts.len() {
                break;
            }
            gaps += (starts[j] - e) as f64;
            gap_n += 1.0;
            j += 1;
        }
    }
    let per_sm = if span > 0.0 { busy / span } else { 0.0 };
    (per_sm, durations / n.max(1.0) / 1e3, gaps / gap_n.max(1.0) / 1e3)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the filler natively and as workers at each block time (module doc).
/// With `pause_ns`, the spinning threads sleep that long between clock reads
/// (`__nanosleep`), leaving the SM's issue slots to other warps.
pub fn fill(gpu: &Gpu, block_us: &[u64], reps: u32, pause_ns: u32) -> Result<Vec<FillRow>> {
    let (native_m, worker_m, _) = gpu.native_and_worker("fill", SOURCE)?;
    let native = native_m.function("fill")?;
    let worker = worker_m.function("fill")?;
    let sms = gpu.sm_count();
    let per_sm = native.blocks_per_sm(THREADS, 0)?;
    let worker_per_sm = worker.blocks_per_sm(THREADS, 0)?;
    println!(
        "\n== a GPU full of fixed-time blocks: native vs workers ({THREADS} threads; {per_sm} native blocks per SM, \
         {worker_per_sm} workers per SM; spin pause {pause_ns} ns; median of {reps}) =="
    );
    println!(
        "{:<22} {:>8} {:>7} {:>11} {:>9} {:>10} {:>12} {:>11}",
        "mode", "block us", "blocks", "elapsed us", "rate", "blocks/SM", "block us", "refill us"
    );
    let stream = Stream::low(gpu)?;
    let (a, b) = (Event::new()?, Event::new()?);
    let mut rows = Vec::new();
    for &bus in block_us {
        let waves = if bus >= 1000 { 2 } else { 20 };
        let blocks = sms * per_sm * waves;
        let stamps = DeviceBuffer::new(blocks as usize * 24)?;
        let ns = bus * 1000;
        let mut native_us = 0.0;
        for mode in ["native", "workers, chunk 1", "workers, chunk auto"] {
            let chunk = if mode.ends_with("auto") { Chunk::Auto } else { Chunk::Fixed(1) };
            let mut w = WorkerLaunch::new(
                worker.clone(),
                vec![ns.to_le_bytes().to_vec(), stamps.ptr.to_le_bytes().to_vec(), pause_ns.to_le_bytes().to_vec()],
                [blocks, 1, 1],
                [THREADS, 1, 1],
                0,
                chunk,
                sms,
            )?;
            let mut times = Vec::new();
            let mut last = Vec::new();
            // One more than measured: the first also loads the code (and times the kernel).
            for rep in 0..=reps {
                stamps.fill(0)?;
                a.record(&stream)?;
                if mode == "native" {
                    let mut p = Params::default();
                    p.u64(ns).ptr(stamps.ptr).u32(pause_ns);
                    // SAFETY: matches `fill`'s parameters.
                    unsafe { native.launch([blocks, 1, 1], [THREADS, 1, 1], 0, &stream, &mut p)? };
                } else {
                    w.rewind()?;
                    w.start(&stream, SmMask::range(0, sms))?;
                }
                b.record(&stream)?;
                b.sync()?;
                if mode != "native" {
                    ensure!(w.finish()?.done(), "{mode}: the launch ended with blocks left");
                }
                if rep > 0 {
                    times.push(a.elapsed_ms(&b)? as f64 * 1e3);
                }
                last = stamps.download()?;
            }
            let words: Vec<u64> =
                last.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
            ensure!(words.chunks_exact(3).all(|s| s[1] > s[0]), "{mode}: a block did not run");
            let elapsed = median(&mut times);
            if mode == "native" {
                native_us = elapsed;
            }
            let (conc, bt, gap) = analyse(&words);
            let row = FillRow {
                mode: mode.into(),
                pause_ns,
                block_us: bus,
                blocks,
                elapsed_us: elapsed,
                rate_vs_native: if elapsed > 0.0 { native_us / elapsed } else { 0.0 },
                blocks_per_sm: conc,
                block_time_us: bt,
                refill_gap_us: gap,
            };
            println!(
                "{:<22} {:>8} {:>7} {:>11.1} {:>9.3} {:>10.2} {:>12.2} {:>11.2}",
                row.mode,
                row.block_us,
                row.blocks,
                row.elapsed_us,
                row.rate_vs_native,
                row.blocks_per_sm,
                row.block_time_us,
                row.refill_gap_us
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_give_concurrency_block_time_and_refill_gaps() {
        // One SM, two slots: blocks [0,10) and [0,10), then [12,22) and [11,21).
        let stamps = [0, 10_000, 5, 0, 10_000, 5, 12_000, 22_000, 5, 11_000, 21_000, 5];
        let (conc, bt, gap) = analyse(&stamps);
        assert!((conc - 40.0 / 22.0).abs() < 1e-9, "{conc}");
        assert!((bt - 10.0).abs() < 1e-9);
        // Ends at 10, 10; next starts 11 and 12: gaps 1 and 2 µs.
        assert!((gap - 1.5).abs() < 1e-9, "{gap}");
    }
}

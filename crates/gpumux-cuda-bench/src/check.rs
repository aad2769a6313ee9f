//! Correctness on the GPU: native vs CPU reference, then transformed under
//! random retreat/resume/SM-set changes vs native, bitwise.

use gpumux_cuda::error::Result;
use gpumux_cuda::exec::{random_mask, spin_for, Prepared};
use gpumux_cuda::preempt::{SmMask, WorkerLaunch};
use gpumux_cuda::runtime::{DeviceBuffer, Gpu, Stream};
use gpumux_cuda::suite::{self, compare, App, Rng, Scale, Tolerance};
use serde::Serialize;
use std::time::Duration;

/// One app, one round of random preemption.
#[derive(Clone, Debug, Serialize)]
pub struct CheckRow {
    /// The app.
    pub app: &'static str,
    /// Seed of its inputs and of the random schedule.
    pub seed: u64,
    /// Blocks per claim of the workers.
    pub chunk: u32,
    /// Blocks of the workload.
    pub blocks: u64,
    /// The native run against the CPU reference: `ok` or `FAIL: why`.
    pub native_vs_cpu: String,
    /// The workers' run against the native one (bitwise): `ok` or `FAIL: why`.
    pub workers_vs_native: String,
    /// Worker launches started.
    pub starts: u64,
    /// Retreats asked for.
    pub retreats: u64,
    /// Retreats that stopped a launch before it had finished.
    pub effective_retreats: u64,
    /// Both comparisons passed.
    pub ok: bool,
}

fn verdict(r: &std::result::Result<(), String>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("FAIL: {e}"),
    }
}

/// Every suite app at check size, `rounds` times: the native run against the
/// CPU reference, then the transformed kernels under random retreats, resumes
/// and SM-set changes against the native run, bitwise. Prints the table.
pub fn check_suite(gpu: &Gpu, rounds: u32, seed: u64) -> Result<Vec<CheckRow>> {
    let native_stream = Stream::low(gpu)?;
    let stream = Stream::low(gpu)?;
    let ctl = Stream::high(gpu)?;
    let mut rows = Vec::new();
    println!("\n== correctness: native vs CPU, transformed under random retreat/resume/SM sets vs native ==");
    println!(
        "{:<10} {:>5} {:>5} {:>8} {:>7} {:>9} {:<12} {:<12}",
        "app", "seed", "chunk", "blocks", "starts", "retreats", "native/cpu", "workers/native"
    );
    for app in App::ALL {
        for round in 0..rounds {
            let s = seed.wrapping_mul(1000) + round as u64;
            let w = suite::build(app, Scale::Check, s);
            let reference = w.reference();
            let p = Prepared::new(gpu, w)?;
            p.reset()?;
            p.enqueue_native(&native_stream)?;
            native_stream.sync()?;
            let native = p.outputs()?;
            let vs_cpu: std::result::Result<(), String> = native
                .iter()
                .zip(&reference)
                .zip(&p.workload.outputs)
                .try_for_each(|((g, r), o)| compare(g, r, o.tolerance));
            let mut rng = Rng::new(s ^ 0xC0FFEE);
            let chunk = [1u32, 3, 8][(round % 3) as usize];
            p.reset()?;
            let st = p.run_chaotic(gpu, chunk, &mut rng, &stream, &ctl)?;
            let got = p.outputs()?;
            let vs_native: std::result::Result<(), String> =
                got.iter().zip(&native).try_for_each(|(g, n)| compare(g, n, Tolerance::Exact));
            let row = CheckRow {
                app: app.name(),
                seed: s,
                chunk,
                blocks: p.workload.total_blocks(),
                native_vs_cpu: verdict(&vs_cpu),
                workers_vs_native: verdict(&vs_native),
                starts: st.starts,
                retreats: st.retreats,
                effective_retreats: st.effective_retreats,
                ok: vs_cpu.is_ok() && vs_native.is_ok(),
            };
            println!(
                "{:<10} {:>5} {:>5} {:>8} {:>7} {:>9} {:<12} {:<12}",
                row.app,
                row.seed,
                row.chunk,
                row.blocks,
                row.starts,
                row.retreats,
                row.native_vs_cpu,
                row.workers_vs_native
            );
            rows.push(row);
        }
    }
    Ok(rows)
}

/// The exactly-once storm: how often each block of a spin kernel ran.
#[derive(Clone, Debug, Serialize)]
pub struct ExactlyOnce {
    /// Blocks of the spin kernel.
    pub blocks: u32,
    /// Time each block spins, µs.
    pub block_us: u64,
    /// Retreats asked for.
    pub retreats: u64,
    /// Retreats that stopped a launch before it had finished.
    pub effective_retreats: u64,
    /// Blocks whose run count is not exactly one.
    pub wrong: u64,
}

/// The spin kernel counts how often each block ran; after a storm of
/// retreats and restarts on random SM sets, every count must be one.
pub fn exactly_once(gpu: &Gpu, seed: u64) -> Result<ExactlyOnce> {
    let (_, worker_m, _) = gpu.native_and_worker("synthetic", suite::SYNTHETIC_SOURCE)?;
    let blocks = 3_000_000u32;
    let block_ns = 5_000u64;
    let runs = DeviceBuffer::new(blocks as usize * 4)?;
    runs.fill(0)?;
    let stream = Stream::low(gpu)?;
    let ctl = Stream::high(gpu)?;
    let mut rng = Rng::new(seed ^ 0x0DD5);
    let args = vec![runs.ptr.to_le_bytes().to_vec(), block_ns.to_le_bytes().to_vec()];
    let mut w = WorkerLaunch::new(worker_m.function("spin")?, args, [blocks, 1, 1], [128, 1, 1], 0, 1, gpu.sm_count())?;
    let (mut retreats, mut effective) = (0u64, 0u64);
    while !w.done() {
        let mask =
            if retreats < 300 { random_mask(&mut rng, gpu.sm_count()) } else { SmMask::range(0, gpu.sm_count()) };
        w.start(&stream, mask)?;
        if retreats < 300 {
            spin_for(Duration::from_micros(rng.below(300)));
            w.retreat(&ctl)?;
            retreats += 1;
        }
        if !w.finish()?.done() {
            effective += 1;
        }
    }
    let counts = runs.download()?;
    let wrong = counts.chunks_exact(4).filter(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) != 1).count() as u64;
    Ok(ExactlyOnce { blocks, block_us: block_ns / 1000, retreats, effective_retreats: effective, wrong })
}

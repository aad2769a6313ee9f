//! Solo overhead: the transformed workload vs the native one, same GPU, same
//! inputs, interleaved repetitions, median of device-event times.

use crate::median;
use gpumux_cuda::error::{CudaError, Result};
use gpumux_cuda::exec::Prepared;
use gpumux_cuda::launch_plan::{Chunk, Plan, ProfileKey};
use gpumux_cuda::preempt::SmMask;
use gpumux_cuda::runtime::{Event, Gpu, Stream};
use gpumux_cuda::suite::{self, compare, App, Scale, Tolerance};
use serde::Serialize;

/// One app at bench size: native time and the workers' time per chunk.
#[derive(Clone, Debug, Serialize)]
pub struct OverheadRow {
    /// The app.
    pub app: &'static str,
    /// Its main dimension.
    pub size: u64,
    /// Launches of its workload.
    pub launches: usize,
    /// Blocks of all its launches.
    pub blocks: u64,
    /// Native time, median ms.
    pub native_ms: f64,
    /// Native launches each followed by an event record (a worker launch
    /// records one to be polled), ms: the share of the overhead that is the
    /// event's, not the transformation's. Only differs with several launches.
    pub native_marked_ms: f64,
    /// (chunk, median ms, overhead %)
    pub workers: Vec<(Chunk, f64, f64)>,
    /// What `auto` chose for the timed runs: launches run natively, and the
    /// chunks of the others.
    pub auto_native_launches: usize,
    /// Chunks `auto` chose for the launches it ran as workers.
    pub auto_chunks: Vec<u32>,
    /// Spread of the native time: (max - min) / median over the repetitions, %.
    pub native_spread_pct: f64,
    /// Every chunk's outputs equal the native ones, bitwise.
    pub outputs_bitwise_equal: bool,
    /// Per chunk size: workers that ran blocks in the first launch, and workers per SM allowed.
    pub workers_first_launch: Vec<(u32, u32)>,
    /// Measured block time of each kernel (ns), from `auto`'s first launch.
    pub block_ns: Vec<(String, f64)>,
}

/// Transformed against native time of each app (all when `apps` is empty)
/// at each chunk of `chunks`, `reps` interleaved repetitions, device-event
/// times. Prints the table.
pub fn overhead(
    gpu: &Gpu,
    chunks: &[Chunk],
    min_claims: u32,
    reps: u32,
    apps: &[App],
    seed: u64,
) -> Result<Vec<OverheadRow>> {
    let apps: Vec<App> = if apps.is_empty() { App::ALL.to_vec() } else { apps.to_vec() };
    let stream = Stream::low(gpu)?;
    let (a, b) = (Event::new()?, Event::new()?);
    let mark = Event::new_sync_only()?;
    let all = SmMask::range(0, gpu.sm_count());
    let mut rows = Vec::new();
    println!("\n== solo overhead: transformed vs native (median of {reps}, device events) ==");
    print!("{:<10} {:>10} {:>9} {:>8}", "app", "blocks", "native ms", "+events");
    for c in chunks {
        print!(" {:>22}", format!("chunk {c} (per launch)"));
    }
    println!(" {:>7} {:>6}", "spread", "equal");
    for app in apps {
        let p = Prepared::new(gpu, suite::build(app, Scale::Bench, seed))?;
        // Correctness first: one native and one transformed run, compared bitwise.
        p.reset()?;
        p.enqueue_native(&stream)?;
        stream.sync()?;
        let native_out = p.outputs()?;
        let mut launches: Vec<_> = chunks.iter().map(|&c| p.worker_launches(gpu, c)).collect::<Result<_>>()?;
        for w in launches.iter_mut().flatten() {
            w.min_claims = min_claims;
        }
        let mut equal = true;
        let mut workers_first_launch = Vec::new();
        for l in launches.iter_mut() {
            p.reset()?;
            p.enqueue_workers(l, &stream, all)?;
            stream.sync()?;
            let first = l.first_mut().map(|w| (w.finish(), w.workers_per_sm()));
            if let Some((o, per_sm)) = first {
                workers_first_launch.push((o?.workers, per_sm));
            }
            p.finish_workers(l)?;
            // Auto: that run timed each kernel's first launch; run it once more so
            // that the checked output is also one of planned (native or fitted) launches.
            if l.first().is_some_and(|w| w.chunk == Chunk::Auto) {
                p.reset()?;
                p.enqueue_workers(l, &stream, all)?;
                stream.sync()?;
                p.finish_workers(l)?;
            }
            let out = p.outputs()?;
            equal &= out.iter().zip(&native_out).all(|(g, n)| compare(g, n, Tolerance::Exact).is_ok());
        }
        if !equal {
            return Err(CudaError::Check(format!(
                "{}: transformed output differs from native at bench size",
                app.name()
            )));
        }
        // Timing: interleave native and each chunk size; inputs are not reset
        // (the apps are idempotent or accumulate, which costs the same).
        let mut nat = Vec::new();
        let mut marked = Vec::new();
        let mut work: Vec<Vec<f64>> = vec![Vec::new(); chunks.len()];
        for rep in 0..reps + 1 {
            a.record(&stream)?;
            p.enqueue_native(&stream)?;
            b.record(&stream)?;
            b.sync()?;
            if rep > 0 {
                nat.push(a.elapsed_ms(&b)? as f64);
            }
            a.record(&stream)?;
            p.enqueue_native_marked(&stream, &mark)?;
            b.record(&stream)?;
            b.sync()?;
            if rep > 0 {
                marked.push(a.elapsed_ms(&b)? as f64);
            }
            for (i, l) in launches.iter_mut().enumerate() {
                a.record(&stream)?;
                p.enqueue_workers(l, &stream, all)?;
                b.record(&stream)?;
                b.sync()?;
                p.finish_workers(l)?;
                if rep > 0 {
                    work[i].push(a.elapsed_ms(&b)? as f64);
                }
            }
        }
        let spread = {
            let mn = nat.iter().cloned().fold(f64::MAX, f64::min);
            let mx = nat.iter().cloned().fold(0.0, f64::max);
            let md = median(&mut nat.clone());
            if md > 0.0 {
                100.0 * (mx - mn) / md
            } else {
                0.0
            }
        };
        let native_ms = median(&mut nat);
        let native_marked_ms = median(&mut marked);
        let workers: Vec<(Chunk, f64, f64)> = chunks
            .iter()
            .zip(work.iter_mut())
            .map(|(&c, v)| {
                let m = median(v);
                (c, m, 100.0 * (m / native_ms - 1.0))
            })
            .collect();
        print!(
            "{:<10} {:>10} {:>9.3} {:>+7.1}%",
            app.name(),
            p.workload.total_blocks(),
            native_ms,
            100.0 * (native_marked_ms / native_ms - 1.0)
        );
        for (_, m, o) in &workers {
            // Also per launch: a fixed cost per launch shows as a constant here.
            let per_launch_us = 1000.0 * (m - native_ms) / p.workload.launches.len().max(1) as f64;
            print!(" {:>6.3} {:>+5.1}% {:>+6.1}us", m, o, per_launch_us);
        }
        let auto = chunks.iter().position(|&c| c == Chunk::Auto).and_then(|i| launches.get(i));
        let plans: Vec<Plan> = auto.map(|l| l.iter().filter_map(|w| w.last_plan()).collect()).unwrap_or_default();
        let auto_native_launches = plans.iter().filter(|p| **p == Plan::Native).count();
        let mut auto_chunks: Vec<u32> = plans
            .iter()
            .filter_map(|p| match p {
                Plan::Workers { chunk, .. } => Some(*chunk),
                Plan::Native => None,
            })
            .collect();
        auto_chunks.sort_unstable();
        auto_chunks.dedup();
        let mut block_ns = Vec::new();
        for l in &p.workload.launches {
            if block_ns.iter().any(|(k, _): &(String, f64)| k == l.kernel) {
                continue;
            }
            let key = ProfileKey { block: l.block, smem: l.shared_bytes };
            if let Some(bt) = p.worker_profiles().get(l.kernel, key).map(|t| t.block_ns) {
                block_ns.push((l.kernel.to_string(), bt));
            }
        }
        let bt: Vec<String> = block_ns.iter().map(|(k, b)| format!("{k} {:.2}us", b / 1000.0)).collect();
        println!(
            " {:>6.1}% {:>6}  auto: {} native, chunks {:?}, block {}",
            spread,
            equal,
            auto_native_launches,
            auto_chunks,
            bt.join(" ")
        );
        rows.push(OverheadRow {
            app: app.name(),
            size: p.workload.size,
            launches: p.workload.launches.len(),
            blocks: p.workload.total_blocks(),
            native_ms,
            native_marked_ms,
            workers,
            native_spread_pct: spread,
            outputs_bitwise_equal: equal,
            workers_first_launch,
            auto_native_launches,
            auto_chunks,
            block_ns,
        });
    }
    for (i, c) in chunks.iter().enumerate() {
        let logs: Vec<f64> = rows.iter().map(|r| (r.workers[i].1 / r.native_ms).ln()).collect();
        let geo = (logs.iter().sum::<f64>() / logs.len().max(1) as f64).exp();
        let worst = rows.iter().map(|r| r.workers[i].2).fold(f64::MIN, f64::max);
        println!("chunk {c}: geomean overhead {:+.2}%, worst {:+.2}%", 100.0 * (geo - 1.0), worst);
    }
    Ok(rows)
}

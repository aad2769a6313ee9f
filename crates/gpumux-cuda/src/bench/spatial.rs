//! Spatial sharing: a memory-bound app (triad) and a compute-bound one (sgemm)
//! one after the other, together with the hardware's own block scheduling
//! (two streams), and together on disjoint SM sets through gpumux workers.

use super::median;
use crate::error::Result;
use crate::exec::Prepared;
use crate::preempt::{SmMask, WorkerLaunch};
use crate::runtime::{Event, Gpu, Stream};
use crate::suite::{self, App, Scale};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct SpatialRow {
    pub mode: String,
    /// Completion times from the common start, ms.
    pub mem_ms: f64,
    pub compute_ms: f64,
    pub mem_slowdown: f64,
    pub compute_slowdown: f64,
    pub stp: f64,
}

/// Runs both apps as configured and returns their completion times (ms) from a common start.
fn together(
    gpu: &Gpu,
    a: &Prepared,
    b: &Prepared,
    wa: &mut Option<Vec<WorkerLaunch>>,
    wb: &mut Option<Vec<WorkerLaunch>>,
    masks: (SmMask, SmMask),
) -> Result<(f64, f64)> {
    let (sa, sb) = (Stream::low(gpu)?, Stream::low(gpu)?);
    let (e0, ea, eb) = (Event::new()?, Event::new()?, Event::new()?);
    e0.record(&sa)?;
    sb.wait(&e0)?;
    match wa {
        Some(l) => a.enqueue_workers(l, &sa, masks.0)?,
        None => a.enqueue_native(&sa)?,
    }
    match wb {
        Some(l) => b.enqueue_workers(l, &sb, masks.1)?,
        None => b.enqueue_native(&sb)?,
    }
    ea.record(&sa)?;
    eb.record(&sb)?;
    ea.sync()?;
    eb.sync()?;
    if let Some(l) = wa {
        a.finish_workers(l)?;
    }
    if let Some(l) = wb {
        b.finish_workers(l)?;
    }
    Ok((e0.elapsed_ms(&ea)? as f64, e0.elapsed_ms(&eb)? as f64))
}

pub fn spatial(gpu: &Gpu, reps: u32, seed: u64) -> Result<Vec<SpatialRow>> {
    let n = gpu.sm_count();
    let a = Prepared::new(gpu, suite::build(App::Triad, Scale::Bench, seed))?;
    let b = Prepared::new(gpu, suite::build(App::Sgemm, Scale::Bench, seed))?;
    a.reset()?;
    b.reset()?;
    let all = SmMask::range(0, n);
    let mut wa = a.worker_launches(gpu, 4)?;
    let mut wb = b.worker_launches(gpu, 4)?;
    let time = |wa: &mut Option<Vec<WorkerLaunch>>,
                wb: &mut Option<Vec<WorkerLaunch>>,
                ma: SmMask,
                mb: SmMask|
     -> Result<(f64, f64)> {
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for r in 0..reps + 1 {
            let t = together(gpu, &a, &b, wa, wb, (ma, mb))?;
            if r > 0 {
                x.push(t.0);
                y.push(t.1);
            }
        }
        Ok((median(&mut x), median(&mut y)))
    };
    // Alone: each app's workers on the whole GPU.
    let alone = |p: &Prepared, w: &mut Vec<WorkerLaunch>| -> Result<f64> {
        let s = Stream::low(gpu)?;
        let (e0, e1) = (Event::new()?, Event::new()?);
        let mut v = Vec::new();
        for r in 0..reps + 1 {
            e0.record(&s)?;
            p.enqueue_workers(w, &s, all)?;
            e1.record(&s)?;
            e1.sync()?;
            p.finish_workers(w)?;
            if r > 0 {
                v.push(e0.elapsed_ms(&e1)? as f64);
            }
        }
        Ok(median(&mut v))
    };
    let ta = alone(&a, &mut wa)?;
    let tb = alone(&b, &mut wb)?;
    let (mut wa, mut wb) = (Some(wa), Some(wb));
    let mut rows = Vec::new();
    let row = |mode: String, ma: f64, mb: f64| SpatialRow {
        mode,
        mem_ms: ma,
        compute_ms: mb,
        mem_slowdown: ma / ta,
        compute_slowdown: mb / tb,
        stp: ta / ma + tb / mb,
    };
    println!("\n== spatial sharing: triad (memory-bound) + sgemm (compute-bound), completion from a common start ==");
    println!(
        "{:<28} {:>9} {:>11} {:>9} {:>9} {:>6}",
        "mode", "triad ms", "sgemm ms", "slow mem", "slow cmp", "STP"
    );
    let mut push = |r: SpatialRow| {
        println!(
            "{:<28} {:>9.2} {:>11.2} {:>9.2} {:>9.2} {:>6.2}",
            r.mode, r.mem_ms, r.compute_ms, r.mem_slowdown, r.compute_slowdown, r.stp
        );
        rows.push(r);
    };
    push(row("one after the other".into(), ta, ta + tb));
    let (na, nb) = time(&mut None, &mut None, all, all)?;
    push(row("together, hardware (2 streams)".into(), na, nb));
    for k in [n / 8, n / 4, n / 2] {
        let (x, y) = time(&mut wa, &mut wb, SmMask::range(0, k), SmMask::range(k, n))?;
        push(row(format!("gpumux triad {k} / sgemm {} SMs", n - k), x, y));
    }
    Ok(rows)
}

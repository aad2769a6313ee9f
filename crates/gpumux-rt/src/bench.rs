//! Throughput of the analysis and of each assignment method on sets of fixed size
//! (`gpumux rt bench`; the criterion bench in `benches/rt.rs` measures the same kernels).
//!
//! Sets of exactly `n` tasks are drawn with the paper's generator and scaled to a `U_G`
//! drawn uniformly in `[0.2, m_G]`, the range of Fig. 7, so that the mix of easy
//! (schedulable at once), hard (near the boundary) and hopeless sets resembles the
//! experiment's.

use std::time::Instant;

use serde::Serialize;

use crate::analysis::Analyzer;
use crate::assign::{assign_with, Method};
use crate::generate::{random_set, scale_to_gpu_utilisation, GenConfig};
use crate::model::{Mode, TaskSet};
use crate::rng::Rng;

/// One row: a method on sets of one size.
#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    /// Tasks per set.
    pub n: usize,
    /// Method name, or `analysis` for one single-mode schedulability test.
    pub method: String,
    /// Sets processed.
    pub sets: usize,
    /// Wall seconds on one thread.
    pub seconds: f64,
    /// Sets per second.
    pub sets_per_second: f64,
    /// Fraction of sets found schedulable.
    pub schedulable: f64,
}

/// Draws `count` sets of `n` tasks with `U_G ~ U[0.2, m_G]`.
pub fn bench_sets(n: usize, count: usize, seed: u64, gen: &GenConfig) -> Vec<TaskSet> {
    let mut rng = Rng::stream(seed, n as u64);
    (0..count)
        .map(|_| {
            let mut s = random_set(&mut rng, gen, n);
            let target = rng.uniform(0.2, gen.platform.gpus as f64);
            scale_to_gpu_utilisation(&mut s, target);
            s
        })
        .collect()
}

/// Runs the benchmark for every size in `sizes`.
pub fn run(sizes: &[usize], count: usize, seed: u64, gen: &GenConfig) -> Vec<BenchRow> {
    let mut rows = Vec::new();
    for &n in sizes {
        let sets = bench_sets(n, count, seed, gen);
        let mut an = Analyzer::new();
        let t0 = Instant::now();
        let mut ok = 0usize;
        for s in &sets {
            ok += an.schedulable(s, &vec![Mode::Single; s.len()]) as usize;
        }
        rows.push(row(n, "analysis", count, t0.elapsed().as_secs_f64(), ok));
        for m in Method::ALL {
            let t0 = Instant::now();
            let mut ok = 0usize;
            for s in &sets {
                ok += assign_with(s, m, &mut an).schedulable as usize;
            }
            rows.push(row(n, m.name(), count, t0.elapsed().as_secs_f64(), ok));
        }
    }
    rows
}

fn row(n: usize, method: &str, sets: usize, seconds: f64, ok: usize) -> BenchRow {
    BenchRow {
        n,
        method: method.into(),
        sets,
        seconds,
        sets_per_second: sets as f64 / seconds.max(1e-12),
        schedulable: ok as f64 / sets.max(1) as f64,
    }
}

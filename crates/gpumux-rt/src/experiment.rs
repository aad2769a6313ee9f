//! Reproduction of the paper's simulation (seed 004, IV-D): Fig. 7 (schedulability of each
//! method normalised to GLOBAL vs. `U_G`, `P_D = 0`) and Fig. 8 (number of schedulable sets
//! vs. `P_D` at `U_G = 1.2`).
//!
//! Every set is run through every method; results do not depend on the number of worker
//! threads (sets are generated sequentially from the seed, evaluated independently, and
//! aggregated in order). The run also counts *violations* — sets some heuristic schedules
//! but GLOBAL does not — which must be zero since GLOBAL is exact.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use gpumux_jobs::JobPool;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::analysis::Analyzer;
use crate::assign::{assign_with, Method};
use crate::generate::{set_near_utilisation, GenConfig, GrowingSets};
use crate::model::TaskSet;
use crate::rng::Rng;

/// Number of methods compared.
pub const NM: usize = Method::ALL.len();

/// Index of GLOBAL in [`Method::ALL`].
pub const GLOBAL: usize = 4;

/// Outcome of all methods on one set.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetOutcome {
    /// Schedulable under each method of [`Method::ALL`].
    pub ok: [bool; NM],
    /// `U_G` of the set.
    pub ug: f64,
    /// Number of tasks.
    pub n: usize,
}

/// Runs every method on `set`, adding the time each took to `time`.
pub fn evaluate(set: &TaskSet, an: &mut Analyzer, time: &mut [Duration; NM]) -> SetOutcome {
    let mut ok = [false; NM];
    for (k, m) in Method::ALL.iter().enumerate() {
        let t0 = Instant::now();
        ok[k] = assign_with(set, *m, an).schedulable;
        time[k] += t0.elapsed();
    }
    SetOutcome { ok, ug: set.gpu_utilisation(), n: set.len() }
}

/// Evaluates `sets` on `jobs` threads; outcomes in input order.
pub fn evaluate_all(sets: &[TaskSet], jobs: usize, time: &mut [Duration; NM]) -> Vec<SetOutcome> {
    /// A worker's analyser (reused from set to set) and the time it spent per method.
    struct Worker {
        an: Analyzer,
        time: [Duration; NM],
    }
    let new_worker = || Worker { an: Analyzer::new(), time: [Duration::ZERO; NM] };
    let Ok((outcomes, workers)) = JobPool::new(jobs)
        .map_with(sets, new_worker, |w, set| Ok::<_, Infallible>(evaluate(set, &mut w.an, &mut w.time)));
    for w in workers {
        for (total, t) in time.iter_mut().zip(w.time) {
            *total += t;
        }
    }
    outcomes
}

fn progress(len: u64, msg: &str, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    if let Ok(style) = ProgressStyle::with_template("{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({eta})") {
        pb.set_style(style);
    }
    pb.set_message(msg.to_string());
    pb
}

/// Throughput of each method over a run.
#[derive(Clone, Debug, Serialize)]
pub struct MethodTiming {
    /// Method name.
    pub method: String,
    /// Total seconds spent in the method (summed over threads).
    pub seconds: f64,
    /// Sets per second of one core.
    pub sets_per_second: f64,
}

fn timings(time: &[Duration; NM], sets: u64) -> Vec<MethodTiming> {
    Method::ALL
        .iter()
        .zip(time)
        .map(|(m, t)| MethodTiming {
            method: m.name().into(),
            seconds: t.as_secs_f64(),
            sets_per_second: sets as f64 / t.as_secs_f64().max(1e-12),
        })
        .collect()
}

/// Common experiment options.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Number of task sets (Fig. 7: total; Fig. 8: per `P_D` value).
    pub sets: usize,
    /// Seed.
    pub seed: u64,
    /// Worker threads.
    pub jobs: usize,
    /// Hide progress bars.
    pub quiet: bool,
    /// Generator parameters.
    pub gen: GenConfig,
}

/// One `U_G` bin of Fig. 7.
#[derive(Clone, Debug, Serialize)]
pub struct Fig7Bin {
    /// Lower edge of the bin (exclusive).
    pub ug_lo: f64,
    /// Upper edge (inclusive).
    pub ug_hi: f64,
    /// Sets in the bin.
    pub sets: u64,
    /// Schedulable sets per method (order of `methods`).
    pub schedulable: Vec<u64>,
    /// `schedulable / schedulable(GLOBAL)`; `None` where GLOBAL schedules none.
    pub normalised: Vec<Option<f64>>,
}

/// Fig. 7 result.
#[derive(Clone, Debug, Serialize)]
pub struct Fig7Result {
    /// Method names.
    pub methods: Vec<String>,
    /// Sets evaluated.
    pub sets: u64,
    /// Seed.
    pub seed: u64,
    /// Generator parameters.
    pub generator: GenConfig,
    /// Bins of width 0.2 over `(0, m_G]`.
    pub bins: Vec<Fig7Bin>,
    /// Schedulable sets per method over all bins.
    pub total_schedulable: Vec<u64>,
    /// Largest `1 − GEMA/GLOBAL` over bins with at least 100 GLOBAL-schedulable sets.
    pub gema_max_loss: f64,
    /// `1 − GEMA/GLOBAL` over all sets.
    pub gema_overall_loss: f64,
    /// Same two numbers for GEMA-LS.
    pub gema_ls_max_loss: f64,
    /// See `gema_ls_max_loss`.
    pub gema_ls_overall_loss: f64,
    /// Sets schedulable by a heuristic but not by GLOBAL (must be 0).
    pub violations: u64,
    /// Per-method throughput.
    pub timing: Vec<MethodTiming>,
    /// Largest task count seen.
    pub max_tasks: usize,
}

/// Bin width of Fig. 7's x axis.
pub const FIG7_BIN: f64 = 0.2;

fn violations(o: &SetOutcome) -> bool {
    !o.ok[GLOBAL] && o.ok.iter().any(|&b| b)
}

/// Runs Fig. 7.
pub fn fig7(opts: &RunOptions) -> Fig7Result {
    let mut gen = opts.gen;
    gen.p_dep = 0.0;
    let max_ug = gen.platform.gpus as f64;
    let nbins = (max_ug / FIG7_BIN).ceil() as usize;
    let mut counts = vec![(0u64, [0u64; NM]); nbins];
    let mut time = [Duration::ZERO; NM];
    let mut viol = 0;
    let mut max_tasks = 0;
    let mut stream = GrowingSets::new(opts.seed, gen, max_ug);
    let pb = progress(opts.sets as u64, "fig7", opts.quiet);
    let chunk = 512.max(opts.jobs * 64);
    let mut done = 0usize;
    while done < opts.sets {
        let take = chunk.min(opts.sets - done);
        let sets: Vec<TaskSet> = stream.by_ref().take(take).collect();
        if sets.is_empty() {
            break;
        }
        let outs = evaluate_all(&sets, opts.jobs, &mut time);
        for o in &outs {
            let b = (((o.ug / FIG7_BIN).ceil() as usize).max(1) - 1).min(nbins - 1);
            counts[b].0 += 1;
            for k in 0..NM {
                counts[b].1[k] += o.ok[k] as u64;
            }
            viol += violations(o) as u64;
            max_tasks = max_tasks.max(o.n);
        }
        done += sets.len();
        pb.set_position(done as u64);
    }
    pb.finish_and_clear();
    let bins: Vec<Fig7Bin> = counts
        .iter()
        .enumerate()
        .map(|(b, (n, s))| Fig7Bin {
            ug_lo: b as f64 * FIG7_BIN,
            ug_hi: (b + 1) as f64 * FIG7_BIN,
            sets: *n,
            schedulable: s.to_vec(),
            normalised: s.iter().map(|&x| (s[GLOBAL] > 0).then(|| x as f64 / s[GLOBAL] as f64)).collect(),
        })
        .collect();
    let mut total = [0u64; NM];
    for (_, s) in &counts {
        for k in 0..NM {
            total[k] += s[k];
        }
    }
    let loss = |k: usize| -> (f64, f64) {
        let max = counts
            .iter()
            .filter(|(_, s)| s[GLOBAL] >= 100)
            .map(|(_, s)| 1.0 - s[k] as f64 / s[GLOBAL] as f64)
            .fold(0.0, f64::max);
        let overall = if total[GLOBAL] > 0 { 1.0 - total[k] as f64 / total[GLOBAL] as f64 } else { 0.0 };
        (max, overall)
    };
    let (gm, go) = loss(2);
    let (lm, lo) = loss(3);
    Fig7Result {
        methods: Method::ALL.iter().map(|m| m.name().to_string()).collect(),
        sets: done as u64,
        seed: opts.seed,
        generator: gen,
        bins,
        total_schedulable: total.to_vec(),
        gema_max_loss: gm,
        gema_overall_loss: go,
        gema_ls_max_loss: lm,
        gema_ls_overall_loss: lo,
        violations: viol,
        timing: timings(&time, done as u64),
        max_tasks,
    }
}

/// One `P_D` point of Fig. 8.
#[derive(Clone, Debug, Serialize)]
pub struct Fig8Point {
    /// Probability of inter-kernel data dependency.
    pub p_dep: f64,
    /// Sets evaluated.
    pub sets: u64,
    /// Schedulable sets per method.
    pub schedulable: Vec<u64>,
}

/// Fig. 8 result.
#[derive(Clone, Debug, Serialize)]
pub struct Fig8Result {
    /// Method names.
    pub methods: Vec<String>,
    /// Target `U_G`.
    pub ug: f64,
    /// Accepted `U_G` window half-width.
    pub ug_tolerance: f64,
    /// Sets per point.
    pub sets_per_point: u64,
    /// Seed (same for every point: common random numbers).
    pub seed: u64,
    /// Generator parameters (`p_dep` varies).
    pub generator: GenConfig,
    /// Points for `P_D = 0, 0.1, …, 1`.
    pub points: Vec<Fig8Point>,
    /// Sets schedulable by a heuristic but not by GLOBAL (must be 0).
    pub violations: u64,
    /// Per-method throughput.
    pub timing: Vec<MethodTiming>,
}

/// `U_G` of Fig. 8.
pub const FIG8_UG: f64 = 1.2;
/// Half-width of the accepted `U_G` window around [`FIG8_UG`].
pub const FIG8_TOL: f64 = 0.05;

/// Runs Fig. 8.
pub fn fig8(opts: &RunOptions) -> Fig8Result {
    let mut time = [Duration::ZERO; NM];
    let mut points = Vec::new();
    let mut viol = 0;
    let pb = progress(opts.sets as u64 * 11, "fig8", opts.quiet);
    for step in 0..=10 {
        let mut gen = opts.gen;
        gen.p_dep = step as f64 / 10.0;
        let mut rng = Rng::new(opts.seed);
        let mut sched = [0u64; NM];
        let mut done = 0usize;
        let chunk = 512.max(opts.jobs * 64);
        while done < opts.sets {
            let take = chunk.min(opts.sets - done);
            let sets: Vec<TaskSet> =
                (0..take).map(|_| set_near_utilisation(&mut rng, &gen, FIG8_UG, FIG8_TOL)).collect();
            let outs = evaluate_all(&sets, opts.jobs, &mut time);
            for o in &outs {
                for (acc, ok) in sched.iter_mut().zip(o.ok) {
                    *acc += ok as u64;
                }
                viol += violations(o) as u64;
            }
            done += take;
            pb.inc(take as u64);
        }
        points.push(Fig8Point { p_dep: gen.p_dep, sets: done as u64, schedulable: sched.to_vec() });
    }
    pb.finish_and_clear();
    let total = opts.sets as u64 * 11;
    Fig8Result {
        methods: Method::ALL.iter().map(|m| m.name().to_string()).collect(),
        ug: FIG8_UG,
        ug_tolerance: FIG8_TOL,
        sets_per_point: opts.sets as u64,
        seed: opts.seed,
        generator: opts.gen,
        points,
        violations: viol,
        timing: timings(&time, total),
    }
}

//! How much a `gpumux run` will simulate, estimated before it starts, so a
//! small file that would run for hours stops at once with the estimate and
//! the flag that allows it (`--max-work`), and so progress can show an ETA.
//!
//! The unit is one simulated block. An operation (kernel launch, copy, host
//! op, sync) costs [`OP_COST`] blocks' worth of simulator time and each
//! process of a run [`PROCESS_COST`] (setting up its engine state), both
//! measured on the build host (docs/benchmarks.md, "Process-count scaling").
//! The estimate is deterministic: the same workload, device and policies give
//! the same number on every machine, so the limit does not depend on load.

use anyhow::{bail, Result};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::model::{Op, ProcessSpec, Workload};

/// Simulator time of one operation, in blocks (measured: about 1 µs per
/// operation against 6-7 M blocks/s; rounded up).
pub const OP_COST: f64 = 8.0;
/// Simulator time per process per run (engine and device state), in blocks.
pub const PROCESS_COST: f64 = 100.0;
/// Simulated blocks per second of one core, for turning work into time in
/// messages (`gpumux bench sim`: 5.3-7.9 M/s on the build host).
pub const BLOCKS_PER_SECOND: f64 = 6.0e6;
/// Default `--max-work`: 10^9 blocks, about three minutes of one core.
pub const DEFAULT_MAX_WORK_ARG: &str = "1e9";

/// The estimated work of a run: every isolated run and every policy's run.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Simulated blocks, summed over all runs.
    pub blocks: f64,
    /// Operations, summed over all runs.
    pub ops: f64,
    /// Work of all runs together, in blocks ([`OP_COST`], [`PROCESS_COST`]).
    pub total: f64,
    /// Work of the largest single run (runs are not split across threads).
    pub largest_run: f64,
    /// Runs counted: one isolated run per process, one per policy.
    pub runs: usize,
}

impl Estimate {
    /// Wall time on `threads` cores at [`BLOCKS_PER_SECOND`] each.
    pub fn seconds(&self, threads: usize) -> f64 {
        (self.total / (BLOCKS_PER_SECOND * threads.max(1) as f64)).max(self.largest_run / BLOCKS_PER_SECOND)
    }
}

/// One process's operation sequence, counted once.
struct PerRun {
    blocks: f64,
    ops: f64,
    /// A lower bound of its time alone on `info`, in ns (replay ratios).
    ns: f64,
}

fn per_run(p: &ProcessSpec, info: &DeviceInfo) -> PerRun {
    let mut r = PerRun { blocks: 0.0, ops: p.ops.len() as f64, ns: 0.0 };
    for op in &p.ops {
        match op {
            Op::Kernel(k) => {
                let blocks = k.shape.blocks as f64;
                r.blocks += blocks;
                // Full waves of resident blocks on every SM, each a mean block
                // time (none known: no time, still a lower bound).
                let slots = info.blocks_per_sm(k).unwrap_or(1).max(1) as f64 * info.num_sms.max(1) as f64;
                let block_ns = k.sim_timing.map_or(0, |t| t.block_time_ns);
                r.ns += (blocks / slots).ceil() * block_ns as f64;
            }
            Op::CopyToDevice { bytes } | Op::CopyToHost { bytes } => {
                r.ns += info.pcie_latency_ns as f64 + *bytes as f64 / info.pcie_bandwidth.max(1.0) * 1e9;
            }
            Op::Cpu { ns } => r.ns += *ns as f64,
            // Orders, no work (a wait may add time; a lower bound leaves it out).
            Op::Sync | Op::Record { .. } | Op::WaitEvent { .. } => {}
        }
    }
    r
}

/// Estimates the work of the isolated runs plus `policies` shared runs.
/// Fails when the workload can never end: with `replay_min_runs`, a process
/// whose run takes no simulated time replays forever at one instant.
pub fn estimate(w: &Workload, info: &DeviceInfo, policies: usize) -> Result<Estimate> {
    let runs: Vec<PerRun> = w.processes.iter().map(|p| per_run(p, info)).collect();
    let cost = |r: &PerRun| r.blocks + OP_COST * r.ops;
    let n = w.processes.len() as f64;
    // Runs per process: alone, and under a policy.
    let (alone_runs, shared_runs): (Vec<f64>, Vec<f64>) = match w.replay_min_runs {
        None => w.processes.iter().map(|p| (p.repetitions.max(1) as f64, p.repetitions.max(1) as f64)).unzip(),
        Some(min) => {
            let min = min as f64;
            let slowest = runs.iter().map(|r| r.ns).fold(0.0, f64::max);
            // A run that takes no time replays at one instant for ever while
            // any other process is still short of runs at a later time.
            let ends = |p: &ProcessSpec, r: &PerRun| p.arrival_ns as f64 + r.ns;
            let last_end = w.processes.iter().zip(&runs).map(|(p, r)| ends(p, r)).fold(0.0, f64::max);
            for (p, r) in w.processes.iter().zip(&runs) {
                if r.ns <= 0.0 && ends(p, r) < last_end {
                    bail!(
                        "process `{}` takes no simulated time per run (only zero-length host ops), so with \
                         replay_min_runs it would replay forever at one instant while the others finish \
                         their runs; give it some work or drop replay_min_runs",
                        p.name
                    );
                }
            }
            // Everyone replays until the slowest has its runs: a faster process
            // fits about slowest/own times as many (contention slows all alike).
            runs.iter().map(|r| (min, if r.ns > 0.0 { (min * slowest / r.ns).max(min) } else { min })).unzip()
        }
    };
    let mut e = Estimate { blocks: 0.0, ops: 0.0, total: 0.0, largest_run: 0.0, runs: w.processes.len() + policies };
    let mut shared = PROCESS_COST * n;
    for ((r, a), s) in runs.iter().zip(&alone_runs).zip(&shared_runs) {
        let alone = PROCESS_COST + a * cost(r);
        e.largest_run = e.largest_run.max(alone);
        e.total += alone;
        e.blocks += a * r.blocks + policies as f64 * s * r.blocks;
        e.ops += a * r.ops + policies as f64 * s * r.ops;
        shared += s * cost(r);
    }
    if policies > 0 {
        e.largest_run = e.largest_run.max(shared);
    }
    e.total += policies as f64 * shared;
    Ok(e)
}

/// Refuses a run whose estimate is above `max_work` (`--max-work`), saying
/// how large it is and how to allow it.
pub fn check(e: &Estimate, max_work: f64, threads: usize) -> Result<()> {
    if e.total <= max_work {
        return Ok(());
    }
    bail!(
        "this run would simulate about {} blocks and {} operations over its {} runs (each process alone, then \
         each policy): estimated work {}, about {} on {} core{} at ~{} M blocks/s per core, over the limit of {} \
         (--max-work). Pass --max-work {} to run it anyway, or --max-work unlimited; or shrink the workload \
         (fewer blocks, repetitions, replay_min_runs, processes or policies)",
        sci(e.blocks),
        sci(e.ops),
        e.runs,
        sci(e.total),
        duration(e.seconds(threads)),
        threads.max(1),
        if threads > 1 { "s" } else { "" },
        BLOCKS_PER_SECOND / 1e6,
        sci(max_work),
        sci_up(e.total),
    );
}

/// `--max-work`: a positive number of blocks (`1e10`, `2500000000`) or `unlimited`.
pub fn parse_max_work(s: &str) -> Result<f64, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("unlimited") || s.eq_ignore_ascii_case("none") {
        return Ok(f64::INFINITY);
    }
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!("expected a number of blocks >= 1 (e.g. 1e10) or `unlimited`, got {s:?}")),
    }
}

/// 3.1e12-style, two significant digits.
pub fn sci(v: f64) -> String {
    if !v.is_finite() {
        return "unlimited".into();
    }
    if v < 1e5 {
        return format!("{v:.0}");
    }
    format!("{v:.1e}")
}

/// Like `sci`, rounded up so that passing it back as `--max-work` is enough.
fn sci_up(v: f64) -> String {
    if v < 1e5 {
        return format!("{:.0}", v.ceil());
    }
    let mut exp = v.log10().floor() as i32;
    // Two significant digits, rounded up (with a hair of margin for the
    // division's rounding), so the printed value is never below `v`.
    let mut digits = (v / 10f64.powi(exp - 1) * (1.0 + 1e-12)).ceil();
    if digits >= 100.0 {
        digits = (digits / 10.0).ceil();
        exp += 1;
    }
    format!("{:.1}e{exp}", digits / 10.0)
}

/// 45 s, 12 min, 3.4 h, 2.9 days.
pub fn duration(s: f64) -> String {
    match s {
        s if !s.is_finite() => "forever".into(),
        s if s < 90.0 => format!("{s:.0} s"),
        s if s < 5400.0 => format!("{:.0} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} days", s / 86_400.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_sim::presets;

    fn workload(text: &str) -> Workload {
        gpumux_workload::parse_str(text, "<test>").expect("valid workload")
    }

    const KERNEL: &str = "[[process.op]]\nkind = \"kernel\"\nname = \"k\"\nblock = 128\nregs_per_thread = 32\n\
                          block_time_us = 10.0\n";

    #[test]
    fn counts_blocks_and_ops_of_every_run() {
        let w = workload(&format!("[[process]]\nname = \"a\"\nrepetitions = 3\n{KERNEL}grid = 1000\n"));
        let e = estimate(&w, &presets::h100(), 2).expect("estimate");
        // 3 runs alone + 3 runs under each of 2 policies, 1000 blocks and 1 op each.
        assert_eq!(e.blocks, 9_000.0);
        assert_eq!(e.ops, 9.0);
        assert_eq!(e.total, 9.0 * (1000.0 + OP_COST) + 3.0 * PROCESS_COST);
    }

    #[test]
    fn replay_counts_the_extra_runs_of_faster_processes() {
        let text = format!(
            "replay_min_runs = 2\n[[process]]\nname = \"slow\"\n{KERNEL}grid = 1000000\n\
             [[process]]\nname = \"fast\"\n{KERNEL}grid = 1\n"
        );
        let e = estimate(&workload(&text), &presets::h100(), 1).expect("estimate");
        // h100: 132 SMs × 16 blocks of 128 threads: the slow run is 474 waves, the fast one 1.
        let fast_runs = 2.0 * 474.0;
        assert_eq!(e.blocks, 2.0 * 1e6 + 2.0 + 2.0 * 1e6 + fast_runs);
    }

    #[test]
    fn a_zero_time_process_cannot_be_replayed() {
        let text = "replay_min_runs = 1\n[[process]]\nname = \"a\"\n[[process.op]]\nkind = \"cpu\"\nus = 0\n\
                    [[process]]\nname = \"b\"\n[[process.op]]\nkind = \"cpu\"\nus = 10\n";
        let err = estimate(&workload(text), &presets::h100(), 1).expect_err("never ends").to_string();
        assert!(err.contains("process `a` takes no simulated time"), "{err}");
    }

    #[test]
    fn the_limit_names_the_estimate_and_the_flag() {
        let e = Estimate { blocks: 3.14e12, ops: 9.0, total: 3.14e12, largest_run: 3.14e12, runs: 9 };
        let default = parse_max_work(DEFAULT_MAX_WORK_ARG).expect("the default parses");
        assert_eq!(default, 1e9);
        let err = check(&e, default, 2).expect_err("over the limit").to_string();
        assert!(err.contains("about 3.1e12 blocks and 9 operations over its 9 runs"), "{err}");
        assert!(err.contains("estimated work 3.1e12"), "{err}");
        assert!(err.contains("--max-work 3.2e12"), "{err}");
        assert!(err.contains("6.1 days"), "{err}");
        // What it suggests is enough.
        assert!(check(&e, parse_max_work("3.2e12").expect("number"), 2).is_ok());
        assert_eq!(sci_up(9.95e9), "1.0e10");
        assert!(check(&e, f64::INFINITY, 2).is_ok());
    }

    #[test]
    fn max_work_parses_numbers_and_unlimited() {
        assert_eq!(parse_max_work("1e10"), Ok(1e10));
        assert_eq!(parse_max_work("2500000000"), Ok(2.5e9));
        assert_eq!(parse_max_work("unlimited"), Ok(f64::INFINITY));
        for bad in ["0", "-5", "nan", "inf", "lots", ""] {
            assert!(parse_max_work(bad).is_err(), "{bad:?} accepted");
        }
    }
}

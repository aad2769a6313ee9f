//! `gpumux rt run TASKSET.toml`: a GPU-SPARC task set run for real through gpumuxd
//! (issue 38, item 4; docs/rt.md, "Running a task set for real").
//!
//! The modes come from an assignment method (`gpumux_rt::assign`, GEMA by default); each
//! task is a thread that releases a job every period and runs its pipeline of subtasks
//! through gpumuxd, one connection per GPU ([`lanes`]); the bus and the GPUs are granted in
//! priority order ([`arbiter`]); copies and kernels are sized by a calibration at start
//! ([`calibrate`], [`subtasks`]); releases are absolute ([`schedule`], [`tasks`]); the
//! table puts each task's measured worst response beside the analysis's bound ([`report`]).
//! A task the analysis bounds that goes over its bound is a VIOLATION: the run says so
//! and exits non-zero.

pub mod arbiter;
pub mod calibrate;
pub mod lanes;
pub mod report;
pub mod schedule;
pub mod subtasks;
pub mod tasks;

use anyhow::{bail, Context, Result};
use gpumux_rt::analysis::{Analyzer, MAX_ITERATIONS};
use gpumux_rt::assign::{assign_with, Method};
use gpumux_rt::{Mode, TaskSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::bench_daemon::procs::Daemon;
use arbiter::Arbiter;
use lanes::{Lane, MAX_PIECE};
use subtasks::{Runner, MULTI_GPUS};

/// Where single-mode kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dispatch {
    /// On whichever GPU is free, highest priority first: what the analysis assumes.
    Global,
    /// Each task on a GPU of its own choosing (worst fit by GPU utilisation), as the
    /// paper's prototype ran Table IV in single mode. The analysis does not model it.
    Partitioned,
}

/// `gpumux rt run`'s arguments.
#[derive(clap::Args, Debug)]
pub struct RtRunArgs {
    /// TOML task-set file (times in ms; docs/rt.md).
    pub file: PathBuf,
    /// How execution modes are assigned.
    #[arg(long, value_enum, default_value_t = Method::Gema)]
    pub method: Method,
    /// Seconds during which jobs are released (each released job runs to its end).
    #[arg(long, default_value_t = 10.0, value_parser = seconds)]
    pub seconds: f64,
    /// A running gpumuxd's socket. Without it a daemon is started on --device.
    #[arg(long, conflicts_with = "device")]
    pub daemon: Option<PathBuf>,
    /// The device of the daemon started here: `sim:h100x2`, `cuda:0,1`, `cuda:all`.
    /// Default: cuda:all when a CUDA driver is present, else sim:h100x2.
    #[arg(long)]
    pub device: Option<String>,
    /// Milliseconds per time unit of the file (0.1 runs a set of ms ten times faster, with
    /// the same analysis verdicts).
    #[arg(long, default_value_t = 1.0, value_parser = unit_ms)]
    pub unit_ms: f64,
    /// The share of each stated time a subtask aims at (a stated time is a worst case).
    #[arg(long, default_value_t = 0.9, value_parser = fill)]
    pub fill: f64,
    /// Where single-mode kernels run.
    #[arg(long, value_enum, default_value_t = Dispatch::Global)]
    pub dispatch: Dispatch,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn seconds(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("`{s}` is not a number of seconds: {e}"))?;
    if v > 0.0 && v <= 86_400.0 {
        Ok(v)
    } else {
        Err(format!("{v} s: expected more than 0 and at most 86400"))
    }
}

fn unit_ms(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("`{s}` is not a number of ms: {e}"))?;
    if (0.001..=1000.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} ms: expected 0.001 to 1000"))
    }
}

fn fill(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("`{s}` is not a number: {e}"))?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{v}: expected more than 0 and at most 1"))
    }
}

/// Runs the command: prints the table, writes the JSON, fails on a violation.
pub fn run(args: RtRunArgs) -> Result<()> {
    crate::preflight::output_file("--json", args.json.as_deref())?;
    let set = TaskSet::from_file(&args.file)?;
    let mut an = Analyzer::new();
    let assignment = assign_with(&set, args.method, &mut an);
    let analysis = an.analyze(&set, &assignment.modes, MAX_ITERATIONS);

    // A daemon: the one given, or one started here and stopped on the way out.
    let dir = std::env::temp_dir().join(format!("gpumux-rt-run-{}", std::process::id()));
    let mut started: Option<Daemon> = None;
    let socket = match &args.daemon {
        Some(s) => s.clone(),
        None => {
            let device = args.device.clone().unwrap_or_else(|| {
                if gpumux_cuda::runtime::driver_present() {
                    "cuda:all".into()
                } else {
                    "sim:h100x2".into()
                }
            });
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let exe = std::env::current_exe().context("finding this executable")?;
            let log = dir.join("gpumuxd.log");
            let d = Daemon::start(&exe, &device, gpumuxd::core::DEFAULT_POLICY, &[], &dir, &log)
                .with_context(|| format!("starting gpumuxd on {device}"))?;
            let socket = d.socket.clone();
            started = Some(d);
            socket
        }
    };
    let result = run_on(&args, &set, &assignment.modes, &analysis, &socket);
    drop(started);
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    print!("{}", report::render(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if report.violations + report.overruns > 0 {
        bail!(
            "{} task(s) went over the analysis's bound or lost jobs (the VIOLATION lines above)",
            report.violations + report.overruns
        );
    }
    Ok(())
}

fn run_on(
    args: &RtRunArgs,
    set: &TaskSet,
    modes: &[Mode],
    analysis: &gpumux_rt::Analysis,
    socket: &Path,
) -> Result<report::RunReport> {
    let (served, welcome) = lanes::gpu_count(socket)?;
    let gpus = set.platform.gpus as usize;
    if gpus > served {
        bail!(
            "{}: the task set's platform has {gpus} GPUs, gpumuxd at {} serves {served} ({}): \
             start it on more (--device cuda:0,1 or sim:h100x2) or set [platform] gpus = {served}",
            args.file.display(),
            socket.display(),
            welcome.device
        );
    }
    if modes.contains(&Mode::Multi) && gpus < MULTI_GPUS {
        bail!("multi mode needs {MULTI_GPUS} GPUs; the platform has {gpus}");
    }
    if set.platform.pci == 0 || gpus == 0 {
        bail!("the platform needs at least one PCI bus and one GPU");
    }

    // Calibration: every GPU alone, the slowest kept; one kernel grid for all.
    let mut fits: Option<calibrate::Fits> = None;
    let mut grid = u32::MAX;
    let mut simulated = false;
    for g in 0..gpus {
        let mut lane = Lane::open(socket, "rt-calibrate", g, 0, MAX_PIECE, 0)?;
        grid = grid.min(lane.grid);
        simulated |= lane.simulated();
        let f = calibrate::measure(&mut lane).with_context(|| format!("calibrating GPU {g}"))?;
        fits = Some(fits.map_or(f, |a| a.slower(f)));
    }
    let Some(fits) = fits else { bail!("no GPU to calibrate") };

    let max_priority = welcome.limits.max_priority;
    let homes = homes(set, args.dispatch, gpus);
    let gpu_arbiter = Arbiter::new(gpus);
    let bus = Arbiter::new(set.platform.pci as usize);
    let mut runners = Vec::new();
    let mut plans = Vec::new();
    for (rank, task) in set.tasks.iter().enumerate() {
        let mode = modes.get(rank).copied().unwrap_or(Mode::Single);
        let steps = subtasks::plan(task, mode, &fits, args.fill, args.unit_ms * 1e-3);
        let piece = subtasks::largest_copy(&steps);
        let priority = max_priority.saturating_sub(rank as i32);
        let mut task_lanes = Vec::new();
        for g in 0..gpus {
            task_lanes.push(Lane::open(socket, &format!("rt-{}", task.name), g, priority, piece, grid)?);
        }
        let pinned = args.dispatch == Dispatch::Partitioned;
        runners.push(Runner::new(task_lanes, &gpu_arbiter, &bus, rank, mode, homes[rank], pinned, !simulated));
        plans.push((steps, priority));
    }

    let unit_s = args.unit_ms * 1e-3;
    let longest = set.tasks.iter().map(|t| t.period).fold(0.0, f64::max) * unit_s;
    let grace = (2.0 * longest).max(1.0);
    let start = Instant::now() + Duration::from_millis(100);
    let outcomes: Vec<Result<tasks::Outcome>> = std::thread::scope(|scope| {
        let handles: Vec<_> = runners
            .iter_mut()
            .zip(&plans)
            .zip(&set.tasks)
            .map(|((runner, (steps, _)), task)| {
                let timing = tasks::Timing {
                    period_s: task.period * unit_s,
                    deadline_s: task.deadline * unit_s,
                    duration_s: args.seconds,
                    grace_s: grace,
                };
                scope.spawn(move || tasks::run(runner, steps, timing, start))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a task's thread panicked"))))
            .collect()
    });

    let mut done = Vec::new();
    for (rank, outcome) in outcomes.into_iter().enumerate() {
        let name = &set.tasks[rank].name;
        done.push(outcome.with_context(|| format!("task {name}"))?);
    }
    let periods_s: Vec<f64> = set.tasks.iter().map(|t| t.period * unit_s).collect();
    let rows: Vec<report::Row> = done
        .iter()
        .enumerate()
        .map(|(rank, o)| {
            let wrong = runners[rank].wrong_blocks;
            let allowance_ms = report::allowance(rank, &done, &periods_s) * 1e3;
            let mut launches = runners[rank].launches.clone();
            launches.resize(gpus, 0);
            let row = report::row(&analysis.tasks[rank], o, plans[rank].1, wrong, args.unit_ms, allowance_ms, launches);
            match (args.dispatch, row.verdict.clone()) {
                // The analysis is global: partitioned runs are compared with it, not judged by it.
                (Dispatch::Partitioned, report::Verdict::Violation(why) | report::Verdict::Overrun(why)) => {
                    report::Row {
                        verdict: report::Verdict::NotChecked(format!(
                            "partitioned dispatch, which the analysis does not model: {why}"
                        )),
                        ..row
                    }
                }
                _ => row,
            }
        })
        .collect();
    let violations = rows.iter().filter(|r| matches!(r.verdict, report::Verdict::Violation(_))).count();
    let overruns = rows.iter().filter(|r| matches!(r.verdict, report::Verdict::Overrun(_))).count();
    let misses = rows.iter().map(|r| r.misses).sum();
    Ok(report::RunReport {
        file: args.file.display().to_string(),
        method: args.method.name().to_string(),
        schedulable_by_analysis: analysis.schedulable,
        device: welcome.device.clone(),
        gpus,
        dispatch: format!("{:?}", args.dispatch).to_lowercase(),
        seconds: args.seconds,
        fill: args.fill,
        unit_ms: args.unit_ms,
        fits,
        tasks: rows,
        violations,
        overruns,
        misses,
    })
}

/// Each task's home GPU: where single-mode inputs go (and, partitioned, where its kernels
/// run). Global: spread by priority. Partitioned: worst fit, tasks by falling single-mode GPU
/// utilisation each to the GPU with the least so far (ties: the lower index).
fn homes(set: &TaskSet, dispatch: Dispatch, gpus: usize) -> Vec<usize> {
    let n = set.tasks.len();
    let gpus = gpus.max(1);
    match dispatch {
        Dispatch::Global => (0..n).map(|i| i % gpus).collect(),
        Dispatch::Partitioned => {
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| set.tasks[b].gpu_utilisation().total_cmp(&set.tasks[a].gpu_utilisation()));
            let mut load = vec![0.0f64; gpus];
            let mut home = vec![0; n];
            for i in order {
                let g = (0..gpus).min_by(|&a, &b| load[a].total_cmp(&load[b])).unwrap_or(0);
                load[g] += set.tasks[i].gpu_utilisation();
                home[i] = g;
            }
            home
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitioned_homes_are_a_worst_fit_by_gpu_utilisation() {
        let set = TaskSet::from_toml_str(
            r#"
            [platform]
            gpus = 2
            [[task]]
            name = "a"
            period = 100
            subtasks = [{ resource = "gpu", single = 50 }]
            [[task]]
            name = "b"
            period = 200
            subtasks = [{ resource = "gpu", single = 20 }]
            [[task]]
            name = "c"
            period = 300
            subtasks = [{ resource = "gpu", single = 150 }]
            "#,
            "inline.toml",
        )
        .unwrap();
        // Utilisations 0.5, 0.1, 0.5: a and c apart, b with the lighter of them (a, first).
        assert_eq!(homes(&set, Dispatch::Partitioned, 2), vec![0, 0, 1]);
        assert_eq!(homes(&set, Dispatch::Global, 2), vec![0, 1, 0]);
    }
}

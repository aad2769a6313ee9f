//! `gpumux rt …`: the command-line face of this crate. The `gpumux` binary embeds
//! [`RtCommand`] as a subcommand and calls [`run`]. Results go to stdout; progress bars to
//! stderr.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;

use crate::analysis::{Analysis, Analyzer, Status, MAX_ITERATIONS};
use crate::assign::{assign_with, Method};
use crate::cost::MultiCostModel;
use crate::experiment::{self, RunOptions, GLOBAL};
use crate::generate::{random_set, scale_to_gpu_utilisation, GenConfig};
use crate::model::TaskSet;
use crate::rng::Rng;
use crate::toml_io::MAX_TASKS;

/// Which figure of the paper to reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Figure {
    /// Schedulability normalised to GLOBAL vs. U_G, P_D = 0.
    Fig7,
    /// Schedulable sets vs. P_D at U_G = 1.2.
    Fig8,
}

/// `gpumux rt` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum RtCommand {
    /// Response-time analysis of a task-set file under the modes it declares (or a method's).
    Analyze {
        /// TOML task-set file.
        file: PathBuf,
        /// Analyse under the modes chosen by this method instead of the declared ones.
        #[arg(long, value_enum)]
        method: Option<Method>,
        /// Fixed-point steps per subtask before its closed-form bound is used instead
        /// (then reported `not converged` if that bound exceeds the deadline).
        #[arg(long, default_value_t = MAX_ITERATIONS, value_parser = clap::value_parser!(u32).range(1..))]
        max_iterations: u32,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Choose execution modes with a method and print the resulting analysis.
    Assign {
        /// TOML task-set file.
        file: PathBuf,
        /// Assignment method.
        #[arg(long, value_enum, default_value_t = Method::Gema)]
        method: Method,
        /// Compare every method instead (modes and verdict per method).
        #[arg(long, conflicts_with = "method")]
        all: bool,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Reproduce Fig. 7 or Fig. 8 of the GPU-SPARC paper.
    Experiment {
        /// Figure to reproduce.
        #[arg(value_enum)]
        figure: Figure,
        /// Task sets (fig7: in total, default 100000 as in the paper; fig8: per P_D value,
        /// default 10000).
        #[arg(long)]
        sets: Option<usize>,
        /// Generator seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Output folder for the SVG and JSON (default results/rt-fig7 or results/rt-fig8).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Worker threads (default: all cores). Results do not depend on it.
        #[arg(long)]
        jobs: Option<usize>,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
        /// WCET split weights `cpu,pci,gpu` (see docs/rt.md; default 0.03,0.03,1).
        #[arg(long, value_delimiter = ',')]
        weights: Option<Vec<f64>>,
        /// Longest non-preemptive section of GPU/PCI subtasks (our extension; default: the
        /// whole subtask, as in the paper).
        #[arg(long)]
        chunk: Option<f64>,
    },
    /// Sets per second of the analysis and of each method for sets of n tasks.
    Bench {
        /// Sets per size.
        #[arg(long, default_value_t = 300)]
        sets: usize,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Task-set sizes.
        #[arg(long, value_delimiter = ',', default_value = "5,10,20")]
        sizes: Vec<usize>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Write a random task set (paper IV-D generator) as TOML to stdout.
    Generate {
        /// Number of tasks.
        #[arg(long, default_value_t = 5)]
        tasks: usize,
        /// Scale the set to this total GPU utilisation.
        #[arg(long)]
        ug: Option<f64>,
        /// Probability of inter-kernel data dependency.
        #[arg(long, default_value_t = 0.0)]
        p_dep: f64,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Runs one `gpumux rt` command.
pub fn run(cmd: RtCommand) -> anyhow::Result<()> {
    let mut out = String::new();
    run_to(cmd, &mut out)?;
    print!("{out}");
    Ok(())
}

/// Runs one command, appending what it would print to `out` (used by tests).
pub fn run_to(cmd: RtCommand, out: &mut String) -> anyhow::Result<()> {
    match cmd {
        RtCommand::Analyze { file, method, max_iterations, json } => {
            let set = TaskSet::from_file(&file)?;
            let mut an = Analyzer::new();
            let modes = match method {
                Some(m) => assign_with(&set, m, &mut an).modes,
                None => set.declared_modes(),
            };
            let a = an.analyze(&set, &modes, max_iterations);
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&AnalyzeJson { file: &file, method, analysis: &a })?)?;
            } else {
                header(out, &file, &set);
                if let Some(m) = method {
                    writeln!(out, "modes chosen by: {m}")?;
                }
                table(out, &a);
                legend(out);
            }
        }
        RtCommand::Assign { file, method, all, json } => {
            let set = TaskSet::from_file(&file)?;
            let mut an = Analyzer::new();
            let methods: Vec<Method> = if all { Method::ALL.to_vec() } else { vec![method] };
            let mut results = Vec::new();
            for m in methods {
                let a = assign_with(&set, m, &mut an);
                let analysis = an.analyze(&set, &a.modes, MAX_ITERATIONS);
                results.push(AssignJson {
                    method: m,
                    modes: set
                        .tasks
                        .iter()
                        .zip(&a.modes)
                        .map(|(t, m)| (t.name.clone(), m.name().to_string()))
                        .collect(),
                    schedulable: a.schedulable,
                    analysis,
                });
            }
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&results)?)?;
            } else {
                header(out, &file, &set);
                for r in &results {
                    writeln!(out, "\nmethod {}:", r.method)?;
                    table(out, &r.analysis);
                }
                legend(out);
            }
        }
        RtCommand::Experiment { figure, sets, seed, out: dir, jobs, quiet, weights, chunk } => {
            let jobs = jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
            let (default_sets, default_dir) = match figure {
                Figure::Fig7 => (100_000, "results/rt-fig7"),
                Figure::Fig8 => (10_000, "results/rt-fig8"),
            };
            let mut gen = GenConfig::default();
            if let Some(w) = weights {
                anyhow::ensure!(
                    w.len() == 3 && w.iter().all(|x| x.is_finite() && *x >= 0.0) && w.iter().any(|x| *x > 0.0),
                    "--weights takes three non-negative numbers cpu,pci,gpu, not all zero"
                );
                gen.weights = crate::generate::ShareWeights { cpu: w[0], pci: w[1], gpu: w[2] };
            }
            if let Some(k) = chunk {
                anyhow::ensure!(k > 0.0 && k.is_finite(), "--chunk must be a positive number");
                gen.chunk = Some(k);
            }
            let opts = RunOptions { sets: sets.unwrap_or(default_sets), seed, jobs, quiet, gen };
            anyhow::ensure!(opts.sets > 0, "--sets must be at least 1");
            let dir = dir.unwrap_or_else(|| PathBuf::from(default_dir));
            // Before the experiment, which can take minutes, not after it.
            gpumux_files::output::check_dir(&dir).map_err(|why| anyhow::anyhow!("--out {}: {why}", dir.display()))?;
            let t0 = std::time::Instant::now();
            match figure {
                Figure::Fig7 => {
                    let r = experiment::fig7(&opts);
                    report_fig7(out, &r, t0.elapsed().as_secs_f64(), jobs)?;
                    write_json(&dir.join("fig7.json"), &r)?;
                    crate::plot::fig7_svg(&r, &dir.join("fig7.svg"))?;
                    writeln!(out, "wrote {} and {}", dir.join("fig7.json").display(), dir.join("fig7.svg").display())?;
                }
                Figure::Fig8 => {
                    let r = experiment::fig8(&opts);
                    report_fig8(out, &r, t0.elapsed().as_secs_f64(), jobs)?;
                    write_json(&dir.join("fig8.json"), &r)?;
                    crate::plot::fig8_svg(&r, &dir.join("fig8.svg"))?;
                    writeln!(out, "wrote {} and {}", dir.join("fig8.json").display(), dir.join("fig8.svg").display())?;
                }
            }
        }
        RtCommand::Bench { sets, seed, sizes, json } => {
            anyhow::ensure!(sets > 0, "--sets must be at least 1");
            if let Some(n) = sizes.iter().find(|n| !(1..=MAX_TASKS).contains(*n)) {
                anyhow::bail!("--sizes: every size must be a task count from 1 to {MAX_TASKS}, got {n}");
            }
            let rows = crate::bench::run(&sizes, sets, seed, &GenConfig::default());
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
            } else {
                writeln!(out, "{:>3}  {:<9} {:>12} {:>12}", "n", "method", "sets/s", "schedulable")?;
                for r in rows {
                    writeln!(
                        out,
                        "{:>3}  {:<9} {:>12.0} {:>11.1}%",
                        r.n,
                        r.method,
                        r.sets_per_second,
                        100.0 * r.schedulable
                    )?;
                }
            }
        }
        RtCommand::Generate { tasks, ug, p_dep, seed } => {
            anyhow::ensure!((1..=MAX_TASKS).contains(&tasks), "--tasks must be from 1 to {MAX_TASKS}, got {tasks}");
            anyhow::ensure!((0.0..=1.0).contains(&p_dep), "--p-dep must be in [0, 1]");
            let gen = GenConfig { p_dep, cost: MultiCostModel::default(), ..GenConfig::default() };
            let mut rng = Rng::new(seed);
            let mut set = random_set(&mut rng, &gen, tasks);
            if let Some(u) = ug {
                anyhow::ensure!(u > 0.0 && u.is_finite(), "--ug must be positive");
                scale_to_gpu_utilisation(&mut set, u);
            }
            writeln!(
                out,
                "# generated by `gpumux rt generate --tasks {tasks} --p-dep {p_dep} --seed {seed}`; U_G = {:.3}",
                set.gpu_utilisation()
            )?;
            out.push_str(&set.to_toml());
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct AnalyzeJson<'a> {
    file: &'a Path,
    method: Option<Method>,
    analysis: &'a Analysis,
}

#[derive(Serialize)]
struct AssignJson {
    method: Method,
    modes: Vec<(String, String)>,
    schedulable: bool,
    analysis: Analysis,
}

fn write_json<T: Serialize>(path: &Path, v: &T) -> anyhow::Result<()> {
    let s = serde_json::to_string_pretty(v)?;
    std::fs::write(path, s).with_context(|| format!("cannot write {}", path.display()))
}

fn header(out: &mut String, file: &Path, set: &TaskSet) {
    let p = set.platform;
    let _ = writeln!(
        out,
        "{}: {} tasks on {} CPUs, {} PCI bus(es), {} GPUs; U_G = {:.3}",
        file.display(),
        set.len(),
        p.cpus,
        p.pci,
        p.gpus,
        set.gpu_utilisation()
    );
}

fn fmt_opt(x: Option<f64>) -> String {
    x.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"))
}

fn table(out: &mut String, a: &Analysis) {
    let _ =
        writeln!(out, "{:>4}  {:<20} {:<6} {:>10} {:>10} {:>10}  verdict", "prio", "task", "mode", "R", "D", "slack");
    for t in &a.tasks {
        let verdict = match t.status {
            Status::Meets => "meets".to_string(),
            Status::Misses => "MISSES".to_string(),
            Status::NotConverged => format!("NOT CONVERGED ({})", t.note.as_deref().unwrap_or("")),
            Status::Diverges => format!("DIVERGES ({})", t.note.as_deref().unwrap_or("")),
            Status::NotAnalysed => format!("NOT ANALYSED ({})", t.note.as_deref().unwrap_or("")),
        };
        let _ = writeln!(
            out,
            "{:>4}  {:<20} {:<6} {:>10} {:>10.2} {:>10}  {}",
            t.priority,
            t.name,
            t.mode.name(),
            fmt_opt(t.response),
            t.deadline,
            fmt_opt(t.slack),
            verdict
        );
    }
    let _ = writeln!(
        out,
        "verdict: {}",
        if a.schedulable { "SCHEDULABLE (every task meets its deadline)" } else { "NOT SCHEDULABLE" }
    );
}

/// What the columns and verdicts mean. The analysis bounds response times
/// from above; a person reading MISSES must not take it for an observed miss.
const LEGEND: &str = "\
times in the task-set file's unit (the examples use ms).  R: upper bound on the end-to-end
response time (holistic analysis), - if none; D: deadline; slack = D - R.  meets: R <= D;
MISSES: the bound exceeds D; NOT CONVERGED: a fixed point was not reached within
--max-iterations steps and R is a looser closed-form bound above D (the exact bound may
meet D); DIVERGES: higher-priority work uses >= 100% of a resource, no finite bound;
NOT ANALYSED: below a diverging task. The analysis is sufficient, not exact: a set it
rejects may still meet its deadlines in practice (docs/rt.md compares with the GPU-SPARC
paper's runs).
";

fn legend(out: &mut String) {
    out.push_str(LEGEND);
}

fn report_fig7(out: &mut String, r: &experiment::Fig7Result, secs: f64, jobs: usize) -> anyhow::Result<()> {
    writeln!(
        out,
        "Fig. 7 — schedulability normalised to GLOBAL, P_D = 0 ({} sets, seed {}, largest set {} tasks)",
        r.sets, r.seed, r.max_tasks
    )?;
    write!(out, "{:>11} {:>7}", "U_G", "sets")?;
    for m in &r.methods {
        write!(out, " {:>9}", m)?;
    }
    writeln!(out, "   (normalised; GLOBAL column = schedulable sets)")?;
    for b in &r.bins {
        write!(out, "({:.1},{:.1}] {:>7}", b.ug_lo, b.ug_hi, b.sets)?;
        for (k, v) in b.normalised.iter().enumerate() {
            if k == GLOBAL {
                write!(out, " {:>9}", b.schedulable[k])?;
            } else {
                write!(out, " {:>9}", v.map_or_else(|| "-".into(), |x| format!("{x:.4}")))?;
            }
        }
        writeln!(out)?;
    }
    write!(out, "{:>11} {:>7}", "all", r.sets)?;
    for s in &r.total_schedulable {
        write!(out, " {:>9}", s)?;
    }
    writeln!(out, "   (schedulable sets)")?;
    writeln!(
        out,
        "paper: GEMA loses at most 1.4% to GLOBAL.  ours: GEMA max loss per bin {:.2}% (bins with >= 100 GLOBAL-schedulable sets), overall {:.2}%",
        100.0 * r.gema_max_loss,
        100.0 * r.gema_overall_loss
    )?;
    writeln!(
        out,
        "ours: GEMA-LS max loss per bin {:.2}%, overall {:.2}%",
        100.0 * r.gema_ls_max_loss,
        100.0 * r.gema_ls_overall_loss
    )?;
    writeln!(out, "sets a heuristic schedules but GLOBAL does not: {} (must be 0)", r.violations)?;
    timing_lines(out, &r.timing, secs, jobs)
}

fn timing_lines(out: &mut String, t: &[experiment::MethodTiming], secs: f64, jobs: usize) -> anyhow::Result<()> {
    write!(out, "time: {secs:.1} s wall on {jobs} thread(s); one-core sets/s:")?;
    for m in t {
        write!(out, " {}={:.0}", m.method, m.sets_per_second)?;
    }
    writeln!(out)?;
    Ok(())
}

fn report_fig8(out: &mut String, r: &experiment::Fig8Result, secs: f64, jobs: usize) -> anyhow::Result<()> {
    writeln!(
        out,
        "Fig. 8 — schedulable sets at U_G = {} ± {} vs. P_D ({} sets per point, seed {})",
        r.ug, r.ug_tolerance, r.sets_per_point, r.seed
    )?;
    write!(out, "{:>5}", "P_D")?;
    for m in &r.methods {
        write!(out, " {:>9}", m)?;
    }
    writeln!(out)?;
    for p in &r.points {
        write!(out, "{:>5.1}", p.p_dep)?;
        for s in &p.schedulable {
            write!(out, " {:>9}", s)?;
        }
        writeln!(out)?;
    }
    let first = &r.points[0].schedulable;
    let last = &r.points[r.points.len() - 1].schedulable;
    writeln!(
        out,
        "paper: Single-GPU flat in P_D; the others fall as P_D grows; LOCAL can drop below Single-GPU; GEMA ~ GLOBAL."
    )?;
    writeln!(
        out,
        "ours (P_D 0 -> 1): single {} -> {}, local {} -> {}, gema {} -> {}, gema-ls {} -> {}, global {} -> {}; {}",
        first[0],
        last[0],
        first[1],
        last[1],
        first[2],
        last[2],
        first[3],
        last[3],
        first[4],
        last[4],
        r.points.iter().find(|p| p.schedulable[1] < p.schedulable[0]).map_or_else(
            || "LOCAL never below Single-GPU".to_string(),
            |p| format!("LOCAL below Single-GPU from P_D = {:.1}", p.p_dep)
        )
    )?;
    // Points where GLOBAL schedules nothing say nothing about GEMA's loss.
    let gaps: Vec<f64> = r
        .points
        .iter()
        .filter(|p| p.schedulable[GLOBAL] > 0)
        .map(|p| 1.0 - p.schedulable[2] as f64 / p.schedulable[GLOBAL] as f64)
        .collect();
    if gaps.is_empty() {
        writeln!(out, "ours: GLOBAL schedules no set at any P_D; GEMA's loss is undefined")?;
    } else {
        writeln!(
            out,
            "ours: GEMA's largest loss to GLOBAL over P_D (points with GLOBAL > 0): {:.2}%",
            100.0 * gaps.iter().copied().fold(0.0, f64::max)
        )?;
    }
    writeln!(out, "sets a heuristic schedules but GLOBAL does not: {} (must be 0)", r.violations)?;
    timing_lines(out, &r.timing, secs, jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig8_result(global: u64, gema: u64) -> experiment::Fig8Result {
        experiment::Fig8Result {
            methods: Method::ALL.iter().map(|m| m.name().to_string()).collect(),
            ug: 1.2,
            ug_tolerance: 0.05,
            sets_per_point: 10,
            seed: 1,
            generator: crate::generate::GenConfig::default(),
            points: (0..=10)
                .map(|s| experiment::Fig8Point {
                    p_dep: s as f64 / 10.0,
                    sets: 10,
                    schedulable: vec![0, 0, gema, gema, global],
                })
                .collect(),
            violations: 0,
            timing: Vec::new(),
        }
    }

    #[test]
    fn fig8_report_does_not_call_an_empty_point_a_total_loss() {
        let mut out = String::new();
        report_fig8(&mut out, &fig8_result(0, 0), 1.0, 1).expect("report");
        assert!(!out.contains("100.00%"), "{out}");
        assert!(out.contains("GEMA's loss is undefined"), "{out}");
        assert!(out.contains("LOCAL never below Single-GPU"), "{out}");
        let mut out = String::new();
        report_fig8(&mut out, &fig8_result(4, 3), 1.0, 1).expect("report");
        assert!(out.contains("GLOBAL > 0): 25.00%"), "{out}");
    }
}

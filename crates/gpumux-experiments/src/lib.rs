//! `gpumux experiment NAME`: re-runs the seed papers' evaluations on the
//! simulated GPU and prints our numbers next to the papers'.
//!
//! * Tanasic et al., ISCA 2014, sec. 4 (Figs. 5-8): `tanasic-priority`,
//!   `tanasic-overhead`, `tanasic-dss`, on the K20c with Parboil (Table 1).
//! * Adriaens, spatial multitasking thesis, ch. 5-7: `adriaens-even`,
//!   `adriaens-heuristics`, `adriaens-qos`, on a Quadro FX 5800-like GPU
//!   with applications rebuilt from the thesis's Table 3.2 (`thesis.rs`).
//!
//! See docs/experiments.md for what reproduces and what does not, and why.

#![warn(missing_docs)]

pub mod adriaens;
pub mod report;
pub mod sim;
pub mod tanasic;
pub mod thesis;

use anyhow::{bail, Context, Result};
use gpumux_engine::ArrivalOrder;
use gpumux_workload::BlockTime;
use std::io::IsTerminal;
use std::path::PathBuf;

/// Experiment names with one line each.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    (
        "tanasic-priority",
        "Fig. 5: high-priority NTT improvement of NPQ, PPQ context switch, PPQ draining, 2-8 processes",
    ),
    ("tanasic-overhead", "Fig. 6: STP overhead of PPQ (exclusive and shared) over NPQ"),
    ("tanasic-dss", "Figs. 7-8: DSS vs FCFS: NTT by class, fairness, STP, ANTT per workload"),
    ("adriaens-even", "Table 5.1: even spatial vs cooperative multitasking, 2/3/4 applications"),
    (
        "adriaens-heuristics",
        "Table 6.2 and its 3-/4-application versions: SM partitioning heuristics, static and dynamic",
    ),
    ("adriaens-qos", "Ch. 7: QoS by SM reservation (Table 7.1) and by performance target (Table 7.3)"),
];

/// The command line of `gpumux experiment`.
#[derive(clap::Args, Debug, Clone)]
pub struct ExperimentArgs {
    /// Experiment name, or `all` / `list`.
    pub name: String,
    /// Fewer workloads and runs (each experiment in under a minute on 2 cores).
    #[arg(long)]
    pub quick: bool,
    /// Directory for the SVG plots and the text report.
    #[arg(long, default_value = "experiments-out")]
    pub out: PathBuf,
    /// Seed of the workload draws and of per-block time variation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Worker threads (default: the host's cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// No progress display on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Parboil block times of the tanasic-* experiments: `fit` (Table 1's kernel
    /// times on 13 SMs) or `table` (Table 1's Time/TB column); docs/workloads.md.
    #[arg(long, default_value = "fit")]
    pub tb: String,
    /// Tanasic experiments: host time (µs) between consecutive kernels of a
    /// Parboil app (a launch gap, as in the paper's CPU traces; our Parboil
    /// model launches them back to back).
    #[arg(long, default_value_t = 0.0)]
    pub launch_gap_us: f64,
    /// Override the simulator's saturation ratio κ (per-SM memory ceiling ×
    /// SMs / DRAM bandwidth) on every device; 1 reproduces the memory model
    /// before 2026-11-23 (docs/simulator.md).
    #[arg(long)]
    pub mem_ratio: Option<f64>,
    /// Fixed cost (µs) the simulator charges every SM preemption on top of its
    /// mechanism (pipeline drain and refill, TLB, trap handler; 0 in Tanasic's
    /// model and by default): tests how much a result depends on cheap preemption.
    #[arg(long, default_value_t = 0.0)]
    pub preempt_overhead_us: f64,
    /// Tanasic experiments: Parboil apps issue their copies and kernels
    /// asynchronously (the host runs ahead of its stream and waits only to
    /// read results back), and the GPU serves kernels in submission order,
    /// so a kernel enqueued early keeps its place in FCFS
    /// (`ArrivalOrder::Submission`). Default: synchronous apps.
    #[arg(long)]
    pub async_launches: bool,
    /// Tanasic experiments: the Parboil apps' host (CPU) time. `estimate`: ours
    /// (docs/workloads.md). `class2`: scaled so each app's time alone falls in
    /// its Table 1 Class 2 range (SHORT 4 ms, MEDIUM 60 ms, LONG 600 ms), which
    /// our estimates miss for 8 of 10 apps. `class2-low`: at the low end of each
    /// range (4, 35 and 420 ms), the least host time the table allows.
    #[arg(long, default_value = "estimate")]
    pub host: String,
    /// Tanasic experiments: every Parboil kernel's block-time spread `s` (each
    /// block takes mean × (1 ± s), uniform; at most 1). Default: 0.1, ours
    /// (Table 1 gives mean block times only); tests how much draining costs
    /// when the blocks on one SM end at different times.
    #[arg(long)]
    pub tb_spread: Option<f64>,
}

/// What every experiment needs to know about the run.
pub struct Ctx {
    /// `--quick`: fewer workloads and runs.
    pub quick: bool,
    /// Folder the report and SVG plots go to.
    pub out: PathBuf,
    /// Seed and model knobs of every simulated device.
    pub sim: sim::SimSetup,
    /// Simulations run side by side.
    pub threads: usize,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Which Parboil block times the Tanasic experiments use (`--tb`).
    pub tb: BlockTime,
    /// Host time between consecutive kernels of a Parboil app (`--launch-gap-us`).
    pub launch_gap_ns: u64,
    /// `--async-launches`.
    pub async_launches: bool,
    /// `--host class2` or `class2-low`.
    pub host_class2: bool,
    /// `--host class2-low`: each app at the low end of its Class 2 range, not mid-range.
    pub class2_low: bool,
    /// `--tb-spread`: the Parboil kernels' block-time spread, `None` for the workload's own.
    pub tb_spread: Option<f64>,
}

/// Runs the experiment(s) `args` names (or lists them, for `list`): each
/// prints its report, and writes it as `NAME.txt` next to its plots in `--out`.
pub fn run(args: ExperimentArgs) -> Result<()> {
    if args.name == "list" {
        for (n, what) in EXPERIMENTS {
            println!("{n:<20} {what}");
        }
        return Ok(());
    }
    let names: Vec<&str> = if args.name == "all" {
        EXPERIMENTS.iter().map(|e| e.0).collect()
    } else {
        match EXPERIMENTS.iter().find(|e| e.0 == args.name) {
            Some(e) => vec![e.0],
            None => bail!(
                "unknown experiment `{}`; known: {}, all, list",
                args.name,
                EXPERIMENTS.iter().map(|e| e.0).collect::<Vec<_>>().join(", ")
            ),
        }
    };
    let tb = match args.tb.as_str() {
        "fit" => BlockTime::Fit,
        "table" => BlockTime::Table,
        other => bail!("--tb must be `fit` or `table`, got `{other}`"),
    };
    let (host_class2, class2_low) = match args.host.as_str() {
        "estimate" => (false, false),
        "class2" => (true, false),
        "class2-low" => (true, true),
        other => bail!("--host must be `estimate`, `class2` or `class2-low`, got `{other}`"),
    };
    if !(0.0..=1e9).contains(&args.launch_gap_us) {
        bail!("--launch-gap-us must be between 0 and 1e9, got {}", args.launch_gap_us);
    }
    if let Some(r) = args.mem_ratio {
        if !(0.01..=1000.0).contains(&r) {
            bail!("--mem-ratio must be between 0.01 and 1000, got {r}");
        }
    }
    if !(0.0..=1e6).contains(&args.preempt_overhead_us) {
        bail!("--preempt-overhead-us must be between 0 and 1e6, got {}", args.preempt_overhead_us);
    }
    if let Some(s) = args.tb_spread {
        if !(0.0..=1.0).contains(&s) {
            bail!("--tb-spread must be between 0 and 1 (each block mean × (1 ± s)), got {s}");
        }
    }
    // Checked before the first experiment, which can take minutes, not after it.
    gpumux_files::output::check_dir(&args.out).map_err(|why| anyhow::anyhow!("--out {}: {why}", args.out.display()))?;
    let ctx = Ctx {
        quick: args.quick,
        out: args.out.clone(),
        sim: sim::SimSetup {
            seed: args.seed,
            mem_ratio: args.mem_ratio,
            preempt_overhead_ns: (args.preempt_overhead_us * 1e3).round() as u64,
            arrival_order: if args.async_launches { ArrivalOrder::Submission } else { ArrivalOrder::HeadOfStream },
        },
        threads: args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        progress: !args.quiet && std::io::stderr().is_terminal(),
        tb,
        launch_gap_ns: (args.launch_gap_us * 1e3).round() as u64,
        async_launches: args.async_launches,
        host_class2,
        class2_low,
        tb_spread: args.tb_spread,
    };
    for name in names {
        let started = std::time::Instant::now();
        let text = run_one(&ctx, name)?;
        let header = format!(
            "== {name}{}{} (seed {}, {:.1} s) ==\n",
            if ctx.quick { " --quick" } else { "" },
            options(&ctx, name),
            ctx.sim.seed,
            started.elapsed().as_secs_f64()
        );
        println!("{header}{text}");
        let path = ctx.out.join(format!("{name}.txt"));
        std::fs::write(&path, format!("{header}{text}")).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The options that differ from the defaults, for the header.
fn options(ctx: &Ctx, name: &str) -> String {
    let mut s = String::new();
    if let Some(r) = ctx.sim.mem_ratio {
        s.push_str(&format!(" --mem-ratio {r}"));
    }
    if ctx.sim.preempt_overhead_ns > 0 {
        s.push_str(&format!(" --preempt-overhead-us {}", ctx.sim.preempt_overhead_ns as f64 / 1e3));
    }
    if name.starts_with("tanasic") {
        if ctx.tb == BlockTime::Table {
            s.push_str(" --tb table");
        }
        if ctx.launch_gap_ns > 0 {
            s.push_str(&format!(" --launch-gap-us {}", ctx.launch_gap_ns as f64 / 1e3));
        }
        if ctx.async_launches {
            s.push_str(" --async-launches");
        }
        if ctx.host_class2 {
            s.push_str(if ctx.class2_low { " --host class2-low" } else { " --host class2" });
        }
        if let Some(sp) = ctx.tb_spread {
            s.push_str(&format!(" --tb-spread {sp}"));
        }
    }
    s
}

fn run_one(ctx: &Ctx, name: &str) -> Result<String> {
    match name {
        "tanasic-priority" => tanasic::priority(ctx),
        "tanasic-overhead" => tanasic::overhead(ctx),
        "tanasic-dss" => tanasic::dss(ctx),
        "adriaens-even" => adriaens::even(ctx),
        "adriaens-heuristics" => adriaens::heuristics(ctx),
        "adriaens-qos" => adriaens::qos(ctx),
        other => bail!("unknown experiment `{other}`"),
    }
}

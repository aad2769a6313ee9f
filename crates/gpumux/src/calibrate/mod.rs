//! `gpumux calibrate --device DEVICE WORKLOAD.toml [-o OUT]`: runs each kernel of a workload
//! alone on a device (a real GPU, or a simulated one, which is how CI checks that the fit
//! recovers what it was given), fits the simulator's parameters to what it measured, and
//! writes them (a calibration file for `gpumux run --calibration`, and the workload with its
//! kernels calibrated). `--compare` then runs the workload on the device and on the
//! simulator, with and without the calibration, and prints them side by side.
//! docs/calibration.md says what is measured and how each figure is fitted.

pub mod file;
pub(crate) mod measure;
pub(crate) mod probe;

use crate::devices::DeviceSpec;
use crate::run::{self, RunOptions};
use anyhow::{anyhow, Context, Result};
use file::{distinct_kernels, Calibration, DeviceCal, KernelCal, FORMAT};
use gpumux_engine::kernel::{DeviceInfo, KernelDesc, SimTiming};
use gpumux_engine::metrics::PolicyMetrics;
use gpumux_engine::model::Workload;
use gpumux_engine::time::Nanos;
use gpumux_sim::{presets, SimTuning};
use measure::{measure_kernel, Plan};
use probe::Probe;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct CalibrateArgs {
    /// The workload whose kernels are measured (a TOML file or a built-in).
    pub workload: String,
    /// The device measured: cuda:N, or sim:NAME (the simulator against itself).
    #[arg(long)]
    pub device: String,
    /// The simulator preset to fit for (default: the measured preset, or sim:h100 for a GPU).
    #[arg(long)]
    pub target: Option<String>,
    /// The calibration file to write; the calibrated workload goes beside it
    /// (`NAME.workload.toml`).
    #[arg(short, long, default_value = "calibration.toml")]
    pub out: PathBuf,
    /// Timed alone runs of each kernel (after a warm-up) and of each copy size.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Single-block launches per kernel, from which the block-time spread is estimated.
    #[arg(long, default_value_t = 48, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub samples: u32,
    /// Then run the workload under these policies on the device and on the simulator
    /// (uncalibrated and calibrated), and print ANTT and STP side by side.
    #[arg(long, value_name = "POLICIES", num_args = 0..=1, default_missing_value = crate::DEFAULT_POLICIES)]
    pub compare: Option<String>,
    /// Also write the comparison as JSON to this file.
    #[arg(long, requires = "compare")]
    pub json: Option<PathBuf>,
    /// Seed of the workload runs of `--compare` (and of the suite's inputs on a GPU).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The calibrated workload's path: `cal.toml` → `cal.workload.toml`.
fn workload_path(out: &Path) -> PathBuf {
    out.with_extension("workload.toml")
}

pub fn run(args: CalibrateArgs) -> Result<()> {
    crate::preflight::output_file("-o", Some(&args.out))?;
    let wpath = workload_path(&args.out);
    crate::preflight::output_file("-o (the calibrated workload)", Some(&wpath))?;
    crate::preflight::output_file("--json", args.json.as_deref())?;
    let compare = match &args.compare {
        Some(p) => Some(crate::preflight::policy_list(p)?),
        None => None,
    };
    let workload = gpumux_workload::resolve(&args.workload)?;
    let device = DeviceSpec::parse(&args.device)?;
    device.check(&workload)?;
    let target_name = match (&args.target, &device) {
        (Some(t), _) => t.clone(),
        (None, DeviceSpec::Sim(info, _)) => sim_name(info).unwrap_or_else(|| "sim:h100".into()),
        (None, DeviceSpec::Cuda(_)) => "sim:h100".into(),
    };
    let target = match DeviceSpec::parse(&target_name)? {
        DeviceSpec::Sim(info, _) => info,
        DeviceSpec::Cuda(_) => anyhow::bail!("--target must be a simulated device (sim:NAME), got {target_name}"),
    };
    let plan = Plan { runs: args.runs, samples: args.samples };
    let cal =
        calibrate(&workload, &args.device, &device, &target, &target_name, plan, &mut |line| eprintln!("{line}"))?;
    std::fs::write(&args.out, toml::to_string(&cal)?).with_context(|| format!("writing {}", args.out.display()))?;
    let calibrated = cal.apply(&workload)?;
    std::fs::write(&wpath, gpumux_workload::to_toml(&calibrated))
        .with_context(|| format!("writing {}", wpath.display()))?;
    print!("{}", render(&cal));
    eprintln!("wrote {} and {}", args.out.display(), wpath.display());
    if let Some(policies) = compare {
        let c = compare_runs(&workload, &device, &target, &cal, policies, args.seed)?;
        print!("{}", render_comparison(&c));
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&c)?)
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(())
}

/// `sim:NAME` of a preset, found by comparing with each.
fn sim_name(info: &DeviceInfo) -> Option<String> {
    presets::NAMES.iter().find(|n| presets::by_name(n).as_ref() == Some(info)).map(|n| format!("sim:{n}"))
}

/// Measures every kernel of `w` and the copies on `device`, and fits them for `target`.
/// `say` gets a line of progress per kernel (GPU runs of big kernels take seconds).
pub fn calibrate(
    w: &Workload,
    device_name: &str,
    device: &DeviceSpec,
    target: &DeviceInfo,
    target_name: &str,
    plan: Plan,
    say: &mut dyn FnMut(String),
) -> Result<Calibration> {
    let kernels = distinct_kernels(w);
    let mut opened = device.open(1)?;
    let info = opened.device().info().clone();
    let mut runs = Vec::new();
    let link;
    {
        let mut p = Probe::new(opened.device());
        for (i, k) in kernels.iter().enumerate() {
            say(format!("calibrate: kernel {}/{}: {} ({} blocks)", i + 1, kernels.len(), k.name, k.shape.blocks));
            runs.push(
                measure_kernel(&mut p, k, target, plan).with_context(|| format!("measuring kernel `{}`", k.name))?,
            );
        }
        say("calibrate: copies".into());
        link = measure::measure_link(&mut p, plan.runs)?;
    }
    opened.finish();

    let mut overheads: Vec<f64> = runs.iter().filter_map(measure::launch_overhead).collect();
    overheads.sort_by(f64::total_cmp);
    let overhead = overheads.get(overheads.len() / 2).copied();
    let mut fitted: Vec<KernelCal> = Vec::new();
    for (k, r) in kernels.iter().zip(&runs) {
        fitted.push(
            measure::fit_kernel(k, r, target, overhead.unwrap_or(0.0))
                .with_context(|| format!("fitting kernel `{}`", k.name))?,
        );
    }

    // Preemption: the simulator's own drain latency for the same retreat, with the fitted
    // kernel; what the device took beyond it is a fixed cost per preemption.
    // What a real GPU under gpumux does whatever the policy asks: every retreat is a drain at
    // a chunk boundary, and a worker grid keeps its SMs until its last worker leaves (the
    // simulator by default gives them back when the grid's last block is issued, as the
    // hardware scheduler would: under a priority policy that lets lower-priority kernels
    // into a long kernel's last wave, which the GPU never does).
    let (mechanism, release) = match device {
        DeviceSpec::Cuda(_) => (Some("drain".to_string()), Some("at-end".to_string())),
        DeviceSpec::Sim(..) => (None, None),
    };
    let mut extra = Vec::new();
    let mut latencies = Vec::new();
    for ((k, r), c) in kernels.iter().zip(&runs).zip(&fitted) {
        let Some(measured) = r.retreat else { continue };
        latencies.push(measured);
        let d = Arc::new(KernelDesc { sim_timing: Some(timing_of(c)), ..(**k).clone() });
        let mut gpu = gpumux_sim::SimGpu::new(target.clone(), 1);
        let sim = Probe::new(&mut gpu).retreat_latency(&d, (measure::mean(&r.alone) / 3.0) as Nanos)?;
        if let Some(s) = sim {
            extra.push(measured - s);
        }
    }
    let preempt_overhead = if extra.is_empty() { 0.0 } else { measure::mean(&extra).max(0.0) };
    Ok(Calibration {
        format: FORMAT,
        measured_on: device_name.to_string(),
        device_name: info.name.clone(),
        target: target_name.to_string(),
        workload: w.name.clone(),
        device: DeviceCal {
            h2d_gb_s: link.h2d.0 / 1e9,
            d2h_gb_s: link.d2h.0 / 1e9,
            link_latency_us: (link.h2d.1 + link.d2h.1) / 2.0 / 1000.0,
            launch_overhead_us: overhead.map(|l| l / 1000.0),
            preempt_latency_us: (!latencies.is_empty()).then(|| measure::mean(&latencies) / 1000.0),
            preempt_overhead_us: preempt_overhead / 1000.0,
            mechanism,
            release,
        },
        kernels: fitted,
    })
}

fn timing_of(c: &KernelCal) -> SimTiming {
    SimTiming {
        block_time_ns: (c.block_time_us * 1000.0).round().max(1.0) as Nanos,
        block_time_spread: c.block_time_spread,
        mem_intensity: c.mem_intensity,
    }
}

fn opt(v: Option<f64>, decimals: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.decimals$}"))
}

/// The table `calibrate` prints: per kernel what was measured and what was fitted.
pub fn render(c: &Calibration) -> String {
    let mut s = String::new();
    let d = &c.device;
    let _ =
        writeln!(s, "calibration of {} on {} ({}), fitted for {}", c.workload, c.measured_on, c.device_name, c.target);
    let _ = writeln!(
        s,
        "link: H2D {:.1} GB/s, D2H {:.1} GB/s, latency {:.1} us; launch overhead {} us; preemption {} us (simulator adds {:.1} us{}){}",
        d.h2d_gb_s,
        d.d2h_gb_s,
        d.link_latency_us,
        opt(d.launch_overhead_us, 1),
        opt(d.preempt_latency_us, 1),
        d.preempt_overhead_us,
        d.mechanism.as_deref().map_or(String::new(), |m| format!(", every mechanism a {m}")),
        if d.release.as_deref() == Some("at-end") { "; SMs given back at a launch's end" } else { "" }
    );
    let _ = writeln!(
        s,
        "{:<20} {:>8} {:>12} {:>8} {:>10} {:>10} {:>8} {:>7} {:>6}",
        "kernel", "blocks", "alone us", "sd us", "block us", "(file)", "spread", "stretch", "mem"
    );
    for k in &c.kernels {
        let _ = writeln!(
            s,
            "{:<20} {:>8} {:>12.1} {:>8.1} {:>10.2} {:>10} {:>8.3} {:>7} {:>6.2}",
            gpumux_files::text::truncate(&k.name, 20),
            k.blocks,
            k.alone_us,
            k.alone_sd_us,
            k.block_time_us,
            opt(k.given_block_time_us, 2),
            k.block_time_spread,
            opt(k.stretch, 3),
            k.mem_intensity
        );
        for n in &k.notes {
            let _ = writeln!(s, "    note: {n}");
        }
    }
    s
}

/// One policy's ANTT and STP on the device, the simulator as the file describes the
/// kernels, and the simulator with the calibration.
#[derive(Debug, Serialize)]
pub struct CompareRow {
    pub policy: String,
    /// `None` when the run on the device failed (`error` says why).
    pub device: Option<(f64, f64)>,
    pub error: Option<String>,
    pub sim: (f64, f64),
    pub calibrated: (f64, f64),
}

#[derive(Debug, Serialize)]
pub struct Comparison {
    pub workload: String,
    pub device: String,
    pub target: String,
    pub seed: u64,
    /// (ANTT, STP) per policy.
    pub rows: Vec<CompareRow>,
}

fn compare_runs(
    w: &Workload,
    device: &DeviceSpec,
    target: &DeviceInfo,
    cal: &Calibration,
    policies: Vec<String>,
    seed: u64,
) -> Result<Comparison> {
    let opts = |d: DeviceSpec| RunOptions {
        device: d,
        policies: policies.clone(),
        seed,
        trace: false,
        progress: crate::progress::Mode::Off,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        max_work: f64::INFINITY,
    };
    let plain = run::run_workload(w, &opts(DeviceSpec::Sim(target.clone(), SimTuning::default())))?;
    let calibrated = run::run_workload(&cal.apply(w)?, &opts(DeviceSpec::Sim(target.clone(), cal.tuning()?)))?;
    let pick = |r: &run::RunReport, p: &str| -> Result<(f64, f64)> {
        let m: &PolicyMetrics =
            r.policies.iter().find(|m| m.policy == p).ok_or_else(|| anyhow!("no result for {p}"))?;
        Ok((m.antt, m.stp))
    };
    // One device run per policy (each with its own alone runs): a policy the device cannot
    // carry out costs its row, not the table.
    let mut rows = Vec::new();
    for (p, m) in policies.iter().zip(&plain.policies) {
        eprintln!("calibrate --compare: {p} on {}", cal.measured_on);
        let one = RunOptions { policies: vec![p.clone()], ..opts(device.clone()) };
        let (device, error) = match run::run_workload(w, &one) {
            Ok(r) => (r.policies.first().map(|d| (d.antt, d.stp)), None),
            Err(e) => {
                eprintln!("calibrate --compare: {p} failed on {}: {e:#}", cal.measured_on);
                (None, Some(format!("{e:#}")))
            }
        };
        rows.push(CompareRow {
            policy: m.policy.clone(),
            device,
            error,
            sim: pick(&plain, &m.policy)?,
            calibrated: pick(&calibrated, &m.policy)?,
        });
    }
    Ok(Comparison { workload: w.name.clone(), device: cal.measured_on.clone(), target: cal.target.clone(), seed, rows })
}

fn err(pred: f64, truth: f64) -> String {
    format!("{:+.1}%", (pred / truth - 1.0) * 100.0)
}

pub fn render_comparison(c: &Comparison) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "\n{} on {} against {} (seed {}): ANTT and STP; % = simulator / device - 1",
        c.workload, c.device, c.target, c.seed
    );
    let _ = writeln!(
        s,
        "{:<16} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>7} {:>7} {:>8} {:>7} {:>8}",
        "policy", "ANTT dev", "sim", "err", "calib", "err", "STP dev", "sim", "err", "calib", "err"
    );
    let (mut within_antt, mut within_stp) = (0, 0);
    for r in &c.rows {
        let Some(dev) = r.device else {
            let why = r.error.as_deref().unwrap_or("no result");
            let _ = writeln!(s, "{:<16} failed on the device: {}", r.policy, gpumux_files::text::truncate(why, 100));
            continue;
        };
        let _ = writeln!(
            s,
            "{:<16} {:>8.2} {:>8.2} {:>8} {:>8.2} {:>8} | {:>7.3} {:>7.3} {:>8} {:>7.3} {:>8}",
            r.policy,
            dev.0,
            r.sim.0,
            err(r.sim.0, dev.0),
            r.calibrated.0,
            err(r.calibrated.0, dev.0),
            dev.1,
            r.sim.1,
            err(r.sim.1, dev.1),
            r.calibrated.1,
            err(r.calibrated.1, dev.1)
        );
        within_antt += usize::from((r.calibrated.0 / dev.0 - 1.0).abs() <= 0.10);
        within_stp += usize::from((r.calibrated.1 / dev.1 - 1.0).abs() <= 0.10);
    }
    let _ = writeln!(s, "calibrated within 10%: ANTT {within_antt} of {n}, STP {within_stp} of {n}", n = c.rows.len());
    s
}

//! `gpumux replay FILE`: a recording of gpumuxd's clients (`gpumuxd --record`)
//! turned into a workload and run on the simulator, each client's recorded
//! turnaround beside the simulated one; with recordings of the same clients
//! run alone (`--alone`), ANTT and STP of both. docs/calibration.md,
//! "Replaying the daemon's clients", says what is modelled and what is not.

mod build;
pub mod probe;
pub mod recording;

use crate::devices::DeviceSpec;
use crate::run::{self, RunOptions};
use anyhow::{bail, Context, Result};
use gpumux_engine::device::Mechanism;
use gpumux_engine::metrics::PolicyMetrics;
use gpumux_engine::model::Workload;
use gpumux_sim::{presets, SimTuning};
use recording::Recording;
use serde::Serialize;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The recording to replay (`gpumuxd --record FILE`).
    pub recording: PathBuf,
    /// A recording of the same clients each run alone (one after another, one daemon):
    /// kernels are timed from it, and NTT divides by its turnarounds (repeatable).
    #[arg(long, value_name = "FILE")]
    pub alone: Vec<PathBuf>,
    /// Write the workload (TOML) here.
    #[arg(short, long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The simulated device [default: the recording's preset; sim:h200 or sim:h100 for a GPU of that name].
    #[arg(long)]
    pub device: Option<String>,
    /// A file from `gpumux calibrate`: its device section (link, preemption, mechanism,
    /// when SMs are given back) tunes the simulator; kernels are timed from the recordings.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<PathBuf>,
    /// The policy [default: the one the daemon ran].
    #[arg(long)]
    pub policy: Option<String>,
    /// Also write the comparison as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Only write the workload (`-o`); simulate nothing.
    #[arg(long, requires = "out")]
    pub no_run: bool,
    /// Seed of per-block time variation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The goal: ANTT and STP within this many percent of the recorded ones (a PASS/FAIL line).
    #[arg(long, default_value_t = 10.0)]
    pub goal_pct: f64,
    /// Memory intensity M (0-1) of every recorded kernel named KERNEL (repeatable); its
    /// block time is fitted with it, so alone it still takes its recorded time. Default 0:
    /// a recording cannot tell it (docs/calibration.md); this tests what it would change.
    #[arg(long = "mem-intensity", value_name = "KERNEL=M", value_parser = parse_mem_intensity)]
    pub mem_intensity: Vec<(String, f64)>,
    /// A recording of each client run beside a memory-bound probe client (each on half the
    /// SMs): every kernel's memory intensity and the device's saturation ratio κ are fitted
    /// from it and replayed (docs/calibration.md); needs --alone. `--mem-intensity` overrides.
    #[arg(long, value_name = "FILE", requires = "alone")]
    pub probe: Option<PathBuf>,
    /// The probe's kernel: a client whose every kernel has this name is the probe (memory
    /// intensity 1 by definition).
    #[arg(long, value_name = "KERNEL", default_value = "vector_add")]
    pub probe_kernel: String,
}

/// `KERNEL=M` of `--mem-intensity`.
fn parse_mem_intensity(s: &str) -> Result<(String, f64), String> {
    let (name, m) = s.split_once('=').ok_or_else(|| format!("expected KERNEL=M, got {s:?}"))?;
    let m: f64 = m.trim().parse().map_err(|_| format!("{m:?} in {s:?} is not a number"))?;
    if !(0.0..=1.0).contains(&m) {
        return Err(format!("the memory intensity of {name:?} must be between 0 and 1, got {m}"));
    }
    if name.is_empty() {
        return Err(format!("no kernel name before '=' in {s:?}"));
    }
    Ok((name.to_string(), m))
}

/// One client: recorded and simulated turnarounds, ms.
#[derive(Debug, Serialize)]
pub struct ClientRow {
    pub name: String,
    pub priority: i32,
    pub recorded_ms: f64,
    pub simulated_ms: f64,
    /// With `--alone`: the client's recorded alone turnaround, and the replay of that alone.
    pub recorded_alone_ms: Option<f64>,
    pub simulated_alone_ms: f64,
}

/// What `replay` prints, as `--json` writes it.
#[derive(Debug, Serialize)]
pub struct ReplayReport {
    pub recording: String,
    pub recorded_on: String,
    pub recorded_policy: String,
    pub device: String,
    pub policy: String,
    pub calibration: Option<String>,
    pub clients: Vec<ClientRow>,
    /// (ANTT, STP) recorded, with `--alone`.
    pub recorded: Option<(f64, f64)>,
    /// (ANTT, STP) simulated (alone: the replay of the alone recordings, else the simulator's isolated runs).
    pub simulated: (f64, f64),
    pub kernels: Vec<build::Fitted>,
    pub notes: Vec<String>,
    /// Whether both errors are within `goal_pct` (with `--alone`).
    pub within_goal: Option<bool>,
    pub goal_pct: f64,
    /// With `--probe`: κ and each kernel's memory intensity as fitted.
    pub probe: Option<probe::ProbeFit>,
}

pub fn run(args: ReplayArgs) -> Result<()> {
    crate::preflight::output_file("-o", args.out.as_deref())?;
    crate::preflight::output_file("--json", args.json.as_deref())?;
    let rec = Recording::load(&args.recording)?;
    let alone = args.alone.iter().map(|p| Recording::load(p)).collect::<Result<Vec<_>, _>>()?;
    let device_name = match &args.device {
        Some(d) => d.clone(),
        None => default_device(&rec.device)?,
    };
    let DeviceSpec::Sim(info, _) = DeviceSpec::parse(&device_name)? else {
        bail!("--device must be a simulated device (sim:NAME): a replay runs on the simulator");
    };
    let policy = args.policy.clone().unwrap_or_else(|| rec.policy.clone());
    gpumux_engine::policies::by_name(&policy).with_context(|| format!("the policy to replay under ({policy})"))?;
    let mut notes = Vec::new();
    if rec.sms != u32::from(info.num_sms) {
        notes.push(format!("recorded on a device of {} SMs, replayed on {} of {}", rec.sms, info.name, info.num_sms));
    }
    let tuning = match &args.calibration {
        Some(path) => crate::calibrate::file::Calibration::load(path)?.tuning()?,
        None if presets::by_name(&rec.device).is_none() => {
            notes.push(format!(
                "recorded on a GPU ({}) and no --calibration: the simulator drains for every mechanism and keeps a \
                 launch's SMs until its end, as gpumux's CUDA backend does; link and preemption costs are the preset's",
                gpumux_files::text::truncate(&rec.device, 60)
            ));
            SimTuning { mechanism: Some(Mechanism::Drain), release_at_end: true, ..SimTuning::default() }
        }
        None => SimTuning::default(),
    };
    // Copies at the speed the clients saw them (from the alone recordings when given).
    let link_from: Vec<&Recording> = if alone.is_empty() { vec![&rec] } else { alone.iter().collect() };
    let (h2d, d2h) = build::fit_link(&link_from);
    let mut tuning = tuning;
    let mut latencies = Vec::new();
    for (fit, bw, what) in [(h2d, &mut tuning.h2d_bandwidth, "H2D"), (d2h, &mut tuning.d2h_bandwidth, "D2H")] {
        if let Some(f) = fit {
            *bw = Some(f.bytes_per_s);
            latencies.push(f.latency_ns);
            notes.push(format!(
                "{what} copies as recorded: {:.2} GB/s, {:.1} us latency (fitted to {} copies{})",
                f.bytes_per_s / 1e9,
                f.latency_ns / 1e3,
                f.copies,
                if alone.is_empty() { ", shared ones among them" } else { " of the alone recordings" }
            ));
        }
    }
    if !latencies.is_empty() {
        tuning.link_latency_ns = Some((latencies.iter().sum::<f64>() / latencies.len() as f64).round() as u64);
    }
    let given: HashMap<String, f64> = args.mem_intensity.iter().cloned().collect();
    let probe_fit = match &args.probe {
        Some(path) => {
            let p = Recording::load(path)?;
            let fitted = probe::fit_recording(&p, &build::alone_means(&alone), &args.probe_kernel, &info, &mut notes)
                .with_context(|| format!("fitting memory intensities to {}", path.display()))?;
            tuning.mem_ratio = Some(fitted.kappa);
            Some(fitted)
        }
        None => None,
    };
    // Fitted intensities for the kernels the probe recording saw; what --mem-intensity gives wins.
    let mut mem: HashMap<String, f64> = probe_fit.as_ref().map(|p| p.intensities()).unwrap_or_default();
    mem.extend(given.clone());
    let kernels = build::fit_kernels(&rec, &alone, &info, &mem, &mut notes)?;
    for name in given.keys() {
        if !kernels.keys().any(|s| &s.name == name) {
            let mut known: Vec<&str> = kernels.keys().map(|s| s.name.as_str()).collect();
            known.dedup();
            bail!(
                "--mem-intensity names kernel {}, which {} never ran; its kernels: {}",
                gpumux_files::text::quote(name),
                rec.file,
                known.join(", ")
            );
        }
        notes.push(format!(
            "kernel {}: memory intensity {} (--mem-intensity)",
            gpumux_files::text::quote(name),
            mem[name]
        ));
    }
    let workload = build::workload(&rec, &kernels, &mut notes)?;
    if let Some(path) = &args.out {
        std::fs::write(path, gpumux_workload::to_toml(&workload))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {} ({} processes)", path.display(), workload.processes.len());
    }
    if args.no_run {
        for n in &notes {
            eprintln!("note: {n}");
        }
        return Ok(());
    }
    let device = DeviceSpec::Sim(info.clone(), tuning);
    let shared = simulate(&workload, &device, &policy, args.seed)?;

    // The alone recordings' clients by name: recorded turnarounds and their replay.
    let mut alone_rec: HashMap<String, Vec<f64>> = HashMap::new();
    let mut alone_sim: HashMap<String, Vec<f64>> = HashMap::new();
    for a in &alone {
        let mut ignored = Vec::new();
        let fits = build::fit_kernels(a, &alone, &info, &mem, &mut ignored)?;
        let w = build::workload(a, &fits, &mut ignored)?;
        let m = simulate(&w, &device, run::ALONE_POLICY, args.seed)?;
        for (c, p) in a.clients.iter().zip(&m.processes) {
            if let Some(t) = c.turnaround_ns() {
                alone_rec.entry(c.name.clone()).or_default().push(t as f64 / 1e6);
                alone_sim.entry(c.name.clone()).or_default().push(p.alone_run_ns / 1e6);
            }
        }
    }
    let mean = |v: &Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
    let mut clients = Vec::new();
    for (c, p) in rec.clients.iter().zip(&shared.processes) {
        let recorded_alone_ms = alone_rec.get(&c.name).map(mean);
        if !alone.is_empty() && recorded_alone_ms.is_none() {
            bail!(
                "client {} of {} is in no --alone recording: NTT needs its turnaround alone",
                gpumux_files::text::quote(&c.name),
                rec.file
            );
        }
        clients.push(ClientRow {
            name: p.name.clone(),
            priority: c.priority,
            recorded_ms: c.turnaround_ns().unwrap_or(0) as f64 / 1e6,
            simulated_ms: p.mean_run_ns / 1e6,
            recorded_alone_ms,
            simulated_alone_ms: alone_sim.get(&c.name).map_or(p.alone_run_ns / 1e6, mean),
        });
    }
    let metrics = |pairs: Vec<(f64, f64)>| {
        let ntt: Vec<f64> = pairs.iter().map(|(shared, alone)| shared / alone).collect();
        (ntt.iter().sum::<f64>() / ntt.len() as f64, ntt.iter().map(|n| 1.0 / n).sum::<f64>())
    };
    let recorded = (!alone.is_empty())
        .then(|| metrics(clients.iter().map(|c| (c.recorded_ms, c.recorded_alone_ms.unwrap_or(f64::NAN))).collect()));
    let simulated = metrics(clients.iter().map(|c| (c.simulated_ms, c.simulated_alone_ms)).collect());
    let within_goal = recorded.map(|r| {
        (simulated.0 / r.0 - 1.0).abs() * 100.0 <= args.goal_pct
            && (simulated.1 / r.1 - 1.0).abs() * 100.0 <= args.goal_pct
    });
    let report = ReplayReport {
        recording: rec.file.clone(),
        recorded_on: rec.device.clone(),
        recorded_policy: rec.policy.clone(),
        device: info.name.clone(),
        policy: shared.policy.clone(),
        calibration: args.calibration.as_ref().map(|p| p.display().to_string()),
        clients,
        recorded,
        simulated,
        kernels: kernels.into_values().map(|(_, f)| f).collect(),
        notes,
        within_goal,
        goal_pct: args.goal_pct,
        probe: probe_fit,
    };
    print!("{}", render(&report));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The preset a recording's device maps to.
fn default_device(recorded: &str) -> Result<String> {
    if presets::by_name(recorded).is_some() {
        return Ok(recorded.to_string());
    }
    for (marker, preset) in [("H200", "sim:h200"), ("H100", "sim:h100")] {
        if recorded.contains(marker) {
            return Ok(preset.to_string());
        }
    }
    bail!(
        "the recording's device ({}) is no simulator preset: name one with --device",
        gpumux_files::text::truncate(recorded, 60)
    )
}

/// `w` under `policy` on `device`, with the isolated runs of each process.
fn simulate(w: &Workload, device: &DeviceSpec, policy: &str, seed: u64) -> Result<PolicyMetrics> {
    let opts = RunOptions {
        device: device.clone(),
        policies: vec![policy.to_string()],
        seed,
        trace: false,
        progress: crate::progress::Mode::Off,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        max_work: f64::INFINITY,
    };
    let mut r = run::run_workload(w, &opts)?;
    r.policies.pop().context("the run gave no result")
}

fn pct(pred: f64, truth: f64) -> String {
    if truth > 0.0 && pred.is_finite() {
        format!("{:+.1}%", (pred / truth - 1.0) * 100.0)
    } else {
        "-".into()
    }
}

/// The table `replay` prints.
pub fn render(r: &ReplayReport) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "replay of {} (recorded on {} under {}) on {} under {}{}",
        r.recording,
        gpumux_files::text::truncate(&r.recorded_on, 60),
        r.recorded_policy,
        r.device,
        r.policy,
        r.calibration.as_ref().map_or(String::new(), |c| format!(", calibration {c}"))
    );
    let _ = writeln!(
        s,
        "{:<20} {:>4} | {:>10} {:>10} {:>7} | {:>10} {:>10} {:>7} | {:>7} {:>7}",
        "client (ms)", "prio", "alone rec", "alone sim", "err", "shared rec", "shared sim", "err", "NTT rec", "NTT sim"
    );
    for c in &r.clients {
        let rec_alone = c.recorded_alone_ms.map_or_else(|| "-".into(), |a| format!("{a:.2}"));
        let ntt_rec = c.recorded_alone_ms.map_or_else(|| "-".into(), |a| format!("{:.3}", c.recorded_ms / a));
        let _ = writeln!(
            s,
            "{:<20} {:>4} | {:>10} {:>10.2} {:>7} | {:>10.2} {:>10.2} {:>7} | {:>7} {:>7.3}",
            gpumux_files::text::truncate(&c.name, 20),
            c.priority,
            rec_alone,
            c.simulated_alone_ms,
            c.recorded_alone_ms.map_or_else(|| "-".into(), |a| pct(c.simulated_alone_ms, a)),
            c.recorded_ms,
            c.simulated_ms,
            pct(c.simulated_ms, c.recorded_ms),
            ntt_rec,
            c.simulated_ms / c.simulated_alone_ms
        );
    }
    match r.recorded {
        Some((antt, stp)) => {
            let _ = writeln!(
                s,
                "ANTT recorded {antt:.3}, simulated {:.3} ({}); STP recorded {stp:.3}, simulated {:.3} ({})",
                r.simulated.0,
                pct(r.simulated.0, antt),
                r.simulated.1,
                pct(r.simulated.1, stp)
            );
        }
        None => {
            let _ = writeln!(
                s,
                "simulated ANTT {:.3}, STP {:.3} (against the simulator's own alone runs; --alone for the recorded ones)",
                r.simulated.0, r.simulated.1
            );
        }
    }
    let _ = writeln!(
        s,
        "{:<20} {:>10} {:>10} {:>12} {:>10} {:>5}  timed from",
        "kernel", "blocks", "recorded us", "instances", "block us", "m"
    );
    for k in &r.kernels {
        let _ = writeln!(
            s,
            "{:<20} {:>10} {:>10.1} {:>12} {:>10.2} {:>5.2}  {}",
            gpumux_files::text::truncate(&k.name, 20),
            k.blocks,
            k.recorded_us,
            k.instances,
            k.block_time_us,
            k.mem_intensity,
            match k.source {
                build::Source::Alone => "alone recording",
                build::Source::Uncontended => "uncontended runs",
                build::Source::Shortest => "shortest run (shared)",
            }
        );
    }
    if let Some(p) = &r.probe {
        let _ = writeln!(
            s,
            "memory intensity beside the probe `{}` ({}): κ {:.2} (as good: {:.2}-{:.2}; the preset's {:.2})",
            p.probe_kernel, p.recording, p.kappa, p.kappa_range.0, p.kappa_range.1, p.preset_kappa
        );
        let _ = writeln!(
            s,
            "{:<20} {:>5} {:>5} {:>6} {:>7} {:>7} | {:>7} {:>7} {:>6} | {:>5} {:>11}",
            "kernel", "SMs", "probe", "runs", "x alone", "fit", "probe x", "fit", "runs", "m", "m as good"
        );
        for k in &p.kernels {
            let _ = writeln!(
                s,
                "{:<20} {:>5} {:>5} {:>6} {:>7.3} {:>7.3} | {:>7} {:>7.3} {:>6} | {:>5.2} {:>5.2}-{:<5.2}",
                gpumux_files::text::truncate(&k.name, 20),
                k.sms,
                k.probe_sms,
                k.instances,
                k.ratio,
                k.fitted_ratio,
                k.probe_ratio.map_or_else(|| "-".into(), |r| format!("{r:.3}")),
                k.fitted_probe_ratio,
                k.probe_instances,
                k.mem_intensity,
                k.mem_range.0,
                k.mem_range.1
            );
        }
    }
    for n in &r.notes {
        let _ = writeln!(s, "note: {n}");
    }
    if let Some(ok) = r.within_goal {
        let _ = writeln!(
            s,
            "{}: simulated ANTT and STP {} {:.0} % of the recorded ones",
            if ok { "PASS" } else { "FAIL" },
            if ok { "within" } else { "not both within" },
            r.goal_pct
        );
    }
    s
}

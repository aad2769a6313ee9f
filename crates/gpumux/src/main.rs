//! gpumux: share NVIDIA GPUs between processes the way an OS shares CPUs.
//!
//! Subcommands: `run` (a workload under several policies, on the simulated
//! GPU by default), `calibrate` (a workload's kernels measured alone on a
//! device, the simulator fitted to them), `replay` (gpumuxd's recorded clients in the
//! simulator), `bench` (measurements), `rt` (real-time schedulability
//! analysis), `policies` and `devices` (what is available), `ps` and `top`
//! (gpumuxd's clients), `daemon` (gpumuxd itself).

mod bench_daemon;
mod bench_sim;
mod calibrate;
mod devices;
mod plot;
mod preflight;
mod progress;
mod protocol_log;
mod ps;
mod replay;
mod rt_run;
mod run;
mod table;
mod trace;
mod work;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use devices::DeviceSpec;
use std::io::Write;
use std::path::PathBuf;

/// Policies compared when `--policy` is not given, spelled as the table
/// prints them (`rr-1000us` is `rr`'s default quantum).
pub(crate) const DEFAULT_POLICIES: &str =
    "fcfs,npq,ppq-excl-cs,ppq-excl-drain,ppq-shared-cs,dss-cs,dss-drain,rr-1000us";

/// Most worker threads `run` accepts: more than any host here has, and a run
/// never starts more threads than it has jobs.
const MAX_THREADS: u16 = 1024;

#[derive(Parser, Debug)]
#[command(name = "gpumux", version, about = "Share NVIDIA GPUs between processes the way an OS shares CPUs")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a workload under each policy and compare NTT, STP, fairness, latency.
    Run(RunArgs),
    /// Measure a workload's kernels alone on a device and fit the simulator to them.
    Calibrate(calibrate::CalibrateArgs),
    /// Replay a recording of gpumuxd's clients (`gpumuxd --record`) in the simulator,
    /// each client's recorded turnaround beside the simulated one.
    Replay(replay::ReplayArgs),
    /// Measure gpumux itself.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Real-time GPU task sets: response-time analysis, mode assignment, and runs through
    /// gpumuxd (GPU-SPARC).
    #[command(subcommand)]
    Rt(RtCli),
    /// Re-run a seed paper's evaluation on the simulated GPU (`experiment list`).
    Experiment(gpumux_experiments::ExperimentArgs),
    /// List the scheduling policies.
    Policies,
    /// List the devices.
    Devices,
    /// List gpumuxd's clients: memory, operations, SMs, preemptions.
    Ps(ps::PsArgs),
    /// The same as `ps`, live, refreshed every second (`q` quits).
    Top(ps::TopArgs),
    /// Run the daemon that processes share a GPU through (the same as `gpumuxd`).
    Daemon(gpumuxd::cli::DaemonArgs),
    /// Where each kernel's time went: join the stage stamps that processes run with
    /// GPUMUX_STAMPS=DIR wrote, and print each stage's pace (docs/program-speed.md).
    Stamps {
        /// The folder GPUMUX_STAMPS named.
        dir: PathBuf,
        /// Runs of fewer kernels than this are left out (a chain's rep is 511).
        #[arg(long, default_value_t = 100)]
        min_run: usize,
        /// Report each launch + sync instead (issue 35's latency goals): every stage's
        /// time on one clock, client to GPU and back, back to back and after a pause.
        #[arg(long)]
        syncs: bool,
    },
    /// A client program of `gpumux bench daemon` (started by the bench).
    #[command(hide = true)]
    BenchRole(bench_daemon::role::RoleArgs),
    /// A client of `gpumux bench daemon --hostile`, well-behaved or not (started by the bench).
    #[command(hide = true)]
    BenchHostileRole(bench_daemon::abusers::HostileRoleArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Workload: a TOML file, or a built-in such as `parboil-k20c:mix=8,seed=1`.
    workload: String,
    /// sim:k20c, sim:h100, sim:h200 or cuda:N (the GPU's index). Default: a real GPU when
    /// its backend is available, else sim:h100.
    #[arg(long)]
    device: Option<String>,
    /// Comma-separated policies (see `gpumux policies`).
    #[arg(long, default_value = DEFAULT_POLICIES)]
    policy: String,
    /// Seed of per-block time variation.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the results as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Write a Chrome-trace / Perfetto timeline (one lane per SM) to this file.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Write SVG charts into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Worker threads, 1 to 1024 (default: the host's cores).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=MAX_THREADS as i64))]
    threads: Option<u16>,
    /// No progress display on stderr. (Without it: a bar with an ETA on a
    /// terminal; elsewhere a line every 10 s once a run has taken 5 s.)
    #[arg(long, short)]
    quiet: bool,
    /// Largest estimated work to run, in simulated blocks (an operation
    /// counts as 8, a process as 100; over all isolated runs and policies),
    /// or `unlimited`. The default, about three minutes of one core, stops
    /// small files that would simulate for hours, with the estimate.
    #[arg(long, value_name = "BLOCKS", default_value = work::DEFAULT_MAX_WORK_ARG, value_parser = work::parse_max_work)]
    max_work: f64,
    /// A file from `gpumux calibrate`: the kernels' measured timing and the measured
    /// device's link and preemption costs, on a simulated --device.
    #[arg(long, value_name = "FILE")]
    calibration: Option<PathBuf>,
}

/// `gpumux rt`: the analysis commands of `gpumux-rt`, and `run`, which needs gpumuxd.
#[derive(Subcommand, Debug)]
enum RtCli {
    /// Run a task set for real through gpumuxd, each task's measured response times beside
    /// the analysis's bound (exits non-zero when one goes over it).
    Run(rt_run::RtRunArgs),
    #[command(flatten)]
    Analysis(gpumux_rt::cli::RtCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Simulator speed: simulated blocks per second of wall time, one core.
    Sim {
        /// A smaller sweep that takes seconds.
        #[arg(long)]
        quick: bool,
        /// Also write the rows as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// On a real NVIDIA GPU: correctness of transformed kernels, solo
    /// overhead, preemption latency, spatial sharing.
    Cuda(gpumux_cuda_bench::BenchArgs),
    /// On a real NVIDIA GPU: gpumuxd against time slicing and MPS
    /// (cross-process priority, co-run throughput, request overhead),
    /// every baseline in the same run.
    // Boxed: its options outgrow the other variants' (clippy's large_enum_variant).
    Daemon(Box<bench_daemon::DaemonBenchArgs>),
}

fn main() {
    restore_default_sigpipe();
    let cli = Cli::parse();
    let done = dispatch(cli);
    // This process's stage stamps, if GPUMUX_STAMPS is set (issue 35).
    gpumux_stamps::flush_or_say();
    if let Err(e) = done {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run(args) => cmd_run(args),
        Command::Calibrate(args) => calibrate::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Bench(BenchCommand::Sim { quick, json }) => {
            preflight::output_file("--json", json.as_deref())?;
            let rows = bench_sim::sweep(quick)?;
            print!("{}", bench_sim::render(&rows));
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&rows)?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(())
        }
        Command::Bench(BenchCommand::Cuda(args)) => {
            preflight::output_file("--json", args.json.as_deref())?;
            gpumux_cuda_bench::bench_main(args)
        }
        Command::Bench(BenchCommand::Daemon(args)) => {
            preflight::output_file("--json", args.json.as_deref())?;
            bench_daemon::run(*args)
        }
        Command::BenchRole(args) => bench_daemon::role::main(args),
        Command::BenchHostileRole(args) => bench_daemon::abusers::main(args),
        Command::Rt(RtCli::Run(args)) => rt_run::run(args),
        Command::Rt(RtCli::Analysis(cmd)) => gpumux_rt::cli::run(cmd),
        Command::Experiment(args) => gpumux_experiments::run(args),
        Command::Policies => {
            for (name, what) in gpumux_engine::policies::CATALOGUE {
                println!("{name:<18} {what}");
            }
            Ok(())
        }
        Command::Ps(args) => ps::ps(args),
        Command::Top(args) => ps::top(args),
        Command::Daemon(args) => gpumuxd::cli::run_logged(&args),
        Command::Stamps { dir, min_run, syncs } => {
            let lines = gpumux_stamps::analysis::read_dir(&dir)?;
            if syncs {
                print!("{}", gpumux_stamps::syncs::report(&lines));
            } else {
                print!("{}", gpumux_stamps::analysis::report(&lines, min_run));
            }
            Ok(())
        }
        Command::Devices => {
            for n in gpumux_sim::presets::NAMES {
                if let Some(d) = gpumux_sim::presets::by_name(n) {
                    println!(
                        "sim:{n:<6} {:>3} SMs, {} threads, {} blocks, {} registers, {} KB shared memory per SM; {:.0} GB/s",
                        d.num_sms, d.sm.max_threads, d.sm.max_blocks, d.sm.registers, d.sm.smem_bytes / 1024, d.mem_bandwidth / 1e9
                    );
                }
            }
            println!("cuda:N   a real NVIDIA GPU (software preemption by kernel transformation; see docs/cuda.md)");
            Ok(())
        }
    }
}

/// Ends gpumux quietly when the reader of its output goes away
/// (`gpumux rt analyze FILE | head -1`), as it ends `cat` or `grep`.
///
/// Rust starts programs with SIGPIPE ignored, so a write to a closed pipe
/// fails instead: `println!` panics (exit 101, "failed printing to stdout")
/// and `write!` returns an error. Restoring the default action once, here,
/// covers every subcommand, those in other crates included, where mapping
/// `BrokenPipe` would need all their printing routed through one writer.
/// gpumux's one socket (`ps`, `top`: the daemon's) is written with
/// MSG_NOSIGNAL, so the signal can only come from a closed stdout or stderr pipe.
fn restore_default_sigpipe() {
    // SAFETY: called first thing in main, before any thread exists; it only
    // resets one signal's disposition to the default.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn cmd_run(args: RunArgs) -> Result<()> {
    let policies = preflight::policy_list(&args.policy)?;
    preflight::output_file("--trace", args.trace.as_deref())?;
    preflight::output_dir("--plot", args.plot.as_deref())?;
    let mut workload = gpumux_workload::resolve(&args.workload)?;
    let mut device = match &args.device {
        Some(d) => DeviceSpec::parse(d)?,
        None if args.calibration.is_some() => DeviceSpec::parse("sim:h100")?,
        None => DeviceSpec::default_for(&workload),
    };
    if let Some(path) = &args.calibration {
        let cal = calibrate::file::Calibration::load(path)?;
        let DeviceSpec::Sim(info, _) = &device else {
            anyhow::bail!("--calibration is for a simulated device (sim:NAME); a GPU measures itself");
        };
        let given = format!("sim:{}", args.device.as_deref().unwrap_or("sim:h100").trim_start_matches("sim:"));
        if given != cal.target {
            eprintln!("note: {} was fitted for {}, used here on {given}", path.display(), cal.target);
        }
        workload = cal.apply(&workload).with_context(|| path.display().to_string())?;
        device = DeviceSpec::Sim(info.clone(), cal.tuning()?);
    }
    preflight::workload(&args.workload, &workload, &device)?;
    let opts = run::RunOptions {
        device,
        policies,
        seed: args.seed,
        trace: args.trace.is_some() || args.plot.is_some(),
        progress: progress::Mode::for_stderr(args.quiet),
        max_work: args.max_work,
        threads: args.threads.map_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()), usize::from),
    };
    let report = run::run_workload(&workload, &opts)?;
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report)?;
        writeln!(stdout)?;
    } else {
        write!(stdout, "{}", table::render(&report))?;
    }
    if let Some(path) = &args.trace {
        trace::write_chrome_trace(path, &report.traces)?;
        eprintln!("wrote trace {} (open it in ui.perfetto.dev)", path.display());
    }
    if let Some(dir) = &args.plot {
        let files = plot::write_plots(dir, &report.policies, &report.traces)?;
        eprintln!("wrote {} charts in {}", files.len(), dir.display());
    }
    Ok(())
}

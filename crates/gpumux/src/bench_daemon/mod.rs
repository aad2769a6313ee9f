//! `gpumux bench daemon`: gpumuxd against what people share a GPU with
//! today (issue 14; docs/daemon-measured.md), every baseline in the same
//! run:
//!
//! * **priority**: a high-priority client's small kernels at random moments
//!   while a low-priority client fills the GPU (`experiments.rs`, `priority_setting`);
//! * **co-run**: pairs of kernels started together, STP and fairness
//!   (`experiments.rs`, `corun_setting`);
//! * **overhead**: an empty kernel's launch + sync, and launch throughput
//!   of 1-8 clients (`experiments.rs`, the `overhead` part of `run_all`);
//! * **programs**: whole programs (a wavefront chain of 511 dependent
//!   launches, a barrier stencil, 1 GiB copied each way around a kernel),
//!   each checked against a CPU reference, natively alone against one
//!   client of the default daemon (issue 35; [`programs`]);
//! * **copy-beside**: the programs' chain alone, then beside a client
//!   copying 1 GiB up and down from ordinary and from pinned memory, the
//!   chain's ratio against issue 35's goal (`experiments/copy_beside.rs`);
//! * **multi-gpu**: four GPU-filling co-run loops at once through a daemon
//!   of every GPU of `--device` and through one of its first GPU, STP of
//!   each against the loops alone (issue 38; `experiments/multi_gpu.rs`).
//!
//! `--hostile` runs issue 36's soak instead: two well-behaved clients
//! alone, then beside four abusive ones, then after them, against one
//! daemon of the default config ([`hostile`], the clients in [`abusers`]).
//!
//! Baselines: plain CUDA processes under the driver's time slicing, the
//! same under MPS (a private control daemon, started and stopped here), and
//! two streams of one process. The client programs are this executable's
//! hidden `bench-role` ([`role`]), the jobs they run are in [`jobs`], the
//! kernels in `kernels.cu`. The bench builds nothing: it needs `gpumux` and
//! `gpumuxd` side by side and a GPU (or `--device sim:h100`, where only the
//! daemon rows run, on the simulated GPU).

pub mod abusers;
mod copier;
mod experiments;
pub mod gpu;
mod hostile;
pub mod jobs;
pub(crate) mod procs;
pub mod programs;
mod report;
pub mod role;

use anyhow::{bail, Context, Result};
use std::path::PathBuf;

/// `gpumux bench daemon`'s arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct DaemonBenchArgs {
    /// `cuda:<index>` or `sim:h100` (daemon rows only). Default: cuda:0 when
    /// a CUDA driver is present, else sim:h100. Several GPUs (`cuda:0,1`,
    /// `cuda:all`, `sim:h100x2`) for the multi-gpu experiment, which serves
    /// them all; the other experiments use the first.
    #[arg(long)]
    pub device: Option<String>,
    /// Experiments to run (comma-separated): priority, corun, overhead, programs,
    /// copy-beside (the chain alone and beside a client copying
    /// `--program-copy-mib` up and down: issue 35's last goal), multi-gpu
    /// (four GPU-filling clients on every GPU of `--device` against the same
    /// on its first GPU: issue 38's STP goal; not run unless named).
    #[arg(long, default_value = "priority,corun,overhead,programs,copy-beside", value_delimiter = ',')]
    pub only: Vec<String>,
    /// The daemon policy of the priority and overhead experiments (the candidate default).
    #[arg(long, default_value = gpumuxd::core::DEFAULT_POLICY)]
    pub policy: String,
    /// More daemon configurations for the priority experiment (comma-separated;
    /// `policy[+own-sms][+no-ahead][+in-process][+sockets][+sim]`: SMs of their own instead of
    /// shares of every SM, no queue ahead, the device in the daemon's process, clients
    /// on the socket instead of shared-memory rings, the simulated GPU).
    #[arg(
        long,
        default_value = "ppq-shared-drain,ppq-even-drain+own-sms,ppq-even-drain+no-ahead,ppq-even-drain+in-process",
        value_delimiter = ','
    )]
    pub priority_policies: Vec<String>,
    /// Daemon configurations of the co-run experiment (comma-separated,
    /// `policy[+own-sms][+no-ahead][+in-process]`; an empty list runs `--policy`
    /// alone). Policies that run one kernel at a time give it every SM, where
    /// co-location changes nothing: they run once.
    #[arg(
        long,
        default_value = "fcfs,coop,rr,npq,ppq-excl-drain,ppq-shared-drain,ppq-even-drain,ppq-even-drain+own-sms,ppq-even-drain+no-ahead,ppq-even-drain+in-process,dss-drain,dss-drain+own-sms,spatial-even,spatial-even+own-sms,spatial-even-dyn-drain,spatial-even-dyn-drain+own-sms",
        value_delimiter = ','
    )]
    pub corun_policies: Vec<String>,
    /// Low-priority block times, µs (comma-separated; 1 to 1,000,000).
    #[arg(long, default_value = "20,100,1000", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub block_us: Vec<u64>,
    /// The low-priority blocks sleep this long between reads of the clock they
    /// spin on, ns (0: a busy spin). A busy spin starves the warps around it
    /// of issue slots, which hardware block launches do not notice and the
    /// workers' claims between blocks do (`gpumux-cuda-check fill`).
    #[arg(long, default_value_t = 0)]
    pub lp_pause_ns: u32,
    /// How long each low-priority launch runs alone, ms (2: short enough that
    /// a stop is seen soon; longer ones show what a long kernel loses to the
    /// urgent kernels' retreats, e.g. SMs given back that stay idle).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub lp_launch_ms: u32,
    /// High-priority launches per setting.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub urgent_launches: u32,
    /// Asynchronous launches of the launch-rate figures, in all (shared by
    /// the clients of a setting). More makes the phase long enough to profile.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate_launches: u32,
    /// Client counts of the launch-rate figures (comma-separated).
    #[arg(long, default_value = "1,2,4,8", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=64))]
    pub rate_clients: Vec<u32>,
    /// How long each co-run kernel runs alone, seconds (above 0, at most 3600).
    #[arg(long, default_value_t = 2.0, value_parser = corun_seconds)]
    pub corun_seconds: f64,
    /// The programs of the programs experiment (comma-separated: chain,
    /// stencil, copy). One alone makes a long run of it to profile: each
    /// repetition is checked, and the stencil's check of its 256 MiB output
    /// took over 0.1 s a repetition on the H200 machine.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "chain,stencil,copy")]
    pub programs: Vec<programs::ProgramKind>,
    /// Timed repetitions of each program of the programs experiment (the
    /// table gives their median, min and max; --quick: at most 2).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub program_reps: u32,
    /// MiB the copy program moves each way, at most 16384 (--quick: at most
    /// 64; --quick also shrinks the stencil's grid to 2048 x 2048).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=16_384))]
    pub program_copy_mib: u64,
    /// Repetitions of the chain in each run of the copy-beside experiment
    /// (alone, beside each copier; --quick: at most 3). Enough that the
    /// chain spans several of the copier's rounds.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub copy_beside_reps: u32,
    /// Rounds of the copy-beside experiment: each runs the chain alone, then
    /// beside each copier, so that a drift of the machine's speed during the
    /// run weighs on the alone and the beside figures alike (--quick: 1).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub copy_beside_rounds: u32,
    /// Extra arguments for every daemon the bench starts (e.g. `--sm-slots 2`), space-separated.
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub daemon_args: String,
    /// Where each daemon's log goes (one file per configuration).
    #[arg(long, default_value = "gpumux-bench-daemon-logs")]
    pub logs: PathBuf,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Fewer launches and shorter runs (checks the bench itself, not the figures).
    #[arg(long)]
    pub quick: bool,
    /// Run the hostile-client soak instead of the experiments (issue 36; --only is ignored): two
    /// well-behaved clients' launch + sync latency alone, then beside four
    /// abusive clients (flood, never-read, half frames, huge grids), then
    /// after them; the daemon's survival and memory. Exits non-zero on a FAIL.
    #[arg(long)]
    pub hostile: bool,
    /// Seconds of each of --hostile's two measured phases (alone, abused); --quick: at most 3.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub hostile_seconds: u32,
    /// Connections per wave of --hostile's flood abuser.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub hostile_flood: u32,
    /// The abusers of --hostile (comma-separated; fewer to see what each costs).
    #[arg(long, default_value = "never-read,half-frames,huge-grids,flood", value_delimiter = ',')]
    pub hostile_abusers: Vec<String>,
}

/// `--corun-seconds`: a time a kernel can run for, not 0, a negative or NaN.
fn corun_seconds(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("`{s}` is not a number of seconds: {e}"))?;
    if v > 0.0 && v <= 3600.0 {
        Ok(v)
    } else {
        Err(format!("{v} s: expected more than 0 and at most 3600"))
    }
}

/// Runs the bench (module doc): prints the tables, writes the JSON.
pub fn run(mut args: DaemonBenchArgs) -> Result<()> {
    let device = args.device.clone().unwrap_or_else(|| {
        if gpumux_cuda::runtime::driver_present() {
            "cuda:0".into()
        } else {
            "sim:h100".into()
        }
    });
    // Several GPUs (`cuda:0,1`, `cuda:all`, `sim:h100x2`): the multi-gpu
    // experiment serves them all; every other setting serves the first.
    let specs = gpumuxd::gpus::device_specs(&device, gpumux_cuda::runtime::gpu_count)
        .map_err(|e| anyhow::anyhow!("bad device: {e}"))?;
    let many = (specs.len() > 1).then(|| (device.clone(), specs.len()));
    let device = specs.into_iter().next().unwrap_or(device);
    let ordinal = match device.strip_prefix("cuda:") {
        Some(n) => Some(n.parse::<i32>().with_context(|| format!("bad device `{device}`"))?),
        None if device.starts_with("sim:") => None,
        None => bail!("bad device `{device}`: expected cuda:<index> or sim:<preset>"),
    };
    if args.quick {
        args.urgent_launches = args.urgent_launches.min(40);
        args.corun_seconds = args.corun_seconds.min(0.3);
        args.program_reps = args.program_reps.min(2);
        args.copy_beside_reps = args.copy_beside_reps.min(3);
        args.copy_beside_rounds = 1;
        args.program_copy_mib = args.program_copy_mib.min(64);
    }
    // The bench writes `go`/`stop` to role processes that may have ended:
    // a closed pipe must be an error to handle, not the end of the bench
    // (gpumux restores SIGPIPE's default action for its printing commands).
    // SAFETY: setting a signal's disposition to SIG_IGN.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    std::fs::create_dir_all(&args.logs).with_context(|| format!("creating {}", args.logs.display()))?;
    let exe = std::env::current_exe().context("finding this executable")?;
    let dir = std::env::temp_dir().join(format!("gpumux-bench-daemon-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if args.hostile {
        let result = hostile::run(&args, &exe, &dir, &device);
        let _ = std::fs::remove_dir_all(&dir);
        let report = result?;
        emit(&report.render(), &report, args.json.as_deref())?;
        if !report.pass {
            bail!("the hostile soak did not meet its goals (the FAIL lines above)");
        }
        return Ok(());
    }
    let bench = experiments::Bench { exe, dir: dir.clone(), device: device.clone(), ordinal, many, args: args.clone() };
    let result = bench.run_all();
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    emit(&report.render(), &report, args.json.as_deref())
}

/// Prints a report's tables and writes it as JSON to `json`, if given.
fn emit(tables: &str, report: &impl serde::Serialize, json: Option<&std::path::Path>) -> Result<()> {
    print!("{tables}");
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

//! Measurements of gpumux's CUDA backend on a real GPU: correctness of the
//! transformed kernels under preemption, solo overhead, preemption latency
//! and spatial sharing, side by side on one GPU, printed as tables and
//! written as JSON.
//!
//! [`bench_main`] runs them for `gpumux bench cuda` and for the
//! `gpumux-cuda-check` program (the same flags: [`BenchArgs`]). Two
//! measurements start copies of the running program as child processes (a
//! second GPU client for time slicing and MPS): the hidden `lp-hog` and
//! `spatial-child` subcommands.

#![warn(missing_docs)]

mod check;
mod fill;
mod launches;
mod links;
mod overhead;
mod preemption;
mod spatial;
mod split;

pub use check::{check_suite, exactly_once, CheckRow, ExactlyOnce};
pub use fill::{fill, FillRow};
pub use launches::{launches, LaunchesRow, STENCIL_SMEM_SOURCE, WAVEFRONT_SOURCE};
pub use links::{links, LinkFit, LinkRow, LinksReport};
pub use overhead::{overhead, OverheadRow};
pub use preemption::{lp_hog, preemption, PreemptRow};
pub use spatial::{spatial, spatial_child, SpatialConfig, SpatialRow};
pub use split::{split, GoalRow, RefusedRow, SplitConfig, SplitReport, SplitRow, FMA_SOURCE};

use anyhow::Context as _;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use gpumux_cuda::runtime::Gpu;
use gpumux_cuda::suite::App;
use serde::Serialize;
use std::path::PathBuf;

/// Parses a suite app's name; `--help` lists the apps, one line each.
fn app_parser() -> impl TypedValueParser<Value = App> {
    let values = App::ALL.map(|a| PossibleValue::new(a.name()).help(a.summary()));
    PossibleValuesParser::new(values).try_map(|name| name.parse::<App>())
}

/// What to measure, and where (the flags of `gpumux bench cuda` and of
/// `gpumux-cuda-check`).
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The measurement.
    #[command(subcommand)]
    pub command: BenchCommand,
    /// Write all results as JSON here.
    #[arg(long, global = true)]
    pub json: Option<PathBuf>,
    /// GPU ordinal.
    #[arg(long, global = true, default_value_t = 0)]
    pub gpu: i32,
    /// Seed for inputs and random schedules.
    #[arg(long, global = true, default_value_t = 1)]
    pub seed: u64,
}

/// One measurement, or all of them.
// `help = None` keeps an option's `--help` line as it was before its doc
// comment was written: the comment is for readers of the code.
#[derive(Debug, clap::Subcommand)]
pub enum BenchCommand {
    /// Every suite kernel, transformed, under random retreat/resume and SM-set
    /// changes, against the native result and the CPU reference.
    Check {
        /// Random preemption rounds per app.
        #[arg(long, default_value_t = 2, help = None::<&str>)]
        rounds: u32,
    },
    /// Transformed vs native time per suite kernel, for several chunk sizes;
    /// then many short launches (a wavefront) and a barrier stencil, native vs
    /// the default path.
    Overhead {
        /// Blocks per claim: `auto` (the default path: chosen per launch from the
        /// kernel's measured block time, short launches native) and fixed sizes.
        #[arg(long, value_delimiter = ',', default_value = "auto,1,4,16")]
        chunks: Vec<gpumux_cuda::launch_plan::Chunk>,
        /// Interleaved repetitions per measurement (the median is reported).
        #[arg(long, default_value_t = 7, help = None::<&str>)]
        reps: u32,
        /// Only these apps (default: all).
        #[arg(long, value_delimiter = ',', value_parser = app_parser())]
        apps: Vec<App>,
        /// Claims per worker below which a launch's chunk shrinks.
        #[arg(long, default_value_t = gpumux_cuda::preempt::DEFAULT_MIN_CLAIMS)]
        min_claims: u32,
    },
    /// Arrival-to-first-block and arrival-to-completion of a short
    /// high-priority kernel while a long low-priority one fills the GPU.
    Preempt {
        /// Block times of the low-priority kernel, µs.
        #[arg(long, value_delimiter = ',', default_value = "10,20,100,1000", help = None::<&str>)]
        block_us: Vec<u64>,
        /// High-priority arrivals per block time and mode.
        #[arg(long, default_value_t = 200, help = None::<&str>)]
        trials: u32,
        /// native-priority, gpumux (default path), gpumux-chunk1 (workers, one block per claim),
        /// timeslice (two processes), mps (two processes; MPS must be running).
        #[arg(long, value_delimiter = ',', default_value = "native-priority,gpumux,timeslice")]
        modes: Vec<String>,
    },
    /// Memory-bound + compute-bound kernel: alone, one after the other, together under the
    /// hardware's scheduling, on disjoint SM sets (gpumux workers, green contexts), and as
    /// two processes under MPS (MPS must be running; else those rows are skipped).
    Spatial {
        /// Repetitions per row (the median is reported).
        #[arg(long, default_value_t = 5, help = None::<&str>)]
        reps: u32,
        /// SMs of the memory-bound app in each split (multiples of the green-context group
        /// size, 8 on an H100); the compute-bound app gets the other whole groups.
        #[arg(long, value_delimiter = ',', default_value = "16,32,48,64")]
        mem_sms: Vec<u32>,
        /// Row groups: hardware, workers, green, green-cost, mps (default: all).
        #[arg(long, value_delimiter = ',')]
        modes: Vec<String>,
        /// MPS pipe directory for the two child processes (default:
        /// $GPUMUX_MPS_PIPE_DIRECTORY, else $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps).
        #[arg(long)]
        mps_pipe_dir: Option<PathBuf>,
    },
    /// A GPU full of fixed-time blocks, natively and as workers: the block rate
    /// workers keep, and (from the GPU clock) blocks per SM, block time and the
    /// gap before an SM's next block. Not part of `all`.
    Fill {
        /// Block times, µs.
        #[arg(long, value_delimiter = ',', default_value = "20,100,1000", help = None::<&str>)]
        block_us: Vec<u64>,
        /// Repetitions per row (the median is reported).
        #[arg(long, default_value_t = 5, help = None::<&str>)]
        reps: u32,
        /// Sleeps of the spinning threads between clock reads, ns (0: busy spin), one table each.
        #[arg(long, value_delimiter = ',', default_value = "0", help = None::<&str>)]
        pause_ns: Vec<u32>,
    },
    /// One launch split over several GPUs (GPUs 0..N): a compute-bound and
    /// a memory-bound kernel, each merged with shadow buffers and with
    /// declared slices, compared bytewise with the native kernel on one GPU
    /// and timed against it; refused kernels; the goals table. Not part of `all`.
    Split {
        /// GPUs to split over (default: every GPU the driver sees, at most 8).
        #[arg(long)]
        gpus: Option<usize>,
        /// Timed runs per row (the median is reported).
        #[arg(long, default_value_t = 7)]
        reps: u32,
        /// Threads of the compute-bound FMA kernel (256 a block).
        #[arg(long, default_value_t = 1 << 23)]
        fma_n: u32,
        /// FMA iterations per thread (4 chains each).
        #[arg(long, default_value_t = 60000)]
        fma_iters: u32,
        /// Bodies of nbody.
        #[arg(long, default_value_t = 1 << 18)]
        nbody_n: u64,
        /// Elements of triad.
        #[arg(long, default_value_t = 1 << 28)]
        triad_n: u64,
        /// Elements of reduce_partial (4 GiB by default: about a millisecond on one H200).
        #[arg(long, default_value_t = 1 << 30)]
        reduction_n: u64,
    },
    /// The links the simulator models (issue 38): peer copies between GPUs 0
    /// and 1 and host copies to and from each, 4 KiB to 1 GiB, with the
    /// simulator's link model fitted to each and the preset's beside it.
    /// Not part of `all`.
    Links {
        /// Timed copies per size (the median is reported).
        #[arg(long, default_value_t = 9)]
        reps: u32,
    },
    /// Everything above but `fill`, `split` and `links`, in that order, with default settings.
    All,
    /// (internal) A second process that keeps the GPU busy with low-priority spin kernels.
    #[command(hide = true)]
    LpHog {
        /// Block time of the spin kernels, µs.
        #[arg(long, help = None::<&str>)]
        block_us: u64,
        /// How long to keep the GPU busy.
        #[arg(long, help = None::<&str>)]
        seconds: f64,
    },
    /// (internal) One app of the spatial bench's MPS rows, run once per `go` line on stdin.
    #[command(hide = true)]
    SpatialChild {
        /// The app to run.
        #[arg(long, value_parser = app_parser(), help = None::<&str>)]
        app: App,
    },
}

/// Everything one invocation measured: the JSON written with `--json`
/// (rewritten after each measurement, so a crash keeps what was done).
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The GPU.
    pub device: Option<gpumux_cuda::runtime::DeviceSummary>,
    /// When the run started, seconds since 1970.
    pub date_unix: u64,
    /// `check`: one row per app and round.
    pub check: Vec<CheckRow>,
    /// `check`: the exactly-once storm.
    pub exactly_once: Option<ExactlyOnce>,
    /// `overhead`: one row per app.
    pub overhead: Vec<OverheadRow>,
    /// `overhead`: the many-short-launches cases.
    pub launches: Vec<LaunchesRow>,
    /// `preempt`: one row per mode and block time.
    pub preempt: Vec<PreemptRow>,
    /// `spatial`: one row per binding and split.
    pub spatial: Vec<SpatialRow>,
    /// `fill`: one row per mode and block time.
    pub fill: Vec<FillRow>,
    /// `split`: the rows, refusals and goals.
    pub split: Option<SplitReport>,
    /// `links`: the copies' times and the model fitted to each link.
    pub links: Option<LinksReport>,
}

/// Runs the measurements `args` asks for, printing a table for each (and
/// the JSON report with `--json`); the entry point of `gpumux bench cuda`
/// and of `gpumux-cuda-check`. `Err` when the GPU cannot be opened, a
/// measurement fails, or a correctness check does not pass.
pub fn bench_main(args: BenchArgs) -> anyhow::Result<()> {
    if let BenchCommand::LpHog { block_us, seconds } = args.command {
        return lp_hog(args.gpu, block_us, seconds);
    }
    if let BenchCommand::SpatialChild { app } = args.command {
        return spatial_child(args.gpu, app, args.seed);
    }
    let gpu = Gpu::open(args.gpu).context("opening the GPU")?;
    let mut rep = Report {
        device: Some(gpu.summary.clone()),
        date_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        ..Default::default()
    };
    println!(
        "GPU: {} (sm_{}{}, {} SMs, driver {})",
        gpu.summary.name,
        gpu.summary.compute_capability.0,
        gpu.summary.compute_capability.1,
        gpu.summary.sm_count,
        gpu.summary.driver_version
    );
    let save = |rep: &Report| -> anyhow::Result<()> {
        if let Some(p) = &args.json {
            std::fs::write(p, serde_json::to_string_pretty(rep)?)
                .with_context(|| format!("writing {}", p.display()))?;
        }
        Ok(())
    };
    let all = matches!(args.command, BenchCommand::All);
    let mut failed = false;
    if let BenchCommand::Links { reps } = args.command {
        rep.links = Some(links(reps)?);
        save(&rep)?;
        return Ok(());
    }
    if let BenchCommand::Split { gpus, reps, fma_n, fma_iters, nbody_n, triad_n, reduction_n } = args.command {
        let cfg = SplitConfig { gpus, reps, fma_n, fma_iters, nbody_n, triad_n, reduction_n, seed: args.seed };
        let (report, ok) = split(&cfg)?;
        rep.split = Some(report);
        save(&rep)?;
        if !ok {
            anyhow::bail!(
                "split: a result was not bitwise equal to the one-GPU run, or a kernel was not refused (see above)"
            );
        }
        return Ok(());
    }
    if let BenchCommand::Check { rounds } = args.command {
        failed |= run_check(&gpu, &mut rep, rounds, args.seed)?;
    } else if all {
        failed |= run_check(&gpu, &mut rep, 2, args.seed)?;
    }
    save(&rep)?;
    if let BenchCommand::Overhead { chunks, reps, apps, min_claims } = &args.command {
        rep.overhead = overhead(&gpu, chunks, *min_claims, *reps, apps, args.seed)?;
        save(&rep)?;
        rep.launches = launches(&gpu, *reps, args.seed)?;
    } else if all {
        use gpumux_cuda::launch_plan::Chunk;
        let chunks = [Chunk::Auto, Chunk::Fixed(1), Chunk::Fixed(4), Chunk::Fixed(16)];
        rep.overhead = overhead(&gpu, &chunks, gpumux_cuda::preempt::DEFAULT_MIN_CLAIMS, 7, &[], args.seed)?;
        save(&rep)?;
        rep.launches = launches(&gpu, 7, args.seed)?;
    }
    save(&rep)?;
    if let BenchCommand::Preempt { block_us, trials, modes } = &args.command {
        rep.preempt = preemption(&gpu, block_us, *trials, modes, args.seed)?;
    } else if all {
        let modes = ["native-priority", "gpumux", "timeslice"].map(String::from);
        rep.preempt = preemption(&gpu, &[10, 20, 100, 1000], 200, &modes, args.seed)?;
    }
    save(&rep)?;
    if let BenchCommand::Fill { block_us, reps, pause_ns } = &args.command {
        for &p in pause_ns {
            rep.fill.extend(fill(&gpu, block_us, *reps, p)?);
        }
    }
    if let BenchCommand::Spatial { reps, mem_sms, modes, mps_pipe_dir } = &args.command {
        let cfg = SpatialConfig {
            mem_sms: mem_sms.clone(),
            modes: modes.clone(),
            mps_pipe_dir: mps_pipe_dir.clone(),
            ..SpatialConfig::new(*reps, args.seed)
        };
        rep.spatial = spatial(&gpu, &cfg)?;
    } else if all {
        rep.spatial = spatial(&gpu, &SpatialConfig::new(5, args.seed))?;
    }
    save(&rep)?;
    if failed {
        anyhow::bail!("correctness checks failed (see the table above)");
    }
    Ok(())
}

fn run_check(gpu: &Gpu, rep: &mut Report, rounds: u32, seed: u64) -> anyhow::Result<bool> {
    rep.check = check_suite(gpu, rounds, seed)?;
    let once = exactly_once(gpu, seed)?;
    println!(
        "exactly-once: {} spin blocks, {} retreats ({} effective), {} blocks not run exactly once",
        once.blocks, once.retreats, once.effective_retreats, once.wrong
    );
    let failed = rep.check.iter().any(|r| !r.ok) || once.wrong != 0;
    rep.exactly_once = Some(once);
    Ok(failed)
}

/// Median of a non-empty list (0 for an empty one).
pub(crate) fn median(v: &mut [f64]) -> f64 {
    percentile(v, 50.0)
}

/// Nearest-rank percentile.
pub(crate) fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles() {
        let mut v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(super::percentile(&mut v, 50.0), 100.0);
        assert_eq!(super::percentile(&mut v, 99.0), 198.0);
        assert_eq!(super::percentile(&mut v, 100.0), 200.0);
        assert_eq!(super::median(&mut []), 0.0);
    }
}

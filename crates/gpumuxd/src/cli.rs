//! The daemon's command line, shared by `gpumuxd` and `gpumux daemon`: one
//! clap struct, so the two commands take exactly the same options.

use crate::daemon::{run, DeviceHosting, Options};
use clap::ArgAction;
use std::path::PathBuf;

/// The daemon's options on the command line (each overrides the config's `[daemon]` table).
#[derive(clap::Args, Debug, Clone)]
pub struct DaemonArgs {
    /// Unix socket to listen on [default: $XDG_RUNTIME_DIR/gpumux.sock, else /run/gpumux/gpumux.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Device: cuda:N (the GPU's index; options after commas: co-locate or own-sms, no-queue-ahead, no-refill or refill-always), or
    /// sim:k20c, sim:h100, sim:h200 [default: cuda:0 if a GPU is found, else sim:h100]. Several GPUs: cuda:all, cuda:0,1
    /// (options after the indices), sim:h100x2 (docs/multi-gpu.md). On a GPU, launches given part of the SMs share
    /// every SM their priority level may use or keep SMs of their own, whichever measured better for the
    /// pair of kernels (`,co-locate`: always share; `,own-sms`: always their own), and a stream's next
    /// kernel is queued on the GPU behind the running one (`,no-queue-ahead`: not), and a launch given back
    /// SMs it cannot go on in is refilled at once (`,no-refill`: drained and restarted; docs/daemon-cuda.md).
    #[arg(long)]
    pub device: Option<String>,
    /// Scheduling policy (gpumux policies lists them) [default: ppq-even-drain].
    #[arg(long)]
    pub policy: Option<String>,
    /// Which GPU a client goes to when the device is several (cuda:all,
    /// cuda:0,1, sim:h100x2): pairs (least-loaded, with a memory-bound and a
    /// compute-bound client, as they declare with GPUMUX_CLASS, counted as one
    /// on a GPU), least-loaded (fewest clients, then least work queued) or
    /// memory (most free device memory); a client may pin itself
    /// (GPUMUX_GPU=N) [default: pairs].
    #[arg(long)]
    pub placement: Option<String>,
    /// With several GPUs: move an idle client (nothing queued or running) to
    /// a GPU left with no client while its own GPU holds two or more (or, a
    /// client that declared GPUMUX_CLASS, to where it completes a pair), at its
    /// next request; its buffers' bytes go through host memory and it keeps
    /// its handles (docs/multi-gpu.md, "Moving a client between GPUs"). Off by
    /// default; a client with more than 1 GiB of buffers stays.
    #[arg(long)]
    pub rebalance: bool,
    /// Config file: who may connect, with which limits [default: only this user and root].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Run the device in the daemon's process: a little less latency per
    /// operation, but a GPU fault then stops the daemon (CUDA cannot recover
    /// in the faulting process). Default for sim:*.
    #[arg(long, conflicts_with = "device_process")]
    pub device_in_process: bool,
    /// Run the device in a child process (`gpumuxd`, found beside this
    /// executable) that the daemon restarts after a fault or a crash.
    /// Default for cuda:N; for sim:* it tests that path.
    #[arg(long)]
    pub device_process: bool,
    /// How often the core polls the device while work is on it, µs
    /// [default: 5]. Lower sees launch ends sooner for more CPU.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub poll_us: Option<u64>,
    /// How long each of the daemon's threads polls after traffic before it
    /// sleeps, µs [default: 100 to 500, per thread]. A client whose requests
    /// come at most this far apart finds every thread awake (no wake-ups on its
    /// path), for a core busy per thread that long after its traffic.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub spin_us: Option<u64>,
    /// Record every client's operations (kernels, copies, syncs: what, when
    /// submitted, started and ended) to this file, one JSON line each, appended;
    /// `gpumux replay FILE` replays them in the simulator (docs/calibration.md).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Host memory the daemon may use for evicted buffers when clients
    /// together allocate more than the device has (`64GiB`, `0`: never
    /// evict) [default: the config's swap_memory, else half the host's
    /// memory]. docs/daemon.md, "Memory oversubscription".
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub swap_memory: Option<u64>,
    /// Device memory the daemon hands out, per GPU (`48GiB`) [default: the
    /// config's device_memory, else all of it]. Above the GPU's memory it
    /// refuses to start. With it, a host whose RAM is smaller than the GPU can
    /// still hold oversubscribed clients' evicted buffers (docs/oversubscription.md).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub device_memory: Option<u64>,
    /// How long a client that got its memory keeps it, in round trips of
    /// its bytes over the host link (default 8; `0`: it may be evicted at
    /// its next idle moment, which makes clients that sync often swap at
    /// every sync: for measuring moves). docs/oversubscription.md.
    #[arg(long, value_name = "FACTOR", value_parser = parse_keep)]
    pub swap_keep: Option<f64>,
    /// `off`: no oversubscription at all. Every buffer is a plain device
    /// allocation (`cuMemAlloc`, no address-stable mapping), an allocation
    /// beyond the device's free memory or the client's quota is refused
    /// with the numbers, nothing is ever evicted and nothing is pinned for
    /// evicted buffers [default: GPUMUX_OVERSUBSCRIBE=on|off in the
    /// environment, else the config's oversubscribe, else on].
    /// docs/oversubscription.md, "Turning it off".
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub oversubscribe: Option<bool>,
    /// More logging (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, action = ArgAction::Count)]
    pub verbose: u8,
}

impl DaemonArgs {
    /// The daemon's options (logging is not one of them).
    pub fn options(&self) -> Options {
        Options {
            socket: self.socket.clone(),
            device: self.device.clone(),
            policy: self.policy.clone(),
            config: self.config.clone(),
            hosting: match (self.device_in_process, self.device_process) {
                (true, _) => Some(DeviceHosting::InProcess),
                (_, true) => Some(DeviceHosting::ChildProcess),
                _ => None,
            },
            poll_every: self.poll_us.map(std::time::Duration::from_micros),
            record: self.record.clone(),
            swap_memory: self.swap_memory,
            device_memory: self.device_memory,
            swap_keep: self.swap_keep,
            oversubscribe: self.oversubscribe,
            placement: self.placement.clone(),
            rebalance: self.rebalance.then_some(true),
        }
    }
}

/// `--oversubscribe`: `on` or `off`.
fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{s:?}: on or off")),
    }
}

/// `--swap-keep`: a finite factor, 0 or more.
fn parse_keep(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() && f >= 0.0 => Ok(f),
        _ => Err(format!("{s:?} is not a factor of 0 or more (8: the default)")),
    }
}

/// A size on the command line, as the config writes one (`"8 GiB"`).
fn parse_size(s: &str) -> Result<u64, String> {
    crate::config::parse_bytes(s)
}

/// Sends logs to stderr at the level `-v` asks for (RUST_LOG overrides), then
/// runs the daemon until SIGINT/SIGTERM. The error is not logged: the caller
/// prints it, once (`gpumuxd: ...`, `error: ...`); logged too, every start-up
/// error came twice on stderr.
pub fn run_logged(args: &DaemonArgs) -> anyhow::Result<()> {
    init_logging(args.verbose);
    crate::spin::set(args.spin_us.unwrap_or(0));
    run(args.options())
}

/// Logs to stderr at the level `-v` asks for (RUST_LOG overrides); colours
/// only on a terminal, so a log file or journald gets plain text.
pub fn init_logging(verbose: u8) {
    use std::io::IsTerminal;
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // A host program may have set a subscriber already; its choice stands.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

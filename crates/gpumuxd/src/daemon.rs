//! The daemon as a whole: options, the device, the core thread, the accept
//! loop, and a clean stop on SIGINT/SIGTERM.

use crate::backend::remote::RemoteBackend;
use crate::backend::sim::{SimBackend, UnknownPreset};
use crate::backend::Backend;
use crate::config::Config;
use crate::core::{Core, CoreMsg};
use crate::gpus::{GpuBoard, Gpus};
use crate::placement::Placement;
use crate::server;
use anyhow::{bail, Context, Result};
pub use gpumux_cuda::client::Refill;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

/// What `gpumuxd` (and `gpumux daemon`) take; `None` means: the config's
/// `[daemon]` table, else the default.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The socket (default `gpumux_proto::default_socket_path()`).
    pub socket: Option<PathBuf>,
    /// `cuda:N` or `sim:NAME` (default: `cuda:0` when a GPU is found, else `sim:h100`).
    pub device: Option<String>,
    /// The scheduling policy (default [`crate::core::DEFAULT_POLICY`]).
    pub policy: Option<String>,
    /// The config file (default: only this uid and root may connect).
    pub config: Option<PathBuf>,
    /// Where the device runs (default: [`DeviceHosting::default_for`] the device).
    pub hosting: Option<DeviceHosting>,
    /// How often a busy device is polled (default [`crate::core::SPIN_WAIT`]).
    pub poll_every: Option<std::time::Duration>,
    /// Record every client's operations to this file (`--record`; `gpumux replay` reads it).
    pub record: Option<PathBuf>,
    /// Host memory evicted buffers may take, bytes (default: the config's
    /// `swap_memory`, else [`crate::core::default_swap_memory`]).
    pub swap_memory: Option<u64>,
    /// Device memory handed out per GPU, bytes (`--device-memory`; default:
    /// the config's `device_memory`, else all; `backend::capped`).
    pub device_memory: Option<u64>,
    /// Round trips a client keeps memory it got (`--swap-keep`; default
    /// [`crate::core::DEFAULT_SWAP_KEEP`]).
    pub swap_keep: Option<f64>,
    /// Oversubscription on or off (`--oversubscribe`; default:
    /// [`gpumux_cuda::client::OVERSUBSCRIBE_VAR`], else the config's, else on).
    pub oversubscribe: Option<bool>,
    /// Which GPU a client goes to when the daemon serves several
    /// (default [`crate::placement::DEFAULT_PLACEMENT`]).
    pub placement: Option<String>,
    /// Moves idle clients to GPUs left with no client (`--rebalance`; default: the config's, else off).
    pub rebalance: Option<bool>,
}

/// Where the device runs (docs/daemon.md, "Isolation and faults").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceHosting {
    /// In the daemon's process: no message passing, but a GPU fault poisons
    /// the daemon's CUDA state for good, so it must stop.
    InProcess,
    /// In a child process the daemon restarts after a fault (or a crash).
    ChildProcess,
}

impl DeviceHosting {
    /// A GPU in a child (a fault must not end the daemon); the simulator,
    /// which recovers in-process, in the daemon.
    pub fn default_for(spec: &str) -> DeviceHosting {
        if spec.starts_with("cuda:") {
            DeviceHosting::ChildProcess
        } else {
            DeviceHosting::InProcess
        }
    }
}

/// The device to serve: `spec`, or `cuda:0` if a GPU is usable, else `sim:h100`.
pub fn pick_device(spec: Option<&str>) -> String {
    match spec {
        Some(s) => s.to_string(),
        None => match gpumux_cuda::cuda_available() {
            Ok(_) => {
                tracing::info!("a GPU is present: serving cuda:0 (--device sim:h100 for the simulator)");
                "cuda:0".to_string()
            }
            Err(e) => {
                tracing::info!("no usable GPU ({e}): serving the simulated sim:h100");
                "sim:h100".to_string()
            }
        },
    }
}

/// A GPU spec, `cuda:<index>[,co-locate|,own-sms][,no-queue-ahead][,no-refill|,refill-always][,hw-priority|,no-hw-priority]` (docs/daemon.md, "Devices").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaSpec {
    /// The GPU's ordinal.
    pub ordinal: i32,
    /// Launches given a share of the SMs run at that share of every SM
    /// their priority level may use (`ClientDevice::open_co_located`, the
    /// default: docs/daemon-measured.md, "The default policy"); `,own-sms`: on SMs
    /// of their own.
    pub co_locate: bool,
    /// With `co_locate`, each pair of co-running kernels is placed co-located
    /// or on SMs of their own, whichever measured better
    /// (`ClientDevice::set_choose_placement`, the default); `,co-locate`:
    /// always co-located.
    pub choose: bool,
    /// A stream's next kernel is queued on the GPU behind the running one
    /// (`ClientDevice::set_queue_ahead`, the default); `,no-queue-ahead`: not.
    pub queue_ahead: bool,
    /// When a grow refills a launch (fresh workers over all its SMs at once)
    /// instead of draining and restarting it (`ClientDevice::set_refill`):
    /// where it cannot go on in place (the default); `,refill-always`: also
    /// whenever it gives back SMs workers had left; `,no-refill`: never.
    pub refill: Refill,
    /// `,hw-priority`: a launch alone at its priority (but a short one beside
    /// another priority's workers) runs as the client's kernel itself,
    /// priority left to the hardware's stream priorities
    /// (`ClientDevice::set_hw_priority`; modules are compiled natively too);
    /// `,no-hw-priority`: never. Neither (`None`): on under the PPQ
    /// policies, off under the others ([`resolve_hw_priority`]).
    pub hw_priority: Option<bool>,
}

/// `spec` with hardware priority made explicit for `policy` where the spec
/// leaves it open: on under the PPQ policies, which schedule by priority
/// and preempt for it (a lone launch per priority level is then best left
/// to the hardware's stream priorities: docs/daemon-cuda.md, "Hardware
/// priority"); off under the others, whose SM partitions and time slices a
/// native launch would not keep. Not a GPU spec: unchanged.
pub fn resolve_hw_priority(spec: &str, policy: &str) -> String {
    match parse_cuda_spec(spec) {
        Some(Ok(CudaSpec { hw_priority: None, .. })) if policy.starts_with("ppq") => format!("{spec},hw-priority"),
        _ => spec.to_string(),
    }
}

/// Parses a GPU spec ([`CudaSpec`]). `None`: not a GPU spec.
pub fn parse_cuda_spec(spec: &str) -> Option<Result<CudaSpec>> {
    let rest = spec.strip_prefix("cuda:")?;
    let mut parts = rest.split(',');
    let n = parts.next().unwrap_or_default();
    let Ok(ordinal) = n.parse::<i32>().map_err(|_| ()).and_then(|o| if o >= 0 { Ok(o) } else { Err(()) }) else {
        return Some(Err(anyhow::anyhow!(
            "bad device `{spec}`: expected cuda:<index>[,co-locate|,own-sms][,no-queue-ahead][,no-refill|,refill-always][,hw-priority|,no-hw-priority], e.g. cuda:0"
        )));
    };
    let mut parsed = CudaSpec {
        ordinal,
        co_locate: true,
        choose: true,
        queue_ahead: true,
        refill: Refill::Drained,
        hw_priority: None,
    };
    for option in parts {
        match option {
            "co-locate" => (parsed.co_locate, parsed.choose) = (true, false),
            "own-sms" => (parsed.co_locate, parsed.choose) = (false, false),
            "queue-ahead" => parsed.queue_ahead = true,
            "no-queue-ahead" => parsed.queue_ahead = false,
            "refill" => parsed.refill = Refill::Drained,
            "no-refill" => parsed.refill = Refill::Off,
            "refill-always" => parsed.refill = Refill::Always,
            "hw-priority" => parsed.hw_priority = Some(true),
            "no-hw-priority" => parsed.hw_priority = Some(false),
            other => {
                return Some(Err(anyhow::anyhow!(
                    "bad device `{spec}`: unknown option `{other}` (known: co-locate, own-sms, no-queue-ahead, no-refill, refill-always, hw-priority, no-hw-priority)"
                )));
            }
        }
    }
    Some(Ok(parsed))
}

/// Opens device `spec` in this process.
pub fn open_in_process(spec: &str) -> Result<Box<dyn Backend>> {
    if let Some(parsed) = parse_cuda_spec(spec) {
        return crate::backend::cuda::open(parsed?);
    }
    Ok(Box::new(SimBackend::open(spec)?))
}

/// Opens device `spec` where `hosting` says; a child process is this
/// executable run with `--device-host` ([`crate::device_host`]).
pub fn open_device(spec: &str, hosting: DeviceHosting) -> Result<Box<dyn Backend>> {
    match hosting {
        // Launches of kernels the device ran ahead answered without a poll,
        // as through a device process (`backend::answers_ahead`).
        DeviceHosting::InProcess => {
            Ok(Box::new(crate::backend::answers_ahead::AnswersAhead::new(open_in_process(spec)?)))
        }
        DeviceHosting::ChildProcess => {
            if let Some(parsed) = parse_cuda_spec(spec) {
                parsed?;
            } else {
                // Refuse an unknown preset here, with the list, not from the child.
                let (preset, _) = crate::backend::sim::sim_spec(spec)?;
                if gpumux_sim::presets::by_name(preset).is_none() {
                    return Err(UnknownPreset(spec.to_string()).into());
                }
            }
            Ok(Box::new(RemoteBackend::start(&device_host_exe()?, spec)?))
        }
    }
}

/// The executable that serves as the device process: `gpumuxd` itself, or,
/// when the daemon runs as `gpumux daemon`, the `gpumuxd` installed beside it.
fn device_host_exe() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this executable to start the device process")?;
    if exe.file_stem().is_some_and(|n| n == "gpumuxd") {
        return Ok(exe);
    }
    let beside = exe.with_file_name("gpumuxd");
    if beside.is_file() {
        return Ok(beside);
    }
    bail!(
        "the device process is `gpumuxd`, and there is none beside {}: install it there, or run with --device-in-process",
        exe.display()
    )
}

/// Runs the daemon until SIGINT/SIGTERM (Ok) or a device failure it cannot
/// recover from (Err).
pub fn run(opts: Options) -> Result<()> {
    crate::heap::tune();
    // SAFETY: geteuid cannot fail.
    let own_uid = unsafe { libc::geteuid() };
    let config = match &opts.config {
        Some(path) => {
            let config = Config::load(path)?;
            let warnings = config.check_ids(path, crate::config::system_knows_uid, crate::config::system_knows_gid)?;
            for w in warnings {
                tracing::warn!("{w}");
            }
            config
        }
        None => Config::own_user_only(own_uid),
    };
    check_os_room(&config.limits);
    let socket = opts.socket.clone().or(config.daemon.socket.clone()).unwrap_or_else(gpumux_proto::default_socket_path);
    let device = opts.device.clone().or(config.daemon.device.clone());
    let policy = opts.policy.clone().or(config.daemon.policy.clone());
    let device = pick_device(device.as_deref());
    let placement: Placement = match opts.placement.clone().or(config.daemon.placement.clone()) {
        Some(name) => name.parse()?,
        None => crate::placement::DEFAULT_PLACEMENT,
    };
    // One spec per GPU (cuda:all, cuda:0,1, sim:h100x2: gpus.rs), one core each.
    let specs = crate::gpus::device_specs(&device, gpumux_cuda::runtime::gpu_count)?;
    let record = opts.record.clone().or(config.daemon.record.clone());
    if record.is_some() && specs.len() > 1 {
        bail!(
            "--record serves one GPU for now: `{device}` is {} GPUs (record one of them, e.g. {})",
            specs.len(),
            specs[0]
        );
    }
    let oversubscribe = match opts.oversubscribe {
        Some(on) => on,
        None => oversubscribe_from_env()?.or(config.daemon.oversubscribe).unwrap_or(true),
    };
    // The device processes, started below, inherit it (and an in-process
    // device reads it): off, their buffers are plain `cuMemAlloc`s.
    std::env::set_var(gpumux_cuda::client::OVERSUBSCRIBE_VAR, if oversubscribe { "on" } else { "off" });
    // Off: no host memory for evicted buffers, none pinned for them.
    let swap = if oversubscribe {
        opts.swap_memory.or(config.daemon.swap_memory.map(|b| b.0)).unwrap_or_else(crate::core::default_swap_memory)
    } else {
        0
    };
    pin_swap_memory(swap / specs.len() as u64);
    let device_memory = opts.device_memory.or(config.daemon.device_memory.map(|b| b.0));
    if let Some(cap) = device_memory {
        // The device processes, started below, inherit it: their pinned host
        // pools see oversubscription coming against the cap, not the GPU.
        std::env::set_var(gpumux_cuda::client::DEVICE_MEMORY_VAR, cap.to_string());
    }
    let mut cores = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let spec = resolve_hw_priority(spec, policy.as_deref().unwrap_or(crate::core::DEFAULT_POLICY));
        let hosting = opts.hosting.unwrap_or_else(|| DeviceHosting::default_for(&spec));
        let backend = match open_device(&spec, hosting) {
            Ok(b) => b,
            Err(e) if specs.len() > 1 => return Err(e.context(format!("cannot open GPU {i} ({spec})"))),
            Err(e) => return Err(e),
        };
        let backend: Box<dyn crate::backend::Backend> = match device_memory {
            Some(cap) => {
                let capped = crate::backend::capped::Capped::new(backend, cap)?;
                tracing::info!("device memory handed out: {cap} bytes (--device-memory)");
                Box::new(capped)
            }
            None => backend,
        };
        let mut core = Core::new(backend, policy.as_deref()).context("cannot start the scheduling engine")?;
        if let Some(every) = opts.poll_every {
            core = core.with_poll_interval(every);
        }
        if let Some(path) = &record {
            core = core.with_recording(path)?;
            tracing::info!("recording the clients' operations to {}", path.display());
        }
        // Host memory for evicted buffers is the daemon's, shared evenly among its GPUs.
        core = core.with_swap_memory(swap / specs.len() as u64).with_oversubscribe(oversubscribe);
        if let Some(keep) = opts.swap_keep {
            core = core.with_swap_keep(keep);
        }
        let board = Arc::new(GpuBoard::new(core.device(), core.memory_total()));
        if specs.len() > 1 {
            core = core.with_gpu(i as u32, board.clone());
        }
        if specs.len() > 1 {
            tracing::info!("GPU {i}: device {}, policy {}", core.device(), core.policy());
        } else {
            tracing::info!("device {}, policy {}", core.device(), core.policy());
        }
        cores.push((core, board));
    }
    if oversubscribe {
        tracing::info!("evicted buffers may take {swap} bytes of host memory (swap_memory)");
    } else {
        tracing::info!(
            "oversubscription off: buffers are plain device allocations, refused beyond the device's free memory; \
             nothing is ever evicted"
        );
    }
    if let Some(keep) = opts.swap_keep {
        tracing::info!("a client keeps memory it got for {keep} round trips of it (swap_keep)");
    }
    if cores.len() > 1 {
        tracing::info!("{} GPUs; clients are placed by `{placement}` unless they pin one", cores.len());
    }
    let listener = server::bind(&socket)?;
    // From here every way out, an error or a panic, removes the socket file.
    let bound = BoundSocket(socket.clone());
    tracing::info!("listening on {}", socket.display());
    server::install_signal_handlers();

    let mut senders = Vec::new();
    let mut boards = Vec::new();
    let mut core_threads = Vec::new();
    // Every core's channel first: with several GPUs each core can send another
    // a part of a split launch (core/split.rs).
    let channels: Vec<_> = cores.iter().map(|_| channel::<CoreMsg>()).collect();
    let peers: Vec<Sender<CoreMsg>> = channels.iter().map(|(tx, _)| tx.clone()).collect();
    let sms: Vec<u32> = cores.iter().map(|(c, _)| c.sms()).collect();
    for (i, ((mut core, board), (tx, rx))) in cores.into_iter().zip(channels).enumerate() {
        if peers.len() > 1 {
            core = core.with_peers(peers.clone(), sms.clone());
        }
        let name = if i == 0 { "gpumuxd-core".to_string() } else { format!("gpumuxd-core{i}") };
        let down = board.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            let r = core.run(rx);
            // Placement skips it from now on; the other GPUs go on.
            down.set_down();
            if let Err(e) = &r {
                tracing::error!("GPU {i} stopped serving: {e:#}");
            }
            r
        })?;
        senders.push(tx);
        boards.push(board);
        core_threads.push(thread);
    }
    let rebalance = opts.rebalance.or(config.daemon.rebalance).unwrap_or(false);
    if rebalance && senders.len() > 1 {
        tracing::info!("an idle client moves to a GPU left with no client (rebalance)");
    }
    let gpus = Arc::new(Gpus::new(senders, boards, placement).with_rebalance(rebalance));
    let mut threads = Vec::new();
    // The daemon serves while any GPU does (one GPU: while it does, as ever).
    let served = server::serve(&listener, &config, &gpus, &mut threads, || {
        server::shutdown_requested() || core_threads.iter().all(|t| t.is_finished())
    });
    if server::shutdown_requested() {
        tracing::info!("shutting down");
    }
    for core in gpus.cores() {
        let _ = core.send(CoreMsg::Shutdown);
    }
    drop(gpus);
    let outcomes: Vec<_> = core_threads.into_iter().map(|t| t.join()).collect();
    // The daemon's stage stamps, if on (issue 35); its device processes write theirs.
    gpumux_stamps::flush_or_say();
    drop(listener);
    drop(bound);
    // Writers finish what the core queued (ShuttingDown notices) and close.
    for t in threads {
        let _ = t.join();
    }
    served.context("the accept loop failed")?;
    for outcome in outcomes {
        match outcome {
            Ok(r) => r.context("the daemon stopped")?,
            Err(_) => bail!("the core thread panicked"),
        }
    }
    Ok(())
}

/// A socket file this daemon bound: removed when dropped, so that no way out
/// of [`run`] after the bind leaves it behind (an abort or SIGKILL still can;
/// the next start replaces it as stale).
struct BoundSocket(PathBuf);

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0) {
            tracing::warn!("cannot remove {}: {e}", self.0.display());
        }
    }
}

/// Raises the soft limit on open files to the hard one, and warns where the
/// system may not have room for `[limits] connections` (each costs two
/// threads, about four descriptors and a dozen memory maps: two per thread
/// stack, two per signal stack, its shared regions): the daemon
/// then refuses connections it cannot start threads for, where on 717b546
/// running out of maps aborted it.
fn check_os_room(limits: &crate::config::ServerLimits) {
    let connections = u64::from(limits.connections);
    // SAFETY: getrlimit/setrlimit with a live rlimit.
    let files = unsafe {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            if r.rlim_cur < r.rlim_max {
                let raised = libc::rlimit { rlim_cur: r.rlim_max, rlim_max: r.rlim_max };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    r.rlim_cur = r.rlim_max;
                }
            }
            Some(r.rlim_cur)
        } else {
            None
        }
    };
    let need_files = connections * 4 + 64;
    if let Some(files) = files.filter(|&f| f < need_files) {
        tracing::warn!(
            "[limits] connections = {connections} may need {need_files} open files, and this process may have \
             {files} (raise its RLIMIT_NOFILE, e.g. LimitNOFILE= under systemd, or lower the limit)"
        );
    }
    let maps = std::fs::read_to_string("/proc/sys/vm/max_map_count").ok().and_then(|t| t.trim().parse::<u64>().ok());
    let need_maps = connections * 12 + 4096;
    if let Some(maps) = maps.filter(|&m| m < need_maps) {
        tracing::warn!(
            "[limits] connections = {connections} may need some {need_maps} memory maps (two threads each), and \
             vm.max_map_count is {maps}: raise it, or lower the limit"
        );
    }
}

/// What [`gpumux_cuda::client::OVERSUBSCRIBE_VAR`] in gpumuxd's environment
/// says: `Some(true)` for `on` (or `1`), `Some(false)` for `off` (or `0`),
/// `None` when it is not set; any other value stops start-up.
fn oversubscribe_from_env() -> anyhow::Result<Option<bool>> {
    let var = gpumux_cuda::client::OVERSUBSCRIBE_VAR;
    let Some(v) = std::env::var_os(var) else { return Ok(None) };
    match v.to_str().map(str::trim) {
        Some("on" | "1") => Ok(Some(true)),
        Some("off" | "0") => Ok(Some(false)),
        _ => bail!("{var}={v:?} in gpumuxd's environment: on or off (or 1 or 0)"),
    }
}

/// Caps each GPU's pinned host pool for evicted buffers (docs/oversubscription.md,
/// "The host side") at its share of `swap_memory`, unless gpumuxd's environment
/// sets it ([`gpumux_cuda::client::PINNED_VAR`]). The device processes, started
/// after this, inherit it; set before any device, client or worker thread runs.
fn pin_swap_memory(share: u64) {
    let var = gpumux_cuda::client::PINNED_VAR;
    match std::env::var_os(var) {
        Some(v) => tracing::info!("pinned host memory for evicted buffers: at most {v:?} per GPU ({var})"),
        None => std::env::set_var(var, share.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_cuda_spec, resolve_hw_priority, CudaSpec, Refill};

    #[test]
    fn hardware_priority_is_on_under_ppq_policies_unless_the_spec_says() {
        assert_eq!(resolve_hw_priority("cuda:0", "ppq-even-drain"), "cuda:0,hw-priority");
        assert_eq!(resolve_hw_priority("cuda:1,own-sms", "ppq-excl-cs"), "cuda:1,own-sms,hw-priority");
        assert_eq!(resolve_hw_priority("cuda:0,no-hw-priority", "ppq-even-drain"), "cuda:0,no-hw-priority");
        assert_eq!(resolve_hw_priority("cuda:0,hw-priority", "ppq-even-drain"), "cuda:0,hw-priority");
        // Spatial partitions and time slices: a native launch would not keep them.
        assert_eq!(resolve_hw_priority("cuda:0", "spatial-even"), "cuda:0");
        assert_eq!(resolve_hw_priority("cuda:0", "npq"), "cuda:0");
        assert_eq!(resolve_hw_priority("cuda:0,hw-priority", "fcfs"), "cuda:0,hw-priority", "asked for: kept");
        assert_eq!(resolve_hw_priority("sim:h100", "ppq-even-drain"), "sim:h100");
        assert_eq!(resolve_hw_priority("cuda:0,bogus", "ppq-even-drain"), "cuda:0,bogus", "the error comes on opening");
    }

    #[test]
    fn gpu_specs_parse_with_their_option_and_bad_ones_say_why() {
        let spec = |ordinal, co_locate, choose, queue_ahead| {
            Some(Some(CudaSpec { ordinal, co_locate, choose, queue_ahead, refill: Refill::Drained, hw_priority: None }))
        };
        assert_eq!(parse_cuda_spec("cuda:0").map(|r| r.ok()), spec(0, true, true, true));
        assert_eq!(parse_cuda_spec("cuda:3,co-locate").map(|r| r.ok()), spec(3, true, false, true));
        assert_eq!(parse_cuda_spec("cuda:1,own-sms").map(|r| r.ok()), spec(1, false, false, true));
        assert_eq!(parse_cuda_spec("cuda:0,queue-ahead").map(|r| r.ok()), spec(0, true, true, true));
        assert_eq!(parse_cuda_spec("cuda:2,own-sms,queue-ahead").map(|r| r.ok()), spec(2, false, false, true));
        assert_eq!(parse_cuda_spec("cuda:0,no-queue-ahead").map(|r| r.ok()), spec(0, true, true, false));
        let no_refill = parse_cuda_spec("cuda:0,no-refill").and_then(|r| r.ok());
        assert_eq!(no_refill.map(|s| (s.refill, s.queue_ahead)), Some((Refill::Off, true)));
        let always = parse_cuda_spec("cuda:0,refill-always").and_then(|r| r.ok());
        assert_eq!(always.map(|s| s.refill), Some(Refill::Always));
        let hw = parse_cuda_spec("cuda:0,hw-priority").and_then(|r| r.ok());
        assert_eq!(hw.map(|s| (s.hw_priority, s.co_locate, s.choose)), Some((Some(true), true, true)));
        let no_hw = parse_cuda_spec("cuda:0,no-hw-priority").and_then(|r| r.ok());
        assert_eq!(no_hw.map(|s| s.hw_priority), Some(Some(false)));
        assert!(parse_cuda_spec("sim:h100").is_none());
        let bad = parse_cuda_spec("cuda:0,fast").and_then(|r| r.err()).map(|e| e.to_string()).unwrap_or_default();
        assert!(bad.contains("unknown option `fast`"), "{bad}");
        assert!(parse_cuda_spec("cuda:x").is_some_and(|r| r.is_err()));
        assert!(parse_cuda_spec("cuda:-1").is_some_and(|r| r.is_err()));
    }
}

//! The daemon as a whole: options, the device, the core thread, the accept
//! loop, and a clean stop on SIGINT/SIGTERM.

use crate::backend::sim::SimBackend;
use crate::backend::Backend;
use crate::config::Config;
use crate::core::{Core, CoreMsg};
use crate::server;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::sync::mpsc::channel;

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
}

/// Opens the device named `spec`, or picks one.
pub fn open_device(spec: Option<&str>) -> Result<Box<dyn Backend>> {
    let spec = match spec {
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
    };
    if let Some(n) = spec.strip_prefix("cuda:") {
        let Ok(ordinal) = n.parse::<i32>() else { bail!("bad device `{spec}`: expected cuda:<index>, e.g. cuda:0") };
        return crate::backend::cuda::open(ordinal);
    }
    Ok(Box::new(SimBackend::open(&spec)?))
}

/// Runs the daemon until SIGINT/SIGTERM (Ok) or a device failure it cannot
/// recover from (Err).
pub fn run(opts: Options) -> Result<()> {
    // SAFETY: geteuid cannot fail.
    let own_uid = unsafe { libc::geteuid() };
    let config = match &opts.config {
        Some(path) => Config::load(path)?,
        None => Config::own_user_only(own_uid),
    };
    let socket = opts.socket.clone().or(config.daemon.socket.clone()).unwrap_or_else(gpumux_proto::default_socket_path);
    let device = opts.device.clone().or(config.daemon.device.clone());
    let policy = opts.policy.clone().or(config.daemon.policy.clone());
    let backend = open_device(device.as_deref())?;
    let core = Core::new(backend, policy.as_deref()).context("cannot start the scheduling engine")?;
    tracing::info!("device {}, policy {}", core.device(), core.policy());
    let listener = server::bind(&socket)?;
    tracing::info!("listening on {}", socket.display());
    server::install_signal_handlers();

    let (tx, rx) = channel::<CoreMsg>();
    let core_thread = std::thread::Builder::new().name("gpumuxd-core".into()).spawn(move || core.run(rx))?;
    let mut threads = Vec::new();
    let served = server::serve(&listener, &config, &tx, &mut threads, || {
        server::shutdown_requested() || core_thread.is_finished()
    });
    if server::shutdown_requested() {
        tracing::info!("shutting down");
    }
    let _ = tx.send(CoreMsg::Shutdown);
    drop(tx);
    let outcome = core_thread.join();
    drop(listener);
    if let Err(e) = std::fs::remove_file(&socket) {
        tracing::warn!("cannot remove {}: {e}", socket.display());
    }
    // Writers finish what the core queued (ShuttingDown notices) and close.
    for t in threads {
        let _ = t.join();
    }
    served.context("the accept loop failed")?;
    match outcome {
        Ok(r) => r.context("the daemon stopped"),
        Err(_) => bail!("the core thread panicked"),
    }
}

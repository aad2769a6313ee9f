//! The daemon's command line, shared by `gpumuxd` and `gpumux daemon`: one
//! clap struct, so the two commands take exactly the same options.

use crate::daemon::{run, Options};
use clap::ArgAction;
use std::path::PathBuf;

/// The daemon's options on the command line (each overrides the config's `[daemon]` table).
#[derive(clap::Args, Debug, Clone)]
pub struct DaemonArgs {
    /// Unix socket to listen on [default: $XDG_RUNTIME_DIR/gpumux.sock, else /run/gpumux/gpumux.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Device: cuda:<index>, or sim:k20c, sim:h100, sim:h200 [default: cuda:0 if a GPU is found, else sim:h100].
    #[arg(long)]
    pub device: Option<String>,
    /// Scheduling policy (gpumux policies lists them) [default: ppq-shared-drain].
    #[arg(long)]
    pub policy: Option<String>,
    /// Config file: who may connect, with which limits [default: only this user and root].
    #[arg(long)]
    pub config: Option<PathBuf>,
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
        }
    }
}

/// Sends logs to stderr at the level `-v` asks for (RUST_LOG overrides), then
/// runs the daemon until SIGINT/SIGTERM. The error is already logged.
pub fn run_logged(args: &DaemonArgs) -> anyhow::Result<()> {
    let level = match args.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // A host program may have set a subscriber already; its choice stands.
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    run(args.options()).inspect_err(|e| tracing::error!("{e:#}"))
}

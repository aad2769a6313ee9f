//! `gpumuxd`: the gpumux daemon (docs/daemon.md).

use clap::Parser;
use std::path::PathBuf;

/// Shares one GPU (or the simulated one) among processes through the gpumux engine.
#[derive(Parser, Debug)]
#[command(name = "gpumuxd", version)]
struct Cli {
    /// Unix socket to listen on [default: $XDG_RUNTIME_DIR/gpumux.sock, else /run/gpumux/gpumux.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Device: cuda:<index>, or sim:k20c, sim:h100, sim:h200 [default: cuda:0 if a GPU is found, else sim:h100].
    #[arg(long)]
    device: Option<String>,
    /// Scheduling policy (gpumux policies lists them) [default: ppq-shared-drain].
    #[arg(long)]
    policy: Option<String>,
    /// Config file: who may connect, with which limits [default: only this user and root].
    #[arg(long)]
    config: Option<PathBuf>,
    /// More logging (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let opts = gpumuxd::Options { socket: cli.socket, device: cli.device, policy: cli.policy, config: cli.config };
    match gpumuxd::run(opts) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("gpumuxd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

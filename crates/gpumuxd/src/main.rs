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
    /// Run the device in the daemon's process: a little less latency per
    /// operation, but a GPU fault then stops the daemon (CUDA cannot recover
    /// in the faulting process). Default for sim:*.
    #[arg(long, conflicts_with = "device_process")]
    device_in_process: bool,
    /// Run the device in a child process the daemon restarts after a fault
    /// or a crash. Default for cuda:N; for sim:* it tests that path.
    #[arg(long)]
    device_process: bool,
    /// Internal: serve this device over --host-fd (the daemon runs this as its device process).
    #[arg(long, hide = true, requires = "host_fd")]
    device_host: Option<String>,
    /// Internal: the socket the daemon passed to its device process.
    #[arg(long, hide = true, requires = "device_host")]
    host_fd: Option<i32>,
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
    if let (Some(spec), Some(fd)) = (&cli.device_host, cli.host_fd) {
        return match gpumuxd::device_host::serve(spec, fd) {
            Ok(true) => std::process::ExitCode::SUCCESS,
            Ok(false) => std::process::ExitCode::FAILURE,
            Err(e) => {
                tracing::error!("device process: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let hosting = match (cli.device_in_process, cli.device_process) {
        (true, _) => Some(gpumuxd::DeviceHosting::InProcess),
        (_, true) => Some(gpumuxd::DeviceHosting::ChildProcess),
        _ => None,
    };
    let opts =
        gpumuxd::Options { socket: cli.socket, device: cli.device, policy: cli.policy, config: cli.config, hosting };
    match gpumuxd::run(opts) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("gpumuxd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

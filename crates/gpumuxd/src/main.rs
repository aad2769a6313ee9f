//! `gpumuxd`: the gpumux daemon (docs/daemon.md). `gpumux daemon` is the same
//! command: both parse [`gpumuxd::cli::DaemonArgs`]. This binary is also the
//! daemon's device process (`--device-host`, hidden), which `gpumux daemon`
//! starts too.

use clap::Parser;

/// Shares one GPU (or the simulated one) among processes through the gpumux engine.
#[derive(Parser, Debug)]
#[command(name = "gpumuxd", version)]
struct Cli {
    #[command(flatten)]
    args: gpumuxd::cli::DaemonArgs,
    /// Internal: serve this device over --host-fd (the daemon runs this as its device process).
    #[arg(long, hide = true, requires = "host_fd")]
    device_host: Option<String>,
    /// Internal: the socket the daemon passed to its device process.
    #[arg(long, hide = true, requires = "device_host")]
    host_fd: Option<i32>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let (Some(spec), Some(fd)) = (&cli.device_host, cli.host_fd) {
        gpumuxd::cli::init_logging(cli.args.verbose);
        gpumuxd::spin::set(cli.args.spin_us.unwrap_or(0));
        return match gpumuxd::device_host::serve(spec, fd) {
            Ok(true) => std::process::ExitCode::SUCCESS,
            Ok(false) => std::process::ExitCode::FAILURE,
            Err(e) => {
                tracing::error!("device process: {e:#}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    match gpumuxd::cli::run_logged(&cli.args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpumuxd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

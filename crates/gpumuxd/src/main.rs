//! `gpumuxd`: the gpumux daemon (docs/daemon.md). `gpumux daemon` is the same
//! command: both parse [`gpumuxd::cli::DaemonArgs`].

use clap::Parser;

/// Shares one GPU (or the simulated one) among processes through the gpumux engine.
#[derive(Parser, Debug)]
#[command(name = "gpumuxd", version)]
struct Cli {
    #[command(flatten)]
    args: gpumuxd::cli::DaemonArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match gpumuxd::cli::run_logged(&cli.args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpumuxd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

//! Stand-alone driver for the `gpumux rt` subcommands until the `gpumux` CLI wires them:
//! `cargo run --release -p gpumux-rt --example rt -- analyze examples/rt/table4.toml`.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "rt", about = "Real-time GPU task sets (GPU-SPARC analysis and mode assignment)")]
struct Cli {
    #[command(subcommand)]
    cmd: gpumux_rt::cli::RtCommand,
}

fn main() -> anyhow::Result<()> {
    gpumux_rt::cli::run(Cli::parse().cmd)
}

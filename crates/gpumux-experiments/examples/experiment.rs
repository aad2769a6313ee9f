//! `gpumux experiment` without the rest of the CLI (no CUDA backend to
//! build): `cargo run --release -p gpumux-experiments --example experiment -- NAME [--quick]`.

use clap::Parser;

#[derive(Parser)]
#[command(about = "Re-run a seed paper's evaluation on the simulated GPU (same as `gpumux experiment`)")]
struct Cli {
    #[command(flatten)]
    args: gpumux_experiments::ExperimentArgs,
}

fn main() -> anyhow::Result<()> {
    gpumux_experiments::run(Cli::parse().args)
}

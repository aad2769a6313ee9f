//! Runs gpumux-cuda's GPU checks and benchmarks without the gpumux CLI:
//! `gpumux-cuda-check [--json out.json] check|overhead|preempt|spatial|all`.

use clap::Parser;
use gpumux_cuda_bench::{bench_main, BenchArgs, BenchCommand};

#[derive(Parser)]
#[command(about = "gpumux CUDA backend: correctness under preemption, then benchmarks")]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The hidden child-process subcommands open the GPU themselves (a probe here would
    // cost an MPS client a second context).
    if !matches!(cli.bench.command, BenchCommand::LpHog { .. } | BenchCommand::SpatialChild { .. }) {
        if let Err(e) = gpumux_cuda::cuda_available() {
            eprintln!("no usable CUDA GPU: {}", gpumux_cuda::error::Chain(&e));
            std::process::exit(2);
        }
    }
    bench_main(cli.bench)
}

//! Runs gpumux-cuda's GPU checks and benchmarks without the gpumux CLI:
//! `gpumux-cuda-check [--json out.json] check|overhead|preempt|spatial|all`.

use clap::Parser;

#[derive(Parser)]
#[command(about = "gpumux CUDA backend: correctness under preemption, then benchmarks")]
struct Cli {
    #[command(flatten)]
    bench: gpumux_cuda::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // The hidden child-process subcommands open the GPU themselves (a probe here would
    // cost an MPS client a second context).
    if !matches!(
        cli.bench.command,
        gpumux_cuda::BenchCommand::LpHog { .. } | gpumux_cuda::BenchCommand::SpatialChild { .. }
    ) {
        match gpumux_cuda::cuda_available() {
            Ok(_) => {}
            Err(e) => {
                eprintln!("no usable CUDA GPU: {e}");
                std::process::exit(2);
            }
        }
    }
    gpumux_cuda::bench_main(cli.bench)
}

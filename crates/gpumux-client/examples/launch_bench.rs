//! The Rust client's launch + sync of an empty kernel, timed one by one: the
//! baseline the Python client's is measured against (issue 41's goal: at
//! most 3 µs more at the p50; crates/gpumux-py/bench/launch_sync.py runs
//! both against one daemon and prints the difference).
//!
//! ```sh
//! target/release/gpumuxd --socket /tmp/g.sock --device sim:h100 &
//! target/release/examples/launch_bench --socket /tmp/g.sock --n 5000
//! ```
//!
//! Prints one JSON line: `{"client": "rust", "n": …, "p50_us": …, "p90_us": …, "p99_us": …,
//! "launch_us": …}`. `launch_us` is the client's own cost of a launch, with no
//! wait: the median over batches of [`BATCH`] launches (each batch then
//! synced, untimed) of a batch's time per launch; the daemon's speed hardly
//! moves it, so it shows the client side alone.
//! On a simulated device each launch's one block takes `--sim-block-ns`
//! (default 1000); a GPU ignores it.

use gpumux_client::{Client, ConnectOptions, LaunchConfig, StreamId};
use std::time::Instant;

const EMPTY: &str = "extern \"C\" __global__ void empty() {}";

/// Launches timed together for `launch_us`.
const BATCH: usize = 500;

fn usage() -> ! {
    eprintln!("usage: launch_bench [--socket PATH] [--n N] [--warmup W] [--sim-block-ns NS]");
    std::process::exit(2)
}

fn main() {
    let (mut socket, mut n, mut warmup, mut block_ns) = (None, 5000usize, 500usize, 1000u64);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--socket" => socket = Some(value.into()),
            "--n" => n = value.parse().unwrap_or_else(|_| usage()),
            "--warmup" => warmup = value.parse().unwrap_or_else(|_| usage()),
            "--sim-block-ns" => block_ns = value.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    if n == 0 {
        usage();
    }
    if let Err(e) = run(socket, n, warmup, block_ns) {
        eprintln!("launch_bench: {e}");
        std::process::exit(1);
    }
}

fn run(socket: Option<std::path::PathBuf>, n: usize, warmup: usize, block_ns: u64) -> gpumux_client::Result<()> {
    let client = Client::connect(ConnectOptions { socket, ..ConnectOptions::named("launch_bench (rust)") })?;
    let kernel = client.load_module("empty.cu", EMPTY, &[])?.kernel("empty")?;
    let config = LaunchConfig::new([1, 1, 1], [1, 1, 1]).block_time_ns(block_ns);
    let mut us = Vec::with_capacity(n);
    for i in 0..warmup + n {
        let t0 = Instant::now();
        client.launch(&kernel, &config, &[])?;
        client.sync(StreamId::DEFAULT)?;
        if i >= warmup {
            us.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    us.sort_by(f64::total_cmp);
    let at = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize];
    let mut batches = Vec::with_capacity(n.div_ceil(BATCH));
    for _ in 0..n.div_ceil(BATCH) {
        let t0 = Instant::now();
        for _ in 0..BATCH {
            client.launch(&kernel, &config, &[])?;
        }
        batches.push(t0.elapsed().as_secs_f64() * 1e6 / BATCH as f64);
        client.sync(StreamId::DEFAULT)?;
    }
    batches.sort_by(f64::total_cmp);
    println!(
        "{{\"client\": \"rust\", \"n\": {n}, \"p50_us\": {:.2}, \"p90_us\": {:.2}, \"p99_us\": {:.2}, \"launch_us\": {:.3}}}",
        at(0.5),
        at(0.9),
        at(0.99),
        batches[batches.len() / 2]
    );
    Ok(())
}

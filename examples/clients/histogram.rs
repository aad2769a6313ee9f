//! histogram through gpumuxd: 256 bins over 1M pseudo-random bytes, with atomics.
//!
//! `cargo run -p gpumux-client --example histogram -- [--socket PATH] [--out FILE] [--check]`
//! The output is the 256 bins as little-endian u32. On a simulated device
//! kernels do not compute, so `--check` then checks only that the input
//! round-trips bitwise.

use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
#[path = "client_args.rs"]
mod client_args;
use client_args::ClientArgs;

/// The default size (`--size`).
const N: usize = 1 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("histogram: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // --size: the input's bytes (default N); --repeat: the kernel's launches.
    let ClientArgs { socket, out, check, n, repeat } = ClientArgs::parse(N)?;
    // Knuth's multiplicative hash, top byte: spread over all 256 values.
    let data: Vec<u8> = (0..n as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();

    let client = Client::connect(ConnectOptions { socket, ..ConnectOptions::named("histogram") })?;
    let s = StreamId::DEFAULT;
    // The module first: its compile (once per daemon) stays out of the span from the
    // first copy to the last, which `gpumux replay` compares (docs/calibration.md).
    let module = client.load_module("histogram.cu", include_str!("kernels/histogram.cu"), &[])?;
    let kernel = module.kernel("histogram")?;
    let (d_data, d_bins) = (client.alloc(n as u64)?, client.alloc(256 * 4)?);
    client.copy_to_device(&d_data, 0, &data, s)?;
    let config = LaunchConfig::new([128, 1, 1], [256, 1, 1]).block_time_ns(5_000);
    // The bins are zeroed before each launch: every launch counts the same histogram.
    for _ in 0..repeat {
        client.memset(&d_bins, 0, 0, 256 * 4, s)?;
        client.launch(&kernel, &config, &[Arg::buffer(&d_data), (n as i32).into(), Arg::buffer(&d_bins)])?;
    }
    client.sync(s)?;
    let mut bins = vec![0u8; 256 * 4];
    client.copy_to_host(&d_bins, 0, &mut bins, s)?;
    if let Some(path) = out {
        std::fs::write(&path, &bins).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if check {
        if client.is_simulated() {
            println!(
                "{}: simulated device, kernels do not compute there; checking that the input round-trips",
                client.welcome().device
            );
            let mut back = vec![0u8; n];
            client.copy_to_host(&d_data, 0, &mut back, s)?;
            if back != data {
                return Err("the input did not round-trip bitwise".into());
            }
        } else {
            let mut want = [0u32; 256];
            data.iter().for_each(|&v| want[v as usize] += 1);
            let got: Vec<u32> = bins.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            if let Some(v) = (0..256).find(|&v| got[v] != want[v]) {
                return Err(format!("bin {v}: the GPU counted {}, the CPU {}", got[v], want[v]).into());
            }
        }
        println!("histogram: check passed");
    }
    client.free(d_data)?;
    client.free(d_bins)?;
    Ok(client.close()?)
}

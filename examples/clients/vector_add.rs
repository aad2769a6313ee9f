//! vector_add through gpumuxd: c = a + b over 1M floats.
//!
//! `cargo run -p gpumux-client --example vector_add -- [--socket PATH] [--out FILE] [--check]`
//! Inputs are deterministic (native.py makes the same ones). On a simulated
//! device kernels do not compute, so `--check` then checks only that the
//! inputs round-trip bitwise.

use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
#[path = "client_args.rs"]
mod client_args;
use client_args::ClientArgs;

/// The default size (`--size`).
const N: usize = 1 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("vector_add: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    // --size: the input's elements (default N); --repeat: the kernel's launches.
    let ClientArgs { socket, out, check, n, repeat } = ClientArgs::parse(N)?;
    let a: Vec<f32> = (0..n).map(|i| (i % 1000) as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| ((i * 7) % 1000) as f32 * 0.25).collect();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (a_bytes, b_bytes) = (bytes(&a), bytes(&b));

    let client = Client::connect(ConnectOptions { socket, ..ConnectOptions::named("vector_add") })?;
    let s = StreamId::DEFAULT;
    // The module first: its compile (once per daemon) stays out of the span from the
    // first copy to the last, which `gpumux replay` compares (docs/calibration.md).
    let module = client.load_module("vector_add.cu", include_str!("kernels/vector_add.cu"), &[])?;
    let kernel = module.kernel("vector_add")?;
    let (da, db, dc) =
        (client.alloc(a_bytes.len() as u64)?, client.alloc(b_bytes.len() as u64)?, client.alloc(a_bytes.len() as u64)?);
    client.copy_to_device(&da, 0, &a_bytes, s)?;
    client.copy_to_device(&db, 0, &b_bytes, s)?;
    let config = LaunchConfig::for_threads(n as u32, 256).block_time_ns(2_000);
    for _ in 0..repeat {
        client.launch(&kernel, &config, &[Arg::buffer(&da), Arg::buffer(&db), Arg::buffer(&dc), (n as i32).into()])?;
    }
    client.sync(s)?;
    let mut c_bytes = vec![0u8; a_bytes.len()];
    client.copy_to_host(&dc, 0, &mut c_bytes, s)?;
    if let Some(path) = out {
        std::fs::write(&path, &c_bytes).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if check {
        if client.is_simulated() {
            println!(
                "{}: simulated device, kernels do not compute there; checking that inputs round-trip",
                client.welcome().device
            );
            for (buf, want) in [(&da, &a_bytes), (&db, &b_bytes)] {
                let mut back = vec![0u8; want.len()];
                client.copy_to_host(buf, 0, &mut back, s)?;
                if &back != want {
                    return Err("an input did not round-trip bitwise".into());
                }
            }
        } else {
            // Exact: each element is one float addition, the same on both sides.
            let want = bytes(&a.iter().zip(&b).map(|(x, y)| x + y).collect::<Vec<_>>());
            if let Some(i) = (0..n).find(|&i| c_bytes[i * 4..i * 4 + 4] != want[i * 4..i * 4 + 4]) {
                return Err(format!("c[{i}] differs from the CPU's a[{i}] + b[{i}]").into());
            }
        }
        println!("vector_add: check passed");
    }
    for buf in [da, db, dc] {
        client.free(buf)?;
    }
    Ok(client.close()?)
}

//! One client of the oversubscription check (issue 39; docs/daemon.md,
//! "Memory oversubscription"; scripts/oversubscribe-gpu.sh runs three).
//!
//! `oversubscribe [--socket PATH] [--fraction F] [--rounds R] [--steps K] [--name NAME] [--seed S] [--priority P] [--out FILE]`
//!
//! Allocates F (default 0.6) of the device's memory as one buffer, fills it
//! on the device from a seed, runs R (default 4) rounds of K (default 1)
//! kernels over all of it with a sync after each round (so the daemon may
//! evict it between them), and writes
//! a 64-bit digest of every word with its index, then the first and last
//! 4 KiB, to FILE. Prints one JSON line: bytes, seconds from the first
//! kernel to the digest, and the seconds of each round. The same seed and
//! fraction give the same file alone or beside others: that is the check.
//! On a simulated device kernels compute nothing; the file is then zeros and
//! says nothing of correctness (tests/oversubscribe.rs checks bytes there).
//!
//! `oversubscribe [--socket PATH] --alloc-cost MIB[,MIB...] [--count N]`
//! instead times what an allocation costs with nothing oversubscribed (the
//! `gpumuxd --oversubscribe` A/B, scripts/oversubscribe-cost-gpu.sh): for
//! each size, N (default 1000) allocations each followed by its free, each
//! call timed from the client, and prints one JSON line per size with the
//! calls' p50, p99 and mean in µs.

use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
use std::path::PathBuf;
use std::time::Instant;

/// Buffers are a multiple of this (the GPU's mapping granularity).
const GRANULE: u64 = 2 << 20;

fn main() {
    if let Err(e) = run() {
        eprintln!("oversubscribe: {e}");
        std::process::exit(1);
    }
}

struct Args {
    socket: Option<PathBuf>,
    fraction: f64,
    rounds: u32,
    steps: u32,
    name: String,
    seed: u32,
    priority: i32,
    out: Option<PathBuf>,
    /// `--alloc-cost`: the sizes to time, MiB (empty: the check's client).
    alloc_cost: Vec<u64>,
    count: u32,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let mut a = Args {
        socket: None,
        fraction: 0.6,
        rounds: 4,
        steps: 1,
        name: "oversubscribe".into(),
        seed: 1,
        priority: 0,
        out: None,
        alloc_cost: Vec::new(),
        count: 1000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--socket" => a.socket = Some(PathBuf::from(value()?)),
            "--fraction" => a.fraction = value()?.parse()?,
            "--rounds" => a.rounds = value()?.parse()?,
            "--steps" => a.steps = value()?.parse()?,
            "--name" => a.name = value()?,
            "--seed" => a.seed = value()?.parse()?,
            "--priority" => a.priority = value()?.parse()?,
            "--out" => a.out = Some(PathBuf::from(value()?)),
            "--alloc-cost" => {
                a.alloc_cost = value()?.split(',').map(|m| m.trim().parse::<u64>()).collect::<Result<_, _>>()?;
            }
            "--count" => a.count = value()?.parse()?,
            other => {
                return Err(format!(
                    "unknown argument {other:?} (--socket PATH, --fraction F, --rounds R, --steps K, --name NAME, --seed S, --priority P, --out FILE, \
                     or --alloc-cost MIB[,MIB...] --count N)"
                )
                .into())
            }
        }
    }
    if a.alloc_cost.contains(&0) || a.count == 0 {
        return Err("--alloc-cost sizes and --count must be above 0".into());
    }
    if !(a.fraction > 0.0 && a.fraction < 1.0) {
        return Err(format!("--fraction {} must be between 0 and 1", a.fraction).into());
    }
    Ok(a)
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    let options = ConnectOptions {
        socket: a.socket.clone(),
        shm_bytes: 16 << 20,
        priority: a.priority,
        ..ConnectOptions::named(&a.name)
    };
    let client = Client::connect(options)?;
    if !a.alloc_cost.is_empty() {
        return alloc_cost(client, &a);
    }
    let total = client.device_properties()?.memory_bytes;
    let bytes = ((total as f64 * a.fraction) as u64) / GRANULE * GRANULE;
    let words = bytes / 4;
    let s = StreamId::DEFAULT;
    let module = client.load_module("oversubscribe.cu", include_str!("kernels/oversubscribe.cu"), &[])?;
    let (fill, step, digest) =
        (module.kernel("fill_words")?, module.kernel("step_words")?, module.kernel("digest_words")?);
    let t_alloc = Instant::now();
    let x = client.alloc(bytes)?;
    let sum = client.alloc(8)?;
    let alloc_s = t_alloc.elapsed().as_secs_f64();
    client.memset(&sum, 0, 0, 8, s)?;
    // Every SM busy, each thread striding over the buffer.
    let config = LaunchConfig::new([132 * 8, 1, 1], [256, 1, 1]).block_time_ns(1_000_000);
    let n = Arg::bytes(words.to_le_bytes());
    let start = Instant::now();
    client.launch(&fill, &config, &[Arg::buffer(&x), n.clone(), Arg::bytes(a.seed.to_le_bytes())])?;
    client.sync(s)?;
    let mut rounds = Vec::new();
    for r in 0..a.rounds {
        let t = Instant::now();
        for k in 0..a.steps {
            let i = r * a.steps + k;
            client.launch(&step, &config, &[Arg::buffer(&x), n.clone(), Arg::bytes(i.to_le_bytes())])?;
        }
        // A sync between rounds: the client is idle there, and its buffer may go.
        client.sync(s)?;
        rounds.push(t.elapsed().as_secs_f64());
    }
    client.launch(&digest, &config, &[Arg::buffer(&x), n, Arg::buffer(&sum)])?;
    client.sync(s)?;
    let seconds = start.elapsed().as_secs_f64();
    let mut out = vec![0u8; 8 + 8192];
    client.copy_to_host(&sum, 0, &mut out[..8], s)?;
    client.copy_to_host(&x, 0, &mut out[8..8 + 4096], s)?;
    client.copy_to_host(&x, bytes - 4096, &mut out[8 + 4096..], s)?;
    if let Some(path) = &a.out {
        std::fs::write(path, &out).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    let digest = u64::from_le_bytes(out[..8].try_into()?);
    let rounds: Vec<String> = rounds.iter().map(|t| format!("{t:.4}")).collect();
    println!(
        "{{\"name\":\"{}\",\"bytes\":{bytes},\"alloc_s\":{alloc_s:.4},\"seconds\":{seconds:.4},\"rounds_s\":[{}],\"digest\":\"{digest:016x}\"}}",
        a.name,
        rounds.join(",")
    );
    client.free(x)?;
    client.close()?;
    Ok(())
}

/// `--alloc-cost`: each size's allocations and frees, one after the other,
/// each call timed; one JSON line per size.
fn alloc_cost(client: Client, a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    for &mib in &a.alloc_cost {
        let bytes = mib << 20;
        let (mut alloc_ns, mut free_ns) = (Vec::new(), Vec::new());
        for _ in 0..a.count {
            let t = Instant::now();
            let b = client.alloc(bytes).map_err(|e| format!("allocating {mib} MiB: {e}"))?;
            alloc_ns.push(t.elapsed().as_nanos() as u64);
            let t = Instant::now();
            client.free(b).map_err(|e| format!("freeing {mib} MiB: {e}"))?;
            free_ns.push(t.elapsed().as_nanos() as u64);
        }
        let (alloc, free) = (stats_us(&mut alloc_ns), stats_us(&mut free_ns));
        println!(
            "{{\"alloc_cost_mib\":{mib},\"count\":{},\"alloc_p50_us\":{:.1},\"alloc_p99_us\":{:.1},\"alloc_mean_us\":{:.1},\
             \"free_p50_us\":{:.1},\"free_p99_us\":{:.1},\"free_mean_us\":{:.1}}}",
            a.count, alloc.0, alloc.1, alloc.2, free.0, free.1, free.2
        );
    }
    client.close()?;
    Ok(())
}

/// (p50, p99, mean) of `ns`, in µs (sorts it; not empty).
fn stats_us(ns: &mut [u64]) -> (f64, f64, f64) {
    ns.sort_unstable();
    let at = |p: f64| ns[((ns.len() - 1) as f64 * p).round() as usize] as f64 / 1e3;
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1e3;
    (at(0.50), at(0.99), mean)
}

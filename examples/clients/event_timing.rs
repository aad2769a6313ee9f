//! A kernel timed with events (`cudaEventRecord` / `cudaEventElapsedTime`),
//! as nearly every CUDA benchmark times one, through gpumuxd.
//!
//! `cargo run -p gpumux-client --example event_timing -- [--socket PATH] [--out FILE] [--check]
//!  [--chunks N] [--chunk-mib M] [--iters K] [--repeat R]`
//!
//! Runs `kernels/lcg.cu` over all `chunks × chunk-mib` of input `--repeat`
//! times (7 by default, after one untimed), each between two events, and
//! prints every repetition's event time and the events' median time (the
//! daemon's, docs/daemon.md "Event timing") beside the host's time for a
//! launch and its wait. Checks: event times are positive, never above the
//! host's, and add up (the time from the first event to the last is the sum
//! of the launches' times plus the gaps between them); `--check` compares
//! every output element with the CPU's (on a simulated device, where kernels
//! compute nothing, the simulated clock: a launch of one wave of 1 ms blocks
//! takes 1 ms and a little). `--out` writes the output for a byte comparison
//! with native_lcg.py's.

use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
use std::time::Instant;

#[path = "lcg_common.rs"]
mod lcg_common;
use lcg_common::{first_wrong, host_memory, input, list, median, Args};

fn main() {
    if let Err(e) = run() {
        eprintln!("event_timing: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse()?;
    let client =
        Client::connect(ConnectOptions { socket: args.socket.clone(), ..ConnectOptions::named("event_timing") })?;
    let n = args.chunks * args.chunk_elems;
    let bytes = n * 4;
    let mut host = host_memory(&client, bytes, args.pageable)?;
    let data = input(n);
    host.copy_from_slice(&data);
    let (din, dout) = (client.alloc(bytes as u64)?, client.alloc(bytes as u64)?);
    let s = StreamId::DEFAULT;
    client.copy_to_device(&din, 0, &host, s)?;
    let module = client.load_module("lcg.cu", include_str!("kernels/lcg.cu"), &[])?;
    let lcg = module.kernel("lcg")?;
    let simulated = client.is_simulated();
    // On a simulated device: one wave of 1 ms blocks, so the expected time is known.
    let blocks = client.device_properties()?.sms * client.occupancy(&lcg, 256, 0)?;
    let config = if simulated {
        LaunchConfig::new([blocks, 1, 1], [256, 1, 1]).block_time_ns(1_000_000)
    } else {
        LaunchConfig::for_threads(n as u32, 256)
    };
    let kargs = [Arg::buffer(&din), Arg::buffer(&dout), (n as i32).into(), (args.iters as i32).into()];
    // Warm-up: one untimed repetition, events and all (native_lcg.py's too);
    // LCG_TIMING=old: one launch and a sync.
    let warm_ups = if args.old_timing {
        client.launch(&lcg, &config, &kargs)?;
        client.sync(s)?;
        0
    } else {
        1
    };

    let (mut events, mut hosts) = (Vec::new(), Vec::new());
    let mut marks = Vec::new();
    for rep in 0..warm_ups + args.repeat {
        if rep == warm_ups {
            marks.push(client.record_event(s)?);
        }
        let t = Instant::now();
        let start = client.record_event(s)?;
        client.launch(&lcg, &config, &kargs)?;
        let end = client.record_event(s)?;
        client.wait_event(end)?;
        let host_ms = t.elapsed().as_secs_f64() * 1e3;
        let ms = client.event_elapsed_ns(start, end)? as f64 / 1e6;
        if !(ms > 0.0 && ms <= host_ms) {
            return Err(format!("an event time of {ms:.4} ms against {host_ms:.4} ms on the host").into());
        }
        if rep >= warm_ups {
            events.push(ms);
            hosts.push(host_ms);
            marks.extend([start, end]);
        }
    }
    let first = *marks.first().ok_or("no events")?;
    // Monotone, and the whole is the sum of its parts.
    let mut sum = 0i64;
    for w in marks.windows(2) {
        let d = client.event_elapsed_ns(w[0], w[1])?;
        if d < 0 {
            return Err("event times are not monotone".into());
        }
        sum += d;
    }
    let last = *marks.last().ok_or("no events")?;
    if client.event_elapsed_ns(first, last)? != sum {
        return Err("event times do not add up".into());
    }
    println!("event_timing: repetitions: kernel_reps_ms={}", list(&events));
    let (k, h) = (median(&mut events), median(&mut hosts));
    println!(
        "event_timing: {n} elements, {} steps: kernel_ms={k:.4} (events, median of {}) host_ms={h:.4} (launch + wait); device {}",
        args.iters,
        args.repeat,
        client.welcome().device
    );
    let mut out = vec![0u8; bytes];
    client.copy_to_host(&dout, 0, &mut out, s)?;
    if let Some(path) = &args.out {
        std::fs::write(path, &out).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if args.check {
        if simulated {
            // One wave: the block time, plus the daemon's wake-up (10 ms of
            // slack: a loaded CI machine).
            if !(1.0..11.0).contains(&k) {
                return Err(format!("one wave of 1 ms blocks measured {k:.4} ms on the simulated device").into());
            }
            println!("event_timing: simulated device: event times match the simulated clock ({k:.4} ms for 1 ms)");
        } else if let Some(i) = first_wrong(&data, &out, args.iters) {
            return Err(format!("element {i} differs from the CPU's").into());
        }
        println!("event_timing: check passed");
    }
    client.free(din)?;
    client.free(dout)?;
    Ok(client.close()?)
}

//! A copy/compute pipeline over 4 streams ordered by stream waits, the
//! pattern of CUDA's copy/compute overlap samples, through gpumuxd.
//!
//! `cargo run -p gpumux-client --example stream_pipeline -- [--socket PATH] [--out FILE] [--check]
//!  [--chunks N] [--chunk-mib M] [--iters K] [--pageable] [--repeat R]`
//!
//! The input is cut into chunks. Chunk c is copied in on the copy-in
//! stream, and an event recorded; compute stream c % 2 waits for that event
//! (`stream_wait_event`, CUDA's `cudaStreamWaitEvent`), runs `kernels/lcg.cu`
//! on the chunk and records an event; the copy-out stream waits for that
//! one and copies the chunk's result back. The host never waits between
//! stages: the copy of chunk c + 1 runs while chunk c computes and chunk
//! c - 1 is copied out. From `alloc_host` memory (the default) the copies
//! do not wait (`copy_to_device_async`, `copy_to_host_async`, as
//! `cudaMemcpyAsync` from pinned memory), so one thread queues every stage
//! and syncs once, as the CUDA program does; with `--pageable` copies
//! return when done, so the copy-in and copy-out stages run on a thread each.
//!
//! It prints the pipeline's time, and the time of the same copies alone and
//! of the same kernels alone (medians of `--repeat`, 7 by default, after one
//! untimed repetition of all three), the pipeline's fastest repetition, and
//! every repetition's times (`*_reps_ms`, which the GPU check pools over
//! runs): overlap shows as a pipeline faster than copies + kernels. `--check` compares every output
//! element with the CPU's (an affine map, exact); on a simulated device,
//! where kernels compute nothing, it checks that the inputs round-trip.
//! `--out` writes the output for a byte comparison with native_lcg.py's.

use gpumux_client::{Arg, Buffer, Client, ConnectOptions, Event, Kernel, LaunchConfig, StreamId};
use std::time::Instant;

#[path = "lcg_common.rs"]
mod lcg_common;
use lcg_common::{first_wrong, host_memory, input, list, median, Args};

fn main() {
    if let Err(e) = run() {
        eprintln!("stream_pipeline: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse()?;
    let client =
        Client::connect(ConnectOptions { socket: args.socket.clone(), ..ConnectOptions::named("stream_pipeline") })?;
    let (chunks, chunk_bytes) = (args.chunks, args.chunk_elems * 4);
    let bytes = chunks * chunk_bytes;
    let mut host_in = host_memory(&client, bytes, args.pageable)?;
    host_in.copy_from_slice(&input(chunks * args.chunk_elems));
    let mut host_out = host_memory(&client, bytes, args.pageable)?;
    let (din, dout) = (client.alloc(bytes as u64)?, client.alloc(bytes as u64)?);
    let module = client.load_module("lcg.cu", include_str!("kernels/lcg.cu"), &[])?;
    let lcg = module.kernel("lcg")?;
    let (copy_in, copy_out) = (client.create_stream()?, client.create_stream()?);
    let compute = [client.create_stream()?, client.create_stream()?];
    let stages = Stages {
        din: &din,
        dout: &dout,
        lcg: &lcg,
        copy_in,
        copy_out,
        compute,
        chunks,
        chunk_bytes,
        n: args.chunk_elems as u32,
        iters: args.iters as i32,
    };
    let range = |c: usize| c * chunk_bytes..(c + 1) * chunk_bytes;
    let launch = |c: usize, stream: StreamId| stages.launch(&client, c, stream);

    // Warm-up: repetition 0 is not timed. Its pipeline is the first use of
    // the second compute stream, of stream waits and of copies that do not
    // wait, and whatever either side sets up on a first use stays out of the
    // times; native_lcg.py warms up the same way. LCG_TIMING=old: one chunk's
    // copy and kernel, every repetition timed.
    let warm_ups = if args.old_timing {
        client.copy_to_device(&din, 0, &host_in[range(0)], copy_in)?;
        launch(0, compute[0])?;
        client.sync(compute[0])?;
        0
    } else {
        1
    };

    let (mut copies, mut kernels, mut pipeline) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..warm_ups + args.repeat {
        let timed = rep >= warm_ups;
        // The copies alone, chunk by chunk as the pipeline makes them.
        let t = Instant::now();
        for c in 0..chunks {
            client.copy_to_device(&din, (c * chunk_bytes) as u64, &host_in[range(c)], copy_in)?;
        }
        for c in 0..chunks {
            client.copy_to_host(&dout, (c * chunk_bytes) as u64, &mut host_out[range(c)], copy_out)?;
        }
        if timed {
            copies.push(t.elapsed().as_secs_f64() * 1e3);
        }

        // The kernels alone, one stream.
        let t = Instant::now();
        for c in 0..chunks {
            launch(c, compute[0])?;
        }
        client.sync(compute[0])?;
        if timed {
            kernels.push(t.elapsed().as_secs_f64() * 1e3);
        }

        // The pipeline, from nothing: a stale result must not pass the check.
        // The host's output is zeroed first and the device's sync is the last
        // thing before the clock starts, as native_lcg.py does: zeroing 256
        // MiB takes tens of ms, through which the daemon's threads (which poll
        // at most 5 ms after a request, then sleep: docs/daemon.md, "Latency
        // and the CPU it costs") would fall asleep, and the pipeline's first
        // requests would pay their wake-ups where the native program pays
        // none (LCG_TIMING=old zeroes it after the sync).
        if !args.old_timing {
            host_out.fill(0);
        }
        client.memset(&dout, 0, 0, bytes as u64, copy_out)?;
        client.sync(copy_out)?;
        if args.old_timing {
            host_out.fill(0);
        }
        let t = Instant::now();
        let events = if args.pageable {
            pipeline_on_threads(&client, &stages, &host_in, &mut host_out)?
        } else {
            pipeline_async(&client, &stages, &host_in, &mut host_out)?
        };
        if timed {
            pipeline.push(t.elapsed().as_secs_f64() * 1e3);
        }
        // Outside the time, as CuPy frees its events: each is a request here.
        for e in events {
            client.destroy_event(e)?;
        }
    }
    // In the order measured, before `median` sorts them.
    println!(
        "stream_pipeline: repetitions: pipeline_reps_ms={} copies_reps_ms={} kernels_reps_ms={}",
        list(&pipeline),
        list(&copies),
        list(&kernels)
    );
    let (p, cp, k) = (median(&mut pipeline), median(&mut copies), median(&mut kernels));
    println!(
        "stream_pipeline: {chunks} chunks of {} MiB, {} steps: pipeline_ms={p:.3} pipeline_min_ms={:.3} \
         copies_ms={cp:.3} kernels_ms={k:.3} overlap={} (pipeline below copies + kernels: {:.3} ms); medians of {} \
         after {warm_ups} untimed; {} host memory; device {}",
        chunk_bytes >> 20,
        args.iters,
        pipeline[0],
        if p < cp + k { "yes" } else { "no" },
        cp + k,
        args.repeat,
        if args.pageable { "pageable" } else { "alloc_host" },
        client.welcome().device
    );
    if let Some(path) = &args.out {
        std::fs::write(path, &host_out[..]).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if args.check {
        if client.is_simulated() {
            let mut back = vec![0u8; bytes];
            client.copy_to_host(&din, 0, &mut back, copy_in)?;
            if back[..] != host_in[..] {
                return Err("the input did not round-trip bitwise".into());
            }
            println!(
                "stream_pipeline: simulated device, kernels compute nothing there: checked that the input round-trips"
            );
        } else if let Some(i) = first_wrong(&host_in, &host_out, args.iters) {
            return Err(format!("element {i} differs from the CPU's").into());
        }
        println!("stream_pipeline: check passed");
    }
    client.free(din)?;
    client.free(dout)?;
    Ok(client.close()?)
}

/// What each chunk's three stages use.
struct Stages<'a> {
    din: &'a Buffer,
    dout: &'a Buffer,
    lcg: &'a Kernel,
    copy_in: StreamId,
    copy_out: StreamId,
    compute: [StreamId; 2],
    chunks: usize,
    chunk_bytes: usize,
    n: u32,
    iters: i32,
}

impl Stages<'_> {
    /// Chunk `c`'s kernel on `stream`.
    fn launch(&self, client: &Client, c: usize, stream: StreamId) -> gpumux_client::Result<()> {
        let off = (c * self.chunk_bytes) as u64;
        // A simulated device takes 20 µs a block: chunk kernels of the order of their copies.
        let config = LaunchConfig::for_threads(self.n, 256).stream(stream).block_time_ns(20_000);
        let args =
            [Arg::buffer_at(self.din, off), Arg::buffer_at(self.dout, off), (self.n as i32).into(), self.iters.into()];
        client.launch(self.lcg, &config, &args)
    }

    /// Byte offset of chunk `c`.
    fn offset(&self, c: usize) -> u64 {
        (c * self.chunk_bytes) as u64
    }
}

/// The pipeline as CUDA programs (and native_lcg.py) write it, from host
/// memory of `alloc_host`: the host queues every stage of every chunk and
/// waits once, at the end. The copies do not wait (`copy_to_device_async`,
/// as `cudaMemcpyAsync` from pinned memory), so the copy-in stream's copies
/// follow each other on the device with no round trip between them. Returns
/// the events it recorded, for the caller to destroy.
fn pipeline_async(
    client: &Client,
    s: &Stages,
    ins: &[u8],
    outs: &mut [u8],
) -> Result<Vec<Event>, Box<dyn std::error::Error>> {
    let mut events = Vec::with_capacity(2 * s.chunks);
    for (c, (chunk_in, chunk_out)) in ins.chunks(s.chunk_bytes).zip(outs.chunks_mut(s.chunk_bytes)).enumerate() {
        // SAFETY: neither host buffer is touched until `sync(copy_out)`
        // below, which comes after every copy of every chunk.
        unsafe { client.copy_to_device_async(s.din, s.offset(c), chunk_in, s.copy_in)? };
        let arrived = client.record_event(s.copy_in)?;
        let k = s.compute[c % 2];
        client.stream_wait_event(k, arrived)?;
        s.launch(client, c, k)?;
        let computed = client.record_event(k)?;
        client.stream_wait_event(s.copy_out, computed)?;
        // SAFETY: as above.
        unsafe { client.copy_to_host_async(s.dout, s.offset(c), chunk_out, s.copy_out)? };
        events.extend([arrived, computed]);
    }
    client.sync(s.copy_out)?;
    Ok(events)
}

/// The pipeline from pageable memory, whose copies return when done (they
/// go through the client's shared region): the copy-in stage on this
/// thread, the copy-out stage on a thread of its own, so that neither waits
/// for the other's copies. Returns the events left to destroy.
fn pipeline_on_threads(
    client: &Client,
    s: &Stages,
    ins: &[u8],
    outs: &mut [u8],
) -> Result<Vec<Event>, Box<dyn std::error::Error>> {
    let arrived_events = std::thread::scope(|scope| -> Result<Vec<Event>, Box<dyn std::error::Error + Send + Sync>> {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Event)>();
        let drain = scope.spawn(move || -> Result<Vec<Event>, gpumux_client::ClientError> {
            let mut outs: Vec<&mut [u8]> = outs.chunks_mut(s.chunk_bytes).collect();
            let mut done = Vec::new();
            for (c, computed) in rx {
                client.stream_wait_event(s.copy_out, computed)?;
                client.copy_to_host(s.dout, s.offset(c), outs[c], s.copy_out)?;
                done.push(computed);
            }
            Ok(done)
        });
        let mut arrived_events = Vec::new();
        for (c, chunk) in ins.chunks(s.chunk_bytes).enumerate() {
            client.copy_to_device(s.din, s.offset(c), chunk, s.copy_in)?;
            let arrived = client.record_event(s.copy_in)?;
            let k = s.compute[c % 2];
            client.stream_wait_event(k, arrived)?;
            s.launch(client, c, k)?;
            arrived_events.push(arrived);
            if tx.send((c, client.record_event(k)?)).is_err() {
                break; // the copy-out thread stopped: its error says why
            }
        }
        drop(tx);
        let mut computed = drain.join().map_err(|_| "the copy-out thread panicked")??;
        arrived_events.append(&mut computed);
        Ok(arrived_events)
    })
    .map_err(|e| e.to_string())?;
    Ok(arrived_events)
}

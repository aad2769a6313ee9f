//! The daemon's failure paths seen from clients, for scripts/daemon-gpu-check.sh
//! (and anyone who wants to watch them happen):
//!
//! * `culprit`: launches `kernels/fault.cu` (an out-of-bounds write), expects
//!   its sync to fail with `KernelFault` and a `ContextLost` notice that says
//!   it caused it, then shows the daemon still serves it (a copy round trip).
//! * `bystander`: keeps a matmul running until the context is lost under it,
//!   expects `ContextLost` naming the launch it lost and its buffers, then
//!   re-uploads and runs a small matmul checked against the CPU.
//! * `churn`: allocates, copies, launches and frees in a loop until killed
//!   (the kill test's victims: they die at random points of the protocol).
//!
//! `cargo run -p gpumux-client --example fault_check -- ROLE [--socket PATH] [--seconds S]`
//! Prints one line per finding and exits 0 only if every expectation held.

use gpumux_client::{Arg, Client, ClientError, ConnectOptions, LaunchConfig, StreamId};
use gpumux_proto::{ErrorKind, Notice};
use std::path::PathBuf;
use std::time::{Duration, Instant};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    if let Err(e) = run() {
        eprintln!("fault_check: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let role = args.next().ok_or("usage: fault_check culprit|bystander|churn [--socket PATH] [--seconds S]")?;
    let (mut socket, mut seconds) = (None, 60u64);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = Some(PathBuf::from(args.next().ok_or("--socket needs a path")?)),
            "--seconds" => seconds = args.next().ok_or("--seconds needs a number")?.parse()?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    // The culprit is urgent: its kernel goes before the bystander's queued ones.
    let priority = if role == "culprit" { 5 } else { 0 };
    let client =
        Client::connect(ConnectOptions { socket, priority, ..ConnectOptions::named(format!("fault_check {role}")) })?;
    match role.as_str() {
        "culprit" => culprit(&client),
        "bystander" => bystander(&client, Duration::from_secs(seconds)),
        "churn" => churn(&client),
        other => Err(format!("unknown role {other:?} (culprit, bystander, churn)").into()),
    }
}

/// The `ContextLost` notice the daemon sent, waiting a little for it (a
/// notice and the failed reply travel separately).
fn lost_notice(client: &Client) -> Result<Notice> {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(n) = client.take_notices().into_iter().find(|n| matches!(n, Notice::ContextLost { .. })) {
            return Ok(n);
        }
        if Instant::now() > until {
            return Err("no ContextLost notice arrived".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn round_trip(client: &Client, bytes: usize) -> Result<()> {
    let data: Vec<u8> = (0..bytes).map(|i| (i * 31 % 251) as u8).collect();
    let buf = client.alloc(bytes as u64)?;
    client.copy_to_device(&buf, 0, &data, StreamId::DEFAULT)?;
    let mut back = vec![0u8; bytes];
    client.copy_to_host(&buf, 0, &mut back, StreamId::DEFAULT)?;
    client.free(buf)?;
    if back != data {
        return Err("data did not round-trip after the context was rebuilt".into());
    }
    Ok(())
}

fn culprit(client: &Client) -> Result<()> {
    let p = client.alloc(4096)?;
    let module = client.load_module("fault.cu", include_str!("kernels/fault.cu"), &[])?;
    let kernel = module.kernel("fault")?;
    // Compiling blocks the daemon's scheduling for a moment; let the
    // bystander's launches flow again, so the fault lands among them.
    std::thread::sleep(Duration::from_secs(1));
    client.launch(&kernel, &LaunchConfig::new([1, 1, 1], [32, 1, 1]).block_time_ns(1_000), &[Arg::buffer(&p)])?;
    match client.sync(StreamId::DEFAULT) {
        Err(e) if e.kind() == Some(&ErrorKind::KernelFault) => println!("culprit: sync failed with KernelFault: {e}"),
        Err(e) => return Err(format!("culprit: expected KernelFault, got: {e}").into()),
        Ok(()) => return Err("culprit: the faulting kernel's sync succeeded".into()),
    }
    match lost_notice(client)? {
        Notice::ContextLost { caused_by_you: true, what, lost } => {
            println!("culprit: notice says it caused the loss ({what}); lost {} launches", lost.launches.len())
        }
        other => return Err(format!("culprit: unexpected notice {other:?}").into()),
    }
    round_trip(client, 1 << 20)?;
    println!("culprit: the daemon serves it again (1 MiB round trip)");
    Ok(())
}

/// `n`×`n` matrices with small integers, so every product sum is exact in f32.
fn matrices(n: usize) -> (Vec<f32>, Vec<f32>) {
    let a = (0..n * n).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
    let b = (0..n * n).map(|i| ((i * 3) % 7) as f32 - 3.0).collect();
    (a, b)
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bystander(client: &Client, patience: Duration) -> Result<()> {
    let s = StreamId::DEFAULT;
    let module = client.load_module("matmul.cu", include_str!("kernels/matmul.cu"), &[])?;
    let kernel = module.kernel("matmul")?;
    let n = 4096usize;
    let (a, b) = matrices(n);
    let (da, db, dc) =
        (client.alloc((n * n * 4) as u64)?, client.alloc((n * n * 4) as u64)?, client.alloc((n * n * 4) as u64)?);
    client.copy_to_device(&da, 0, &f32_bytes(&a), s)?;
    client.copy_to_device(&db, 0, &f32_bytes(&b), s)?;
    let grid = [(n / 16) as u32, (n / 16) as u32, 1];
    let config = LaunchConfig::new(grid, [16, 16, 1]).block_time_ns(50_000);
    let args = [Arg::buffer(&da), Arg::buffer(&db), Arg::buffer(&dc), (n as i32).into()];
    let start = Instant::now();
    let mut launches = 0u64;
    // Either the loss takes work of ours with it (a sync fails), or it falls
    // between two of our syncs (nothing of ours was queued or running): then
    // only the notice tells, and it must list no launch, only our buffers.
    let err: Option<ClientError> = loop {
        if start.elapsed() > patience {
            return Err(format!("bystander: no context loss in {patience:?} ({launches} matmuls ran)").into());
        }
        // Three launches queued per sync, as an asynchronous client would: when
        // the culprit's kernel runs between two of them, the later ones are
        // queued work the loss takes with it.
        for _ in 0..3 {
            client.launch(&kernel, &config, &args)?;
            launches += 1;
        }
        if let Err(e) = client.sync(s) {
            break Some(e);
        }
        if let Some(n) = client.take_notices().into_iter().find(|n| matches!(n, Notice::ContextLost { .. })) {
            let Notice::ContextLost { caused_by_you: false, lost, .. } = &n else {
                return Err(format!("bystander: unexpected notice {n:?}").into());
            };
            if !lost.launches.is_empty() || lost.buffers.len() != 3 {
                return Err(format!(
                    "bystander: a loss between its syncs must list no launch and its 3 buffers: {lost:?}"
                )
                .into());
            }
            println!("bystander: the context was lost between two of its syncs (after {launches} matmuls): nothing of its was running; the notice lists its 3 buffers");
            break None;
        }
    };
    if let Some(err) = err {
        lost_under_work(client, &err, launches)?;
    }
    rerun_after_loss(client, &kernel, (&da, &db, &dc))
}

/// The loss took work of the bystander's: the error and the notice must say which.
fn lost_under_work(client: &Client, err: &ClientError, launches: u64) -> Result<()> {
    // Its matmul may have been on the device beside the faulting kernel: then
    // it is a suspect too (the driver does not say which kernel faulted), and
    // the message must say it shared the suspicion, not that it was the culprit.
    let suspect = match err.kind() {
        Some(ErrorKind::ContextLost) => false,
        Some(ErrorKind::KernelFault) if err.to_string().contains("the driver does not say which faulted") => true,
        _ => {
            return Err(format!(
                "bystander: expected ContextLost (or KernelFault as one of several suspects), got: {err}"
            )
            .into())
        }
    };
    println!(
        "bystander: after {launches} matmuls, sync failed ({}): {err}",
        if suspect { "a suspect" } else { "not a suspect" }
    );
    match lost_notice(client)? {
        Notice::ContextLost { caused_by_you, lost, .. } if caused_by_you == suspect => {
            println!("bystander: notice lists {:?} launches and {} buffers lost", lost.launches, lost.buffers.len());
            if lost.buffers.len() != 3 {
                return Err(format!("bystander: expected its 3 buffers listed as lost, got {:?}", lost.buffers).into());
            }
        }
        other => return Err(format!("bystander: unexpected notice {other:?}").into()),
    }
    Ok(())
}

/// Same handles, new memory: upload again and check a small product.
fn rerun_after_loss(
    client: &Client,
    kernel: &gpumux_client::Kernel,
    bufs: (&gpumux_client::Buffer, &gpumux_client::Buffer, &gpumux_client::Buffer),
) -> Result<()> {
    let (da, db, dc) = bufs;
    let s = StreamId::DEFAULT;
    let m = 256usize;
    let (a, b) = matrices(m);
    client.copy_to_device(da, 0, &f32_bytes(&a), s)?;
    client.copy_to_device(db, 0, &f32_bytes(&b), s)?;
    let config = LaunchConfig::new([(m / 16) as u32, (m / 16) as u32, 1], [16, 16, 1]).block_time_ns(5_000);
    client.launch(kernel, &config, &[Arg::buffer(da), Arg::buffer(db), Arg::buffer(dc), (m as i32).into()])?;
    client.sync(s)?;
    let mut out = vec![0u8; m * m * 4];
    client.copy_to_host(dc, 0, &mut out, s)?;
    if client.is_simulated() {
        println!("bystander: simulated device, kernels do not compute; the rerun completed");
        return Ok(());
    }
    for r in 0..m {
        for c in 0..m {
            let want: f32 = (0..m).map(|k| a[r * m + k] * b[k * m + c]).sum();
            let i = (r * m + c) * 4;
            let got = f32::from_le_bytes([out[i], out[i + 1], out[i + 2], out[i + 3]]);
            if got != want {
                return Err(format!("bystander: C[{r}][{c}] = {got}, the CPU says {want}").into());
            }
        }
    }
    println!("bystander: a 256x256 matmul after the rebuild equals the CPU's");
    Ok(())
}

fn churn(client: &Client) -> Result<()> {
    let s = StreamId::DEFAULT;
    let module = client.load_module("vector_add.cu", include_str!("kernels/vector_add.cu"), &[])?;
    let kernel = module.kernel("vector_add")?;
    let mut round = 0u64;
    loop {
        let n = (1usize << 16) << (round % 6);
        let data: Vec<u8> = (0..n * 4).map(|i| (i as u64 + round) as u8).collect();
        let (a, c) = (client.alloc((n * 4) as u64)?, client.alloc((n * 4) as u64)?);
        client.copy_to_device(&a, 0, &data, s)?;
        let config = LaunchConfig::for_threads(n as u32, 256).block_time_ns(20_000);
        client.launch(&kernel, &config, &[Arg::buffer(&a), Arg::buffer(&a), Arg::buffer(&c), (n as i32).into()])?;
        client.sync(s)?;
        let mut back = vec![0u8; n * 4];
        client.copy_to_host(&a, 0, &mut back, s)?;
        if back != data {
            return Err(format!("churn: round {round}: input did not round-trip").into());
        }
        client.free(a)?;
        client.free(c)?;
        round += 1;
    }
}

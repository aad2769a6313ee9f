//! One daemon, two simulated GPUs (`sim:h100x2`; docs/multi-gpu.md): clients
//! spread over both under the default placement with the bytes a one-GPU daemon
//! gives, a pinned client stays on its GPU, a pin to a GPU that is not there
//! is refused naming those that are, and a fault or a killed device process
//! on one GPU leaves the other GPU's client untouched; clients that declare
//! their class are placed a memory-bound one beside a compute-bound one.

mod common;

use common::*;
use gpumux_proto::*;
use gpumuxd::backend::pieces::PIECE;
use gpumuxd::backend::remote::RemoteBackend;
use gpumuxd::backend::Backend;
use std::sync::Barrier;
use std::time::{Duration, Instant};

const KERNELS: &str = "__global__ void scale(float* x, unsigned n) { unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }\n\
__global__ void boom(int* p) { if (threadIdx.x == 0) __trap(); }\n";
const SCALE: usize = 0;
const BOOM: usize = 1;
const TWO: &str = "sim:h100x2";

fn slice(buffer: BufferId, offset: u64) -> BufferSlice {
    BufferSlice { buffer, offset }
}

/// Says hello pinned to `gpu` (`None`: placed by the daemon).
fn hello_on(d: &Daemon, name: &str, gpu: Option<u32>) -> (Client, Result<Reply, ErrorReply>) {
    hello_as(d, name, gpu, None)
}

/// Says hello pinned to `gpu`, declaring `class`.
fn hello_as(
    d: &Daemon,
    name: &str,
    gpu: Option<u32>,
    class: Option<ClientClass>,
) -> (Client, Result<Reply, ErrorReply>) {
    let mut c = Client::connect(d);
    let r = c.call(Request::Hello {
        magic: MAGIC,
        version: VERSION,
        name: name.into(),
        priority: 0,
        weight: 1.0,
        gpu,
        class,
    });
    (c, r)
}

fn welcomed(d: &Daemon, name: &str, gpu: Option<u32>) -> (Client, Welcome) {
    match hello_on(d, name, gpu) {
        (c, Ok(Reply::Welcome(w))) => (c, w),
        (_, other) => panic!("{name}: no welcome: {other:?}"),
    }
}

/// Client `i`'s bytes, different for each.
fn data_of(i: u32) -> Vec<u8> {
    (0..200_000u32).map(|k| (k.wrapping_add(i * 7919).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// A client's work: its bytes up, a kernel over them, a device copy, a
/// memset, everything back; what came back.
fn work(c: &mut Client, i: u32) -> Vec<u8> {
    let region = memfd(1 << 20);
    assert_eq!(c.attach(&region, 1 << 20), Ok(Reply::Done));
    let data = data_of(i);
    let n = data.len() as u64;
    pwrite(&region, 0, &data);
    let (a, b, m) = (c.alloc(n), c.alloc(n), c.alloc(4096));
    let k = c.load(KERNELS);
    c.ok(Request::CopyToDevice { dst: slice(a, 0), shm_offset: 0, bytes: n, stream: StreamId(0) });
    for _ in 0..3 {
        c.launch_ok(launch(k[SCALE].kernel, 64, 50_000, vec![Arg::Buffer(slice(a, 0)), Arg::U32(n as u32 / 4)]));
    }
    c.ok(Request::CopyDevice { src: slice(a, 0), dst: slice(b, 0), bytes: n, stream: StreamId(0) });
    c.ok(Request::Memset { dst: slice(m, 0), value: i as u8 + 1, bytes: 4096, stream: StreamId(0) });
    c.ok(Request::SyncStream(StreamId(0)));
    c.ok(Request::CopyToHost { src: slice(b, 0), shm_offset: 300_000, bytes: n, stream: StreamId(0) });
    c.ok(Request::CopyToHost { src: slice(m, 0), shm_offset: 600_000, bytes: 4096, stream: StreamId(0) });
    let mut out = pread(&region, 300_000, data.len());
    out.extend(pread(&region, 600_000, 4096));
    out
}

/// Four clients at once on `device`: each one's GPU and bytes, and the
/// status one of them saw while all four were connected.
fn four_clients(device: &str) -> (Vec<(u32, Vec<u8>)>, Status) {
    let d = Daemon::start_on(Some(device), None, &[]);
    let all_in = Barrier::new(4);
    let seen = Barrier::new(4);
    let mut status = None;
    let results = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..4u32)
            .map(|i| {
                let (d, all_in, seen) = (&d, &all_in, &seen);
                scope.spawn(move || {
                    let (mut c, w) = welcomed(d, &format!("client{i}"), None);
                    let bytes = work(&mut c, i);
                    all_in.wait();
                    let s = (i == 0).then(|| c.status());
                    seen.wait();
                    (w.gpu, w.client, bytes, s)
                })
            })
            .collect();
        workers.into_iter().map(|t| t.join().expect("a client thread")).collect::<Vec<_>>()
    });
    let mut out = Vec::new();
    for (gpu, client, bytes, s) in results {
        if let Some(s) = s {
            status = Some(s);
        }
        out.push((gpu, bytes, client));
    }
    let status = status.expect("client 0 asked");
    // Each row's GPU is the one its Welcome named.
    for (gpu, _, client) in &out {
        let row = status.clients.iter().find(|r| r.client == *client);
        assert_eq!(row.map(|r| r.gpu), Some(*gpu), "client {client}: {status:?}");
    }
    (out.into_iter().map(|(g, b, _)| (g, b)).collect(), status)
}

#[test]
fn four_clients_spread_over_two_gpus_and_get_the_bytes_one_gpu_gives() {
    let (two, status) = four_clients(TWO);
    let (one, one_status) = four_clients("sim:h100");
    let gpus: Vec<u32> = two.iter().map(|(g, _)| *g).collect();
    assert_eq!(
        gpus.iter().filter(|&&g| g == 0).count(),
        2,
        "the default (pairs, as least-loaded for undeclared clients) puts two on each GPU: {gpus:?}"
    );
    assert_eq!(gpus.iter().filter(|&&g| g == 1).count(), 2, "{gpus:?}");
    assert!(one.iter().all(|(g, _)| *g == 0), "one GPU: all on GPU 0");
    for (i, ((_, a), (_, b))) in two.iter().zip(&one).enumerate() {
        assert!(a == b, "client {i}: its bytes differ between two GPUs and one");
        let expect = [data_of(i as u32), vec![i as u8 + 1; 4096]].concat();
        assert!(*a == expect, "client {i}: the bytes came back changed");
    }
    // The status: four rows, a row per GPU with two clients each, totals of both.
    assert_eq!(status.clients.len(), 4, "{status:?}");
    assert_eq!(status.gpus.iter().map(|g| (g.gpu, g.clients)).collect::<Vec<_>>(), [(0, 2), (1, 2)]);
    assert_eq!(status.sms, 264);
    assert_eq!(status.memory_total, status.gpus.iter().map(|g| g.memory_total).sum::<u64>());
    let held: u64 = status.clients.iter().map(|c| c.memory_used).sum();
    assert_eq!(status.memory_used, held);
    assert_eq!(status.gpus.iter().map(|g| g.memory_used).sum::<u64>(), held);
    assert!(status.device.starts_with("2 GPUs: "), "{}", status.device);
    assert_eq!(one_status.gpus.len(), 1, "one GPU: one row");
    assert_eq!(one_status.sms, 132);
}

#[test]
fn a_pinned_client_stays_on_its_gpu_and_a_pin_to_no_gpu_is_refused_naming_the_gpus() {
    let d = Daemon::start_on(Some(TWO), None, &[]);
    let (_a, wa) = welcomed(&d, "a", None);
    assert_eq!(wa.gpu, 0, "the first goes to GPU 0");
    // Least-loaded would take GPU 1; the pin keeps it on 0.
    let (_b, wb) = welcomed(&d, "b", Some(0));
    assert_eq!(wb.gpu, 0);
    let (mut c, wc) = welcomed(&d, "c", None);
    assert_eq!(wc.gpu, 1, "GPU 1 has fewer clients");
    let (_e, we) = welcomed(&d, "e", Some(1));
    assert_eq!(we.gpu, 1);
    let s = c.status();
    let on: Vec<(String, u32)> = s.clients.iter().map(|r| (r.name.clone(), r.gpu)).collect();
    assert_eq!(on, [("a".to_string(), 0), ("b".into(), 0), ("c".into(), 1), ("e".into(), 1)]);
    let (mut bad, r) = hello_on(&d, "bad", Some(2));
    let e = r.expect_err("a pin to GPU 2 of two is refused");
    assert_eq!(e.kind, ErrorKind::Invalid);
    assert!(e.message.contains("no GPU 2") && e.message.contains("GPU 0, 1"), "{}", e.message);
    assert!(bad.next_frame().is_none(), "the refused client is let go");
    // It counts nowhere, and the others go on.
    let s = c.status();
    assert_eq!(s.clients.len(), 4, "{s:?}");
    assert_eq!(s.gpus.iter().map(|g| g.clients).collect::<Vec<_>>(), [2, 2]);
}

#[test]
fn a_pin_on_a_daemon_of_one_gpu_is_gpu_0_or_refused() {
    let d = Daemon::start_on(Some("sim:h100"), None, &[]);
    let (_a, w) = welcomed(&d, "a", Some(0));
    assert_eq!(w.gpu, 0);
    let (_b, r) = hello_on(&d, "b", Some(1));
    let e = r.expect_err("one GPU: no GPU 1");
    assert!(e.message.contains("no GPU 1") && e.message.contains("GPU 0"), "{}", e.message);
}

/// A client running a long kernel on GPU 0 while a client on GPU 1 traps:
/// GPU 1's context is rebuilt, GPU 0's client sees nothing of it.
/// Returns the daemon, still serving, and its device processes before the trap (if any).
fn trap_on_one_gpu(args: &[&str]) -> (Daemon, Vec<i32>) {
    let d = Daemon::start_on(Some(TWO), None, args);
    let before = if args.contains(&"--device-process") { device_processes(&d, 2) } else { Vec::new() };
    let (mut good, wg) = welcomed(&d, "bystander", Some(0));
    let (mut bad, wb) = welcomed(&d, "culprit", Some(1));
    assert_eq!((wg.gpu, wb.gpu), (0, 1));
    let region = memfd(1 << 20);
    assert_eq!(good.attach(&region, 1 << 20), Ok(Reply::Done));
    let data = data_of(9);
    let n = data.len() as u64;
    pwrite(&region, 0, &data);
    let kg = good.load(KERNELS);
    let kb = bad.load(KERNELS);
    let gbuf = good.alloc(n);
    good.ok(Request::CopyToDevice { dst: slice(gbuf, 0), shm_offset: 0, bytes: n, stream: StreamId(0) });
    // The bystander's kernel runs for a second, across the fault.
    good.launch_ok(launch(kg[SCALE].kernel, 8, 1_000_000_000, vec![Arg::Buffer(slice(gbuf, 0)), Arg::U32(1)]));
    let gsync = good.send(Request::SyncStream(StreamId(0)));
    std::thread::sleep(Duration::from_millis(50));
    let bbuf = bad.alloc(64);
    bad.launch_ok(launch(kb[BOOM].kernel, 4, 200_000_000, vec![Arg::Buffer(slice(bbuf, 0))]));
    let e = bad.call(Request::SyncStream(StreamId(0))).unwrap_err();
    assert_eq!(e.kind, ErrorKind::KernelFault, "{e:?}");
    assert!(matches!(bad.notices.as_slice(), [Notice::ContextLost { caused_by_you: true, .. }]), "{:?}", bad.notices);
    // GPU 0: its kernel ran to its end, its data is whole, no notice.
    assert_eq!(good.wait(gsync), Ok(Reply::Done));
    good.ok(Request::CopyToHost { src: slice(gbuf, 0), shm_offset: 400_000, bytes: n, stream: StreamId(0) });
    assert!(pread(&region, 400_000, data.len()) == data, "the bystander's bytes changed");
    assert!(good.notices.is_empty(), "{:?}", good.notices);
    let s = good.status();
    assert_eq!(s.gpus.iter().map(|g| g.context_rebuilds).collect::<Vec<_>>(), [0, 1], "{s:?}");
    assert_eq!(s.context_rebuilds, 1);
    // The culprit goes on, on its GPU's fresh context.
    bad.launch_ok(launch(kb[SCALE].kernel, 8, 1_000, vec![Arg::Buffer(slice(bbuf, 0)), Arg::U32(1)]));
    bad.ok(Request::SyncStream(StreamId(0)));
    (d, before)
}

#[test]
fn a_trap_on_one_gpu_leaves_the_other_gpus_client_untouched() {
    trap_on_one_gpu(&[]);
}

#[test]
fn a_trap_in_one_gpus_device_process_restarts_only_that_one() {
    let (d, before) = trap_on_one_gpu(&["--device-process"]);
    let after = device_processes(&d, 2);
    let kept: Vec<&i32> = before.iter().filter(|p| after.contains(p)).collect();
    assert_eq!(kept.len(), 1, "GPU 0's device process serves on, GPU 1's was replaced: {before:?} then {after:?}");
}

/// The daemon's `n` device processes, waiting up to 10 s for them.
fn device_processes(d: &Daemon, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = d.children();
        if c.len() == n {
            return c;
        }
        assert!(Instant::now() < deadline, "not {n} device processes: {c:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (up to 10 s, asking `Status` as a client of its own, which does
/// nothing else) until each of `clients` has a kernel running and an
/// operation queued behind it.
fn running_and_waited_for(d: &Daemon, clients: &[u64]) {
    let (mut observer, _) = Client::hello(d, "observer", 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let rows = observer.status().clients;
        let busy = |id: &u64| rows.iter().any(|r| r.client == *id && r.ops_running >= 1 && r.ops_queued >= 1);
        if clients.iter().all(busy) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not every client of {clients:?} has a kernel running and a sync queued: {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The daemon's `Status`, asked until every GPU's core answers it: a core
/// still starting a fresh device process after a loss does not answer within
/// the daemon's wait and shows as a row its board fills ("restarting its
/// device", or before it began, "busy"), not as the core's own.
fn settled_status(c: &mut Client) -> Status {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = c.status();
        let unanswered = ["(stopped)", " so far)", "(busy: no answer in "];
        if !s.gpus.iter().any(|g| unanswered.iter().any(|u| g.device.contains(u))) {
            return s;
        }
        assert!(Instant::now() < deadline, "a GPU's core does not answer: {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_killed_device_process_fails_only_its_gpus_client() {
    let d = Daemon::start_on(Some(TWO), None, &["--device-process"]);
    let mut clients: Vec<(Client, Welcome, OwnedRegion)> = (0..2u32)
        .map(|g| {
            let (mut c, w) = welcomed(&d, &format!("on{g}"), Some(g));
            let region = memfd(1 << 20);
            assert_eq!(c.attach(&region, 1 << 20), Ok(Reply::Done));
            (c, w, OwnedRegion(region))
        })
        .collect();
    let data = data_of(3);
    let n = data.len() as u64;
    let mut syncs = Vec::new();
    for (c, _, r) in &mut clients {
        pwrite(&r.0, 0, &data);
        let b = c.alloc(n);
        c.ok(Request::CopyToDevice { dst: slice(b, 0), shm_offset: 0, bytes: n, stream: StreamId(0) });
        let k = c.load(KERNELS);
        c.launch_ok(launch(k[SCALE].kernel, 8, 1_000_000_000, vec![Arg::Buffer(slice(b, 0)), Arg::U32(1)]));
        syncs.push((c.send(Request::SyncStream(StreamId(0))), b));
    }
    // The kill must find each client's kernel on its device and its sync in
    // its core: a sync that reached the core only after the rebuild would
    // find an empty stream and answer Done (a fixed sleep here lost that
    // race on a loaded machine, and both clients kept their work).
    let ids: Vec<u64> = clients.iter().map(|(_, w, _)| w.client).collect();
    running_and_waited_for(&d, &ids);
    let victims = device_processes(&d, 2);
    assert_eq!(unsafe { libc::kill(victims[0], libc::SIGKILL) }, 0);
    // Exactly one client lost its work, and the other's kernel ran to its end.
    let outcomes: Vec<bool> = clients
        .iter_mut()
        .zip(&syncs)
        .map(|((c, _, _), (sync, _))| match c.wait(*sync) {
            Ok(Reply::Done) => true,
            Err(e) if matches!(e.kind, ErrorKind::KernelFault | ErrorKind::ContextLost) => false,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(outcomes.iter().filter(|&&ok| ok).count(), 1, "{outcomes:?}");
    let lost = outcomes.iter().position(|&ok| !ok).unwrap_or(usize::MAX);
    let kept = 1 - lost;
    assert!(clients[kept].0.notices.is_empty(), "{:?}", clients[kept].0.notices);
    assert!(
        matches!(clients[lost].0.notices.as_slice(), [Notice::ContextLost { .. }]),
        "{:?}",
        clients[lost].0.notices
    );
    // The kept one's bytes are whole; the other GPU serves again with a fresh device process.
    let (c, _, r) = &mut clients[kept];
    c.ok(Request::CopyToHost { src: slice(syncs[kept].1, 0), shm_offset: 400_000, bytes: n, stream: StreamId(0) });
    assert!(pread(&r.0, 400_000, data.len()) == data, "the kept client's bytes changed");
    let s = settled_status(c);
    let rebuilds: Vec<u32> = s.gpus.iter().map(|g| g.context_rebuilds).collect();
    let mut expect = [0, 0];
    expect[clients[lost].1.gpu as usize] = 1;
    assert_eq!(rebuilds, expect, "only the killed GPU was rebuilt: {s:?}");
    let fresh = device_processes(&d, 2);
    assert!(fresh.contains(&victims[1]) && !fresh.contains(&victims[0]), "{victims:?} then {fresh:?}");
    let (c, _, _) = &mut clients[lost];
    c.ok(Request::SyncStream(StreamId(0)));
}

/// Four clients declaring memory, compute, memory, compute, connected one
/// after the other on two simulated GPUs with the daemon's arguments
/// `args`, then each doing its work in turn: the GPU each one's `Welcome`
/// named and the one `ps` shows it on afterwards, after checking that every
/// client's bytes came back as it put them (through its kernel, device copy
/// and memset).
fn declared_clients(args: &[&str]) -> (Vec<u32>, Vec<u32>) {
    let d = Daemon::start_on(Some(TWO), None, args);
    let classes = [ClientClass::Memory, ClientClass::Compute, ClientClass::Memory, ClientClass::Compute];
    let mut clients: Vec<(Client, u32)> = classes
        .iter()
        .enumerate()
        .map(|(i, &class)| match hello_as(&d, &format!("{}{i}", class.name()), None, Some(class)) {
            (c, Ok(Reply::Welcome(w))) => (c, w.gpu),
            (_, other) => panic!("client {i}: no welcome: {other:?}"),
        })
        .collect();
    for (i, (c, _)) in clients.iter_mut().enumerate() {
        let expect = [data_of(i as u32), vec![i as u8 + 1; 4096]].concat();
        assert!(work(c, i as u32) == expect, "client {i}: the bytes came back changed");
    }
    let status = clients[0].0.status();
    let now = classes
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let row = status.clients.iter().find(|r| r.name == format!("{}{i}", c.name()));
            row.map(|r| r.gpu).unwrap_or_else(|| panic!("client {i} not in ps: {status:?}"))
        })
        .collect();
    (clients.iter().map(|(_, g)| *g).collect(), now)
}

/// The default placement (`pairs`) puts each memory-bound client beside a
/// compute-bound one, where `least-loaded` (in arrival order) puts both
/// memory-bound clients on GPU 0; the bytes are right either way.
#[test]
fn declared_classes_pair_a_memory_bound_client_with_a_compute_bound_one_on_each_gpu() {
    let pairs = [0, 0, 1, 1];
    assert_eq!(declared_clients(&[]), (pairs.to_vec(), pairs.to_vec()), "pairs (the default): M+C on each GPU");
    assert_eq!(declared_clients(&["--placement", "pairs"]).0, pairs);
    let split = [0, 1, 0, 1];
    let least = declared_clients(&["--placement", "least-loaded"]);
    assert_eq!(least, (split.to_vec(), split.to_vec()), "least-loaded: M+M on GPU 0, and they stay");
}

/// With `--rebalance`, clients that least-loaded placed M+M and C+C move,
/// idle, at their next request: M0 to GPU 1 (its M+M was the worse), then
/// C1 from GPU 1's M+C+C to GPU 0's lone M; then every GPU holds one of
/// each and nothing moves. Every client's bytes are right after its move.
#[test]
fn with_rebalance_declared_clients_move_until_each_gpu_holds_a_pair() {
    let (welcome, now) = declared_clients(&["--placement", "least-loaded", "--rebalance"]);
    assert_eq!(welcome, [0, 1, 0, 1]);
    assert_eq!(now, [1, 0, 0, 1], "M0 and C1 moved: GPU 0 holds C1 and M2, GPU 1 M0 and C3");
}

/// A region kept with its client.
struct OwnedRegion(std::os::fd::OwnedFd);

#[test]
fn a_malformed_multi_gpu_device_fails_start_up_with_the_reason() {
    let dir = tempfile::Builder::new().prefix("gpumuxd-multi-").tempdir().expect("a temporary directory");
    for (spec, says) in [("sim:h100x0", "1 to 16 GPUs"), ("sim:h900x2", "sim:h900"), ("cuda:1,1", "GPU 1 twice")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumuxd"))
            .args(["--device", spec, "--socket"])
            .arg(dir.path().join("g.sock"))
            .env("RUST_LOG", "error")
            .output()
            .expect("gpumuxd runs");
        assert!(!out.status.success(), "{spec}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{spec}: {stderr}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumuxd"))
        .args(["--device", TWO, "--placement", "fastest", "--socket"])
        .arg(dir.path().join("g.sock"))
        .output()
        .expect("gpumuxd runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown placement `fastest`") && stderr.contains("least-loaded"), "{stderr}");
}

/// A client shape for the placement measurement: device memory it holds,
/// and launches of `blocks` blocks of `block_us` each, `per_sync` between syncs.
struct Shape {
    name: &'static str,
    memory: u64,
    launches: u32,
    blocks: u32,
    block_us: u64,
    per_sync: u32,
}

/// Four shapes after examples/clients: a streaming kernel over large
/// buffers (vector_add), a half-GPU kernel over a small input (histogram),
/// a few long compute-bound kernels over three matrices (matmul), and many
/// short steps synced each time (stencil). Each takes about 0.25 s alone.
const SHAPES: [Shape; 4] = [
    Shape { name: "vector_add", memory: 4 << 30, launches: 60, blocks: 4224, block_us: 2000, per_sync: 10 },
    Shape { name: "histogram", memory: 64 << 20, launches: 30, blocks: 1056, block_us: 8000, per_sync: 30 },
    Shape { name: "matmul", memory: 1 << 30, launches: 10, blocks: 12672, block_us: 4000, per_sync: 10 },
    Shape { name: "stencil", memory: 512 << 20, launches: 120, blocks: 2112, block_us: 2000, per_sync: 1 },
];

/// Runs `shape` as client `name` (memory first, as programs do); its time from connecting to its last sync.
fn run_shape(d: &Daemon, shape: &Shape) -> (u32, Duration) {
    let t0 = Instant::now();
    let (mut c, w) = welcomed(d, shape.name, None);
    let _memory = c.alloc(shape.memory);
    let k = c.load("__global__ void step() {}\n");
    for i in 0..shape.launches {
        c.launch_ok(launch(k[0].kernel, shape.blocks, shape.block_us * 1000, vec![]));
        if (i + 1) % shape.per_sync == 0 {
            c.ok(Request::SyncStream(StreamId(0)));
        }
    }
    c.ok(Request::SyncStream(StreamId(0)));
    (w.gpu, t0.elapsed())
}

/// The four shapes started 50 ms apart (each allocates as it starts); each one's GPU and time.
fn co_run(device: &str, placement: &str) -> Vec<(u32, Duration)> {
    let d = Daemon::start_on(Some(device), None, &["--placement", placement]);
    std::thread::scope(|scope| {
        let runs: Vec<_> = SHAPES
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let d = &d;
                scope.spawn(move || {
                    std::thread::sleep(Duration::from_millis(50 * i as u64));
                    run_shape(d, shape)
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().expect("a client")).collect()
    })
}

/// docs/multi-gpu.md, "Placement": the co-run STP of the four shapes on one
/// simulated H100 and on two under each placement policy, against each
/// shape alone on one. Wall-clock time on the simulator (its kernels take
/// their simulated time), so run it on an idle machine:
/// `cargo test --release -p gpumuxd --test multi_gpu -- --ignored --nocapture placement_stp`.
#[test]
#[ignore = "a measurement (about 10 s), not a check: docs/multi-gpu.md"]
fn placement_stp() {
    let alone: Vec<Duration> = {
        let d = Daemon::start_on(Some("sim:h100"), None, &[]);
        SHAPES.iter().map(|s| run_shape(&d, s).1).collect()
    };
    let stp = |shared: &[(u32, Duration)]| -> f64 {
        alone.iter().zip(shared).map(|(a, (_, s))| a.as_secs_f64() / s.as_secs_f64()).sum()
    };
    println!("alone on one GPU (s): {:?}", alone.iter().map(|a| format!("{:.3}", a.as_secs_f64())).collect::<Vec<_>>());
    let one = co_run("sim:h100", "least-loaded");
    let one_stp = stp(&one);
    println!("| run | GPUs of vector_add, histogram, matmul, stencil | STP | vs one GPU |");
    println!("|---|---|---|---|");
    println!("| 4 clients on 1 GPU | {:?} | {one_stp:.2} | 1.00x |", one.iter().map(|r| r.0).collect::<Vec<_>>());
    for placement in ["pairs", "least-loaded", "memory"] {
        let two = co_run(TWO, placement);
        let s = stp(&two);
        println!(
            "| 4 clients on 2 GPUs, `{placement}` | {:?} | {s:.2} | {:.2}x |",
            two.iter().map(|r| r.0).collect::<Vec<_>>(),
            s / one_stp
        );
    }
}

/// The clients of `status` named `name`: their GPU.
fn gpu_of(status: &Status, name: &str) -> Option<u32> {
    status.clients.iter().find(|c| c.name == name).map(|c| c.gpu)
}

/// A client with `data` in a buffer, a second buffer and the kernels
/// loaded: (its region, the buffer, the second, the scale kernel).
fn set_up(c: &mut Client, data: &[u8]) -> (std::os::fd::OwnedFd, BufferId, BufferId, KernelId) {
    let region = memfd(1 << 20);
    assert_eq!(c.attach(&region, 1 << 20), Ok(Reply::Done));
    pwrite(&region, 0, data);
    let n = data.len() as u64;
    let (a, b) = (c.alloc(n), c.alloc(n));
    let k = c.load(KERNELS);
    c.ok(Request::CopyToDevice { dst: slice(a, 0), shm_offset: 0, bytes: n, stream: StreamId(0) });
    c.ok(Request::SyncStream(StreamId(0)));
    (region, a, b, k[SCALE].kernel)
}

/// With `--rebalance` (else not): clients a and c on GPU 0, b on GPU 1; b
/// leaves, c has a long kernel queued and asks something (it stays: never
/// moved with work under way), then idle a asks for its bytes back: it has
/// moved to GPU 1 (ps says so), its bytes are those it put there, and its
/// handles (buffers, kernel, stream) work there.
fn idle_client_after_a_gpu_empties(rebalance: bool) -> (Status, Status) {
    let args: &[&str] = if rebalance { &["--rebalance"] } else { &[] };
    idle_client_after_a_gpu_empties_with(args)
}

/// [`idle_client_after_a_gpu_empties`] with the daemon's arguments `args`.
fn idle_client_after_a_gpu_empties_with(args: &[&str]) -> (Status, Status) {
    let d = Daemon::start_on(Some(TWO), None, args);
    let (mut a, wa) = welcomed(&d, "a", None);
    let (b, wb) = welcomed(&d, "b", None);
    let (mut c, wc) = welcomed(&d, "c", None);
    assert_eq!((wa.gpu, wb.gpu, wc.gpu), (0, 1, 0), "least-loaded: 0, 1, 0");
    let data = data_of(5);
    let n = data.len() as u64;
    let (region, buf, other, scale) = set_up(&mut a, &data);
    let (_c_region, c_buf, _, c_scale) = set_up(&mut c, &data_of(6));
    // c's kernel runs for seconds on the simulated GPU (nothing computed, time taken).
    c.launch_ok(launch(c_scale, 200_000, 50_000_000, vec![Arg::Buffer(slice(c_buf, 0)), Arg::U32(1)]));
    // Answered after the launch is queued (b is still on GPU 1 until then:
    // a launch read once GPU 1 is empty would move c first, then queue it).
    let _ = c.status();
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.status().gpus.iter().find(|g| g.gpu == 1).map(|g| g.clients) != Some(0) {
        assert!(Instant::now() < deadline, "b never left GPU 1");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The route counts b out when its reader ends, just after its core hears it.
    std::thread::sleep(Duration::from_millis(100));
    // c asks with its kernel queued: never moved under it.
    let _more = c.alloc(4096);
    let c_seen = c.status();
    // a, idle, asks for its bytes back: moved first, if rebalancing.
    copy_back(&mut a, buf, n);
    assert!(pread(&region, 300_000, data.len()) == data, "a's bytes changed on their way");
    // Its handles still work: its kernel over its buffer, a device copy into
    // its other buffer, a memset, all back.
    a.launch_ok(launch(scale, 64, 50_000, vec![Arg::Buffer(slice(buf, 0)), Arg::U32(n as u32 / 4)]));
    a.ok(Request::CopyDevice { src: slice(buf, 0), dst: slice(other, 0), bytes: n, stream: StreamId(0) });
    a.ok(Request::Memset { dst: slice(buf, 0), value: 9, bytes: 4096, stream: StreamId(0) });
    a.ok(Request::SyncStream(StreamId(0)));
    a.ok(Request::CopyToHost { src: slice(other, 0), shm_offset: 300_000, bytes: n, stream: StreamId(0) });
    a.ok(Request::CopyToHost { src: slice(buf, 0), shm_offset: 600_000, bytes: 4096, stream: StreamId(0) });
    assert!(pread(&region, 300_000, data.len()) == data, "the copy of a's buffer differs");
    assert_eq!(pread(&region, 600_000, 4096), vec![9; 4096], "a's memset");
    (c_seen, a.status())
}

/// `CopyToHost` of `n` bytes of `buf` to offset 300,000 of the client's region, then a sync.
fn copy_back(c: &mut Client, buf: BufferId, n: u64) {
    c.ok(Request::CopyToHost { src: slice(buf, 0), shm_offset: 300_000, bytes: n, stream: StreamId(0) });
    c.ok(Request::SyncStream(StreamId(0)));
}

#[test]
fn with_rebalance_an_idle_client_moves_to_an_emptied_gpu_with_its_bytes_and_handles_and_a_busy_one_never() {
    let (c_seen, after) = idle_client_after_a_gpu_empties(true);
    assert_eq!((gpu_of(&c_seen, "a"), gpu_of(&c_seen, "c")), (Some(0), Some(0)), "c, busy, stayed: {c_seen:?}");
    assert_eq!((gpu_of(&after, "a"), gpu_of(&after, "c")), (Some(1), Some(0)), "a moved to GPU 1: {after:?}");
    let per_gpu: Vec<(u32, u32)> = after.gpus.iter().map(|g| (g.gpu, g.clients)).collect();
    assert_eq!(per_gpu, [(0, 1), (1, 1)]);
    // a's memory moved with it: GPU 1 holds its two buffers, GPU 0 only c's.
    let a_row = after.clients.iter().find(|c| c.name == "a").map(|c| c.memory_used);
    assert_eq!(after.gpus.iter().find(|g| g.gpu == 1).map(|g| g.memory_used), a_row);
}

/// The same move with each GPU's device in a child process (a CUDA GPU's
/// default): the bytes cross each device process's link in pieces
/// (`backend::pieces`, `ToDevice::ReadPiece` / `WritePiece`).
#[test]
fn with_rebalance_a_client_moves_between_device_processes_with_its_bytes() {
    let (c_seen, after) = idle_client_after_a_gpu_empties_with(&["--rebalance", "--device-process"]);
    assert_eq!((gpu_of(&c_seen, "a"), gpu_of(&c_seen, "c")), (Some(0), Some(0)), "c, busy, stayed: {c_seen:?}");
    assert_eq!((gpu_of(&after, "a"), gpu_of(&after, "c")), (Some(1), Some(0)), "a moved to GPU 1: {after:?}");
}

/// A device process reads back and writes in a buffer of several pieces
/// (the staging region is [`PIECE`] bytes), the same after it is restarted
/// (its staging region registered again), and refuses, naming the numbers,
/// an address it does not hold and more bytes than a buffer has.
#[test]
fn a_device_process_reads_back_and_writes_in_a_buffer_of_several_pieces() {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_gpumuxd"));
    let mut b = RemoteBackend::start(exe, "sim:h100").expect("the device process starts");
    let n = PIECE as u64 + 4097;
    let data: Vec<u8> = (0..n).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    for round in ["first", "after a restart"] {
        let addr = b.alloc(n).expect("alloc");
        assert!(matches!(b.write_in(addr, &data), Some(Ok(()))), "{round}: write in");
        match b.read_back(addr, n) {
            Some(Ok(back)) => assert!(back == data, "{round}: the bytes came back changed"),
            other => panic!("{round}: read back: {:?}", other.map(|r| r.map(|v| v.len()))),
        }
        // A prefix reads back as itself.
        match b.read_back(addr, 1000) {
            Some(Ok(back)) => assert!(back[..] == data[..1000], "{round}: a prefix"),
            other => panic!("{round}: a prefix: {:?}", other.map(|r| r.map(|v| v.len()))),
        }
        match b.read_back(addr, n + 1) {
            Some(Err(e)) => assert!(e.to_string().contains(&n.to_string()), "{round}: {e}"),
            other => panic!("{round}: a read past the end: {:?}", other.map(|r| r.map(|v| v.len()))),
        }
        b.free(addr).expect("free");
        assert!(matches!(b.read_back(addr, 16), Some(Err(_))), "{round}: a freed buffer reads back");
        if round == "first" {
            b.rebuild().expect("a fresh device process");
        }
    }
}

#[test]
fn without_rebalance_every_client_stays_where_it_was_placed() {
    let (_, after) = idle_client_after_a_gpu_empties(false);
    assert_eq!((gpu_of(&after, "a"), gpu_of(&after, "c")), (Some(0), Some(0)), "{after:?}");
    let per_gpu: Vec<(u32, u32)> = after.gpus.iter().map(|g| (g.gpu, g.clients)).collect();
    assert_eq!(per_gpu, [(0, 2), (1, 0)]);
}

/// With `--rebalance`, a client pinned to its GPU stays there when another
/// GPU empties; an idle one that was placed goes, with its bytes.
#[test]
fn with_rebalance_a_pinned_client_stays_and_a_placed_one_moves() {
    let d = Daemon::start_on(Some(TWO), None, &["--rebalance"]);
    let (mut a, wa) = welcomed(&d, "a", Some(0));
    let (b, wb) = welcomed(&d, "b", None);
    let (mut c, wc) = welcomed(&d, "c", None);
    assert_eq!((wa.gpu, wb.gpu, wc.gpu), (0, 1, 0));
    let (data_a, data_c) = (data_of(7), data_of(8));
    let (region_a, buf_a, _, _) = set_up(&mut a, &data_a);
    let (region_c, buf_c, _, _) = set_up(&mut c, &data_c);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.status().gpus.iter().find(|g| g.gpu == 1).map(|g| g.clients) != Some(0) {
        assert!(Instant::now() < deadline, "b never left GPU 1");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    copy_back(&mut a, buf_a, data_a.len() as u64);
    assert_eq!(gpu_of(&a.status(), "a"), Some(0), "a pinned itself to GPU 0");
    copy_back(&mut c, buf_c, data_c.len() as u64);
    let s = c.status();
    assert_eq!((gpu_of(&s, "a"), gpu_of(&s, "c")), (Some(0), Some(1)), "c, placed and idle, moved: {s:?}");
    assert!(pread(&region_a, 300_000, data_a.len()) == data_a, "a's bytes");
    assert!(pread(&region_c, 300_000, data_c.len()) == data_c, "c's bytes after its move");
}

/// The two-GPU device of [`a_moved_client_keeps_every_byte_of_a_buffer_of_several_pieces_and_its_kernel_works`]:
/// `GPUMUXD_TEST_MULTI_DEVICE` (`cuda:0,1` in scripts/multi-gpu-daemon-check.sh), else `sim:h100x2`.
fn multi_device() -> String {
    std::env::var("GPUMUXD_TEST_MULTI_DEVICE").unwrap_or_else(|_| TWO.into())
}

/// Chunk `k` of a moving buffer: 1 MiB of floats, small integers (doubled exactly).
fn chunk_of(k: u32) -> Vec<u8> {
    (0..(1u32 << 18)).flat_map(|i| (((k * 7919 + i) % (1 << 20)) as f32).to_le_bytes()).collect()
}

/// `--rebalance` with each GPU's device in a child process (CUDA's default)
/// and in the daemon's: clients a and c placed on GPU 0, b on GPU 1; a
/// fills a buffer of more than one staging piece (`backend::pieces`) and
/// goes idle; b leaves; a's next request moves it to GPU 1 (ps says so),
/// where every byte of its buffer is what it wrote, and its kernel (loaded
/// on GPU 0) doubles the first chunk there. On a real GPU (scripts/multi-gpu-daemon-check.sh)
/// the output is checked too; the simulator's kernels compute nothing.
#[test]
fn a_moved_client_keeps_every_byte_of_a_buffer_of_several_pieces_and_its_kernel_works() {
    let device = multi_device();
    let computes = !device.starts_with("sim");
    for mode in ["--device-process", "--device-in-process"] {
        let d = Daemon::start_on(Some(&device), None, &["--rebalance", mode]);
        let (mut a, wa) = welcomed(&d, "a", None);
        let (b, wb) = welcomed(&d, "b", None);
        let (_c, wc) = welcomed(&d, "c", None);
        assert_eq!((wa.gpu, wb.gpu, wc.gpu), (0, 1, 0), "{mode}: least-loaded: 0, 1, 0");
        let region = memfd(2 << 20);
        assert_eq!(a.attach(&region, 2 << 20), Ok(Reply::Done));
        let chunks = (PIECE >> 20) as u32 + 3;
        let buf = a.alloc(u64::from(chunks) << 20);
        let k = a.load(KERNELS);
        for i in 0..chunks {
            pwrite(&region, 0, &chunk_of(i));
            a.ok(Request::CopyToDevice {
                dst: slice(buf, u64::from(i) << 20),
                shm_offset: 0,
                bytes: 1 << 20,
                stream: StreamId(0),
            });
            a.ok(Request::SyncStream(StreamId(0)));
        }
        drop(b);
        let deadline = Instant::now() + Duration::from_secs(20);
        while a.status().gpus.iter().find(|g| g.gpu == 1).map(|g| g.clients) != Some(0) {
            assert!(Instant::now() < deadline, "{mode}: b never left GPU 1");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
        // a's next request of its own moves it.
        a.ok(Request::SyncStream(StreamId(0)));
        let s = a.status();
        assert_eq!(gpu_of(&s, "a"), Some(1), "{mode}: a, idle, moved to the empty GPU 1: {s:?}");
        for i in 0..chunks {
            a.ok(Request::CopyToHost {
                src: slice(buf, u64::from(i) << 20),
                shm_offset: 0,
                bytes: 1 << 20,
                stream: StreamId(0),
            });
            a.ok(Request::SyncStream(StreamId(0)));
            assert!(pread(&region, 0, 1 << 20) == chunk_of(i), "{mode}: chunk {i} of {chunks} changed in the move");
        }
        let floats = 1u32 << 18;
        a.launch_ok(launch(k[SCALE].kernel, floats / 128, 50_000, vec![Arg::Buffer(slice(buf, 0)), Arg::U32(floats)]));
        a.ok(Request::SyncStream(StreamId(0)));
        a.ok(Request::CopyToHost { src: slice(buf, 0), shm_offset: 1 << 20, bytes: 1 << 20, stream: StreamId(0) });
        a.ok(Request::SyncStream(StreamId(0)));
        let out = pread(&region, 1 << 20, 1 << 20);
        if computes {
            let doubled: Vec<u8> = chunk_of(0)
                .chunks_exact(4)
                .flat_map(|b| (2.0 * f32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le_bytes())
                .collect();
            assert!(out == doubled, "{mode}: the scale kernel's output on GPU 1 is not the first chunk doubled");
        } else {
            assert!(out == chunk_of(0), "{mode}: the simulator computes nothing: the chunk stays");
        }
        eprintln!(
            "{mode}: a moved from GPU 0 to GPU 1 on {device} with {chunks} MiB; bytes and kernel output as expected"
        );
    }
}

/// A client holding more than a move copies (`handover::MOVE_MAX`, 1 GiB:
/// each core is held for its side of the copy) stays on its GPU; once it
/// frees the large buffer, its next request moves it.
#[test]
fn with_rebalance_a_client_over_a_gib_of_buffers_stays_until_it_frees_it() {
    let d = Daemon::start_on(Some(TWO), None, &["--rebalance"]);
    let (mut a, wa) = welcomed(&d, "a", None);
    let (b, wb) = welcomed(&d, "b", None);
    let (_c, wc) = welcomed(&d, "c", None);
    assert_eq!((wa.gpu, wb.gpu, wc.gpu), (0, 1, 0));
    // The simulator's memory is the host's, mapped lazily: untouched, it costs nothing here.
    let big = a.alloc((1 << 30) + 4096);
    let _small = a.alloc(4096);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.status().gpus.iter().find(|g| g.gpu == 1).map(|g| g.clients) != Some(0) {
        assert!(Instant::now() < deadline, "b never left GPU 1");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(100));
    a.ok(Request::SyncStream(StreamId(0)));
    assert_eq!(gpu_of(&a.status(), "a"), Some(0), "a holds over 1 GiB: it stays");
    // Asked before the free is carried out: still too large.
    a.ok(Request::Free(big));
    assert_eq!(gpu_of(&a.status(), "a"), Some(0));
    a.ok(Request::SyncStream(StreamId(0)));
    let s = a.status();
    assert_eq!(gpu_of(&s, "a"), Some(1), "a, down to 4 KiB, moved: {s:?}");
    let a_row = s.clients.iter().find(|c| c.name == "a").map(|c| c.memory_used);
    assert_eq!(a_row, Some(4096));
}

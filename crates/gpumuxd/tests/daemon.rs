//! The whole daemon, as a process on the simulated device, over real sockets;
//! the round trip and the fault also with the device in a child process
//! (`--device-process`, how `cuda:N` runs).

mod common;

use common::*;
use gpumux_proto::*;
use std::time::{Duration, Instant};

const KERNELS: &str = "__global__ void scale(float* x, unsigned n) { unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }\n\
__global__ void boom(int* p) { if (threadIdx.x == 0) __trap(); }\n\
__global__ void idle() {}\n";
/// `idle`: a kernel of no parameters, to launch without arguments (the
/// simulated device checks argument counts and sizes where it can know them).
const IDLE: usize = 2;

fn slice(buffer: BufferId, offset: u64) -> BufferSlice {
    BufferSlice { buffer, offset }
}

/// The device in the daemon's process (the default for `sim:`).
const IN_PROCESS: &[&str] = &[];
/// The device in a child process.
const CHILD: &[&str] = &["--device-process"];

#[test]
fn data_round_trips_bitwise_through_a_memfd_around_a_kernel() {
    round_trip(IN_PROCESS);
}

#[test]
fn data_round_trips_bitwise_with_the_device_in_a_child_process() {
    round_trip(CHILD);
}

fn round_trip(args: &[&str]) {
    let d = Daemon::start_with(None, args);
    let (mut c, w) = Client::hello(&d, "roundtrip", 0);
    assert_eq!((w.version, w.sms, w.device.as_str()), (VERSION, 132, "sim:h100"));
    let region = memfd(1 << 20);
    assert_eq!(c.attach(&region, 1 << 20), Ok(Reply::Done));
    let data: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    pwrite(&region, 4096, &data);
    let b = c.alloc(data.len() as u64 + 100);
    let b2 = c.alloc(data.len() as u64);
    let n = data.len() as u64;
    c.ok(Request::CopyToDevice { dst: slice(b, 100), shm_offset: 4096, bytes: n, stream: StreamId(0) });
    let k = c.load(KERNELS);
    assert_eq!(k.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["scale", "boom", "idle"]);
    c.launch_ok(launch(k[0].kernel, 64, 20_000, vec![Arg::Buffer(slice(b, 100)), Arg::U32(n as u32)]));
    c.ok(Request::CopyDevice { src: slice(b, 100), dst: slice(b2, 0), bytes: n, stream: StreamId(0) });
    c.ok(Request::SyncStream(StreamId(0)));
    c.ok(Request::CopyToHost { src: slice(b2, 0), shm_offset: 500_000, bytes: n, stream: StreamId(0) });
    assert!(pread(&region, 500_000, data.len()) == data, "the bytes came back changed");
    let s = c.status();
    assert_eq!(s.clients.len(), 1);
    assert_eq!((s.clients[0].kernels_done, s.clients[0].memory_used), (1, 2 * n + 100));
    assert_eq!(c.call(Request::Goodbye), Ok(Reply::Done));
}

#[test]
fn a_refused_kernel_names_its_line_and_bad_requests_say_why() {
    let d = Daemon::start(None);
    let (mut c, _) = Client::hello(&d, "checks", 0);
    let e = c.call(Request::LoadModule {
        name: "grid.cu".into(),
        source: "__global__ void k() {\n\n  cooperative_groups::this_grid().sync();\n}\n".into(),
        options: vec![],
    });
    assert!(matches!(e, Err(ErrorReply { kind: ErrorKind::Transform { line: 3 }, .. })), "{e:?}");
    let b = c.alloc(1024);
    let e = c.call(Request::Memset { dst: slice(b, 1000), value: 1, bytes: 25, stream: StreamId(0) }).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfRange);
    let e = c.call(Request::Free(BufferId(9999))).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoSuchHandle);
    let k = c.load(KERNELS);
    let e = c.call(launch(k[0].kernel, 0, 1, vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Invalid);
    let e = c.call(launch(k[0].kernel, 1, 1, vec![Arg::Buffer(slice(b, 1024)), Arg::U32(1)])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutOfRange);
    let e = c.call(Request::SetPriority(11)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotPermitted);
    // Another client's handle is unknown here.
    let (mut other, _) = Client::hello(&d, "other", 0);
    let e = other.call(Request::Free(b)).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoSuchHandle);
}

#[test]
fn over_quota_allocations_are_refused_with_numbers_and_touch_nothing() {
    let uid = own_uid();
    let d = Daemon::start(Some(&format!("[[allow]]\nuid = {uid}\nmemory = \"1 MiB\"\nqueued_ops = 4\n")));
    let (mut c, w) = Client::hello(&d, "quota", 0);
    assert_eq!(w.limits.memory_bytes, 1 << 20);
    let _a = c.alloc(600 << 10);
    let e = c.call(Request::Alloc { bytes: 500 << 10 }).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Quota);
    for n in ["512000", "1126400", "1048576", "614400"] {
        assert!(e.message.contains(n), "`{}` lacks {n}", e.message);
    }
    let s = c.status();
    assert_eq!(s.clients[0].memory_used, 600 << 10);
    assert_eq!(s.memory_used, 600 << 10);
    // queued_ops = 4: a fifth operation in flight is refused.
    let k = c.load(KERNELS);
    for _ in 0..4 {
        c.launch_ok(launch(k[IDLE].kernel, 1, 50_000_000, vec![]));
    }
    let e = c.call(launch(k[IDLE].kernel, 1, 1, vec![])).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Quota);
}

#[test]
fn a_uid_the_config_excludes_is_not_permitted() {
    let other = other_known_uid();
    let d = Daemon::start(Some(&format!("[[allow]]\nuid = {other}\n")));
    let mut c = Client::connect(&d);
    match c.next_frame() {
        Some(ServerFrame::Reply { result: Err(e), .. }) => {
            assert_eq!(e.kind, ErrorKind::NotPermitted);
            assert!(e.message.contains(&format!("uid {}", own_uid())), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    assert!(c.next_frame().is_none(), "the connection is closed");
}

#[test]
fn thousands_of_bad_clients_get_error_frames_and_a_good_one_still_works() {
    let mut d = Daemon::start(None);
    let bad: [&[u8]; 3] = [&[0, 0, 0, 0], &[0xff, 0xff, 0xff, 0xff], &[3, 0, 0, 0, 0xee, 0xee, 0xee]];
    let status = encode_frame(&ClientFrame { id: 5, request: Request::Status }).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let socket = d.socket.clone();
            let status = status.clone();
            std::thread::spawn(move || {
                for i in 0..750 {
                    let mut c = Client::connect_to(&socket);
                    let bytes: &[u8] = match (i + t) % 4 {
                        3 => &status, // a request before Hello
                        n => bad[n],
                    };
                    use std::io::Write;
                    c.sock.write_all(bytes).unwrap();
                    match c.next_frame() {
                        Some(ServerFrame::Reply { result: Err(e), .. }) => {
                            assert!(matches!(e.kind, ErrorKind::BadFrame | ErrorKind::Protocol), "{e:?}")
                        }
                        other => panic!("bad client {i} got {other:?}"),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(d.alive(), "the daemon survived");
    let (mut c, _) = Client::hello(&d, "good", 0);
    let b = c.alloc(4096);
    c.ok(Request::Memset { dst: slice(b, 0), value: 3, bytes: 4096, stream: StreamId(0) });
    c.ok(Request::SyncStream(StreamId(0)));
    assert_eq!(c.status().clients.len(), 1, "the bad clients are gone");
    assert!(d.stop().success(), "SIGTERM stops it cleanly");
    assert!(!d.socket.exists(), "the socket file is removed");
}

#[test]
fn a_client_gone_mid_kernel_frees_its_memory_and_sms_for_others() {
    let d = Daemon::start(None);
    let (mut a, _) = Client::hello(&d, "leaver", 0);
    let (mut b, _) = Client::hello(&d, "stayer", 0);
    let baseline = b.status().memory_used;
    let _buf = a.alloc(64 << 20);
    let ka = a.load(KERNELS);
    // 132 SMs × 16 resident blocks of 128 threads: 100 rounds of 20 ms = 2 s alone.
    a.launch_ok(launch(ka[IDLE].kernel, 132 * 16 * 100, 20_000_000, vec![]));
    std::thread::sleep(Duration::from_millis(100));
    let s = b.status();
    let row = s.clients.iter().find(|c| c.name == "leaver").unwrap();
    assert!(row.sms_held > 0 && row.memory_used == 64 << 20, "{row:?}");
    drop(a);
    let kb = b.load(KERNELS);
    let t0 = Instant::now();
    b.launch_ok(launch(kb[IDLE].kernel, 132, 1_000_000, vec![]));
    b.ok(Request::SyncStream(StreamId(0)));
    assert!(t0.elapsed() < Duration::from_millis(1500), "the other client waited for the gone one's kernel");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = b.status();
        if s.memory_used == baseline && s.clients.len() == 1 && s.clients[0].sms_held == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "memory or SMs still held: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_trapping_kernel_loses_the_context_and_both_clients_go_on() {
    trap(IN_PROCESS);
}

#[test]
fn a_trap_in_the_device_process_restarts_it_and_both_clients_go_on() {
    let d = trap(CHILD);
    assert_eq!(d.children().len(), 1, "one device process, the fresh one");
}

/// A trapping kernel and a bystander; returns the daemon, still serving.
fn trap(args: &[&str]) -> Daemon {
    let d = Daemon::start_with(None, args);
    let first_device = (args == CHILD).then(|| d.device_process());
    let (mut good, _) = Client::hello(&d, "bystander", 0);
    let (mut bad, _) = Client::hello(&d, "culprit", 5);
    let kg = good.load(KERNELS);
    let kb = bad.load(KERNELS);
    let gbuf = good.alloc(4096);
    // The bystander's kernel runs on a few SMs for a second.
    good.launch_ok(launch(kg[0].kernel, 8, 1_000_000_000, vec![Arg::Buffer(slice(gbuf, 0)), Arg::U32(1)]));
    let gsync = good.send(Request::SyncStream(StreamId(0)));
    std::thread::sleep(Duration::from_millis(50));
    let bbuf = bad.alloc(64);
    // Its first block ends (and the context breaks) 200 ms after launch: time for the sync to queue behind it.
    bad.launch_ok(launch(kb[1].kernel, 4, 200_000_000, vec![Arg::Buffer(slice(bbuf, 0))]));
    let e = bad.call(Request::SyncStream(StreamId(0))).unwrap_err();
    assert_eq!(e.kind, ErrorKind::KernelFault, "{e:?}");
    match bad.notices.as_slice() {
        [Notice::ContextLost { caused_by_you: true, what, lost }] => {
            assert!(what.contains("boom"), "{what}");
            assert_eq!(lost.launches, ["boom"]);
        }
        other => panic!("{other:?}"),
    }
    let e = good.wait(gsync).unwrap_err();
    assert_eq!(e.kind, ErrorKind::ContextLost);
    assert!(e.message.contains("scale"), "{}", e.message);
    match good.notices.as_slice() {
        [Notice::ContextLost { caused_by_you: false, lost, .. }] => {
            assert_eq!(lost.launches, ["scale"]);
            assert_eq!(lost.buffers, [gbuf]);
        }
        other => panic!("{other:?}"),
    }
    // Both go on: same handles, a fresh context.
    good.launch_ok(launch(kg[0].kernel, 8, 1_000, vec![Arg::Buffer(slice(gbuf, 0)), Arg::U32(1)]));
    good.ok(Request::SyncStream(StreamId(0)));
    bad.launch_ok(launch(kb[IDLE].kernel, 8, 1_000, vec![]));
    bad.ok(Request::SyncStream(StreamId(0)));
    assert_eq!(good.status().context_rebuilds, 1);
    if let Some(old) = first_device {
        assert_ne!(d.device_process(), old, "the faulted device process was replaced");
    }
    d
}

/// The H100's race (remote.rs's module doc): under `spatial-even` a client
/// that leaves makes the engine re-split its SMs, growing the others'
/// launches, while launches end on the device. With the device in a child,
/// a `Grow` and a launch's end must not cross: the daemon keeps serving.
#[test]
fn spatial_even_in_a_device_process_grows_launches_while_others_end_and_keeps_serving() {
    let mut d = Daemon::start_with(None, &["--device-process", "--policy", "spatial-even"]);
    for round in 0..3u64 {
        std::thread::scope(|scope| {
            for i in 0..4u64 {
                let d = &d;
                scope.spawn(move || {
                    let (mut c, _) = Client::hello(d, &format!("r{round}c{i}"), 0);
                    let k = c.load(KERNELS);
                    // Staggered: client i runs 3 + 3i kernels of uneven lengths, then leaves
                    // while the others still run; a full wave of blocks on all 132 SMs each.
                    for j in 0..3 + 3 * i {
                        let block_ns = 100_000 * (1 + (i * 7 + j * 3 + round) % 5);
                        c.launch_ok(launch(k[IDLE].kernel, 132 * 16, block_ns, vec![]));
                        c.ok(Request::SyncStream(StreamId(0)));
                    }
                });
            }
        });
    }
    let (mut observer, _) = Client::hello(&d, "observer", 0);
    // A worker's close reaches the core from its own connection's thread, in
    // no order with the observer's requests: wait (up to 10 s) until the
    // last one's has, instead of asking once.
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        let s = observer.status();
        if s.clients.len() == 1 || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(s.clients.len(), 1, "every worker is gone: {s:?}");
    assert!(s.clients.iter().all(|c| c.sms_held == 0), "{s:?}");
    assert_eq!(s.context_rebuilds, 0, "the device process never failed");
    assert!(d.stop().success(), "the daemon stopped cleanly, not on an engine error");
}

#[test]
fn a_killed_device_process_is_restarted_and_its_clients_go_on() {
    let d = Daemon::start_with(None, CHILD);
    // Urgent (priority above 0): the device process is asked to poll longer,
    // and the fresh one is asked again after the restart.
    let (mut c, _) = Client::hello(&d, "survivor", 1);
    let region = memfd(1 << 20);
    assert_eq!(c.attach(&region, 1 << 20), Ok(Reply::Done));
    let data: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let n = data.len() as u64;
    pwrite(&region, 0, &data);
    let b = c.alloc(n);
    let b2 = c.alloc(n);
    c.ok(Request::CopyToDevice { dst: slice(b, 0), shm_offset: 0, bytes: n, stream: StreamId(0) });
    let k = c.load(KERNELS);
    // Work on the device and a sync queued behind it when the device process dies.
    c.launch_ok(launch(k[0].kernel, 8, 2_000_000_000, vec![Arg::Buffer(slice(b, 0)), Arg::U32(n as u32)]));
    let sync = c.send(Request::SyncStream(StreamId(0)));
    std::thread::sleep(Duration::from_millis(100));
    let old = d.device_process();
    assert_eq!(unsafe { libc::kill(old, libc::SIGKILL) }, 0);

    let e = c.wait(sync).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::KernelFault | ErrorKind::ContextLost), "{e:?}");
    assert!(e.message.contains("scale"), "{}", e.message);
    match c.notices.as_slice() {
        [Notice::ContextLost { what, lost, .. }] => {
            assert!(what.contains("device process") && what.contains("signal 9"), "{what}");
            assert_eq!(lost.launches, ["scale"]);
            assert_eq!(lost.buffers, [b, b2]);
        }
        other => panic!("{other:?}"),
    }
    let fresh = d.device_process();
    assert_ne!(fresh, old, "a fresh device process serves");

    // Same handles, a fresh device: allocate, copy and launch again; the bytes round-trip.
    let b3 = c.alloc(4096);
    c.ok(Request::CopyToDevice { dst: slice(b, 0), shm_offset: 0, bytes: n, stream: StreamId(0) });
    c.launch_ok(launch(k[0].kernel, 8, 1_000, vec![Arg::Buffer(slice(b, 0)), Arg::U32(n as u32)]));
    c.ok(Request::CopyDevice { src: slice(b, 0), dst: slice(b2, 0), bytes: n, stream: StreamId(0) });
    c.ok(Request::Memset { dst: slice(b3, 0), value: 7, bytes: 4096, stream: StreamId(0) });
    c.ok(Request::SyncStream(StreamId(0)));
    c.ok(Request::CopyToHost { src: slice(b2, 0), shm_offset: 200_000, bytes: n, stream: StreamId(0) });
    assert!(pread(&region, 200_000, data.len()) == data, "the bytes came back changed");
    c.ok(Request::CopyToHost { src: slice(b3, 0), shm_offset: 400_000, bytes: 4096, stream: StreamId(0) });
    assert!(pread(&region, 400_000, 4096).iter().all(|&x| x == 7));
    let s = c.status();
    assert_eq!((s.context_rebuilds, s.memory_used), (1, 2 * n + 4096));
    assert_eq!(s.clients[0].kernels_done, 1);
}

#[test]
fn a_gpu_that_cannot_be_opened_fails_start_up_fast_with_the_reason() {
    // cuda:0 where there is no GPU (CI); a device that does not exist where there is one.
    let spec = if gpumux_cuda::cuda_available().is_ok() { "cuda:99" } else { "cuda:0" };
    let dir = tempfile::Builder::new().prefix("gpumuxd-nogpu-").tempdir().expect("a temporary directory");
    let t0 = Instant::now();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumuxd"))
        .args(["--device", spec, "--socket"])
        .arg(dir.path().join("g.sock"))
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30), "start-up took {:?}", t0.elapsed());
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.starts_with("gpumuxd: ") && last.contains(spec), "{stderr}");
}

/// A config that cannot be read or a socket that cannot be made stops
/// start-up with the reason, said once (the cause was printed twice: in the
/// error's message and again as its source).
#[test]
fn a_config_or_socket_that_cannot_be_used_stops_start_up_with_the_reason_once() {
    let dir = tempfile::Builder::new().prefix("gpumuxd-bad-start-").tempdir().expect("a temporary directory");
    let missing = dir.path().join("missing.toml");
    let no_dir = dir.path().join("not-a-dir");
    std::fs::write(&no_dir, "a file, so no socket can be made under it").expect("written");
    let cases = [
        (vec!["--config".into(), missing.display().to_string()], "cannot read the config"),
        (vec!["--socket".into(), no_dir.join("g.sock").display().to_string()], "cannot listen on"),
    ];
    for (args, what) in cases {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumuxd"))
            .args(["--device", "sim:h100"])
            .args(&args)
            .env("RUST_LOG", "off")
            .output()
            .expect("gpumuxd runs");
        assert!(!out.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or_default();
        assert!(last.starts_with("gpumuxd: ") && last.contains(what), "{args:?}: {stderr}");
        let cause = last.rsplit(": ").next().unwrap_or_default();
        assert!(cause.contains("os error"), "{args:?}: no system error named: {last}");
        assert_eq!(last.matches(cause).count(), 1, "{args:?}: the cause is said more than once: {last}");
    }
}

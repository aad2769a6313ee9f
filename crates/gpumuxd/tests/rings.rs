//! The conversation over shared-memory rings (`UseRings`): the client
//! library's ringed connections beside socket ones, and what the daemon does
//! with rings offered wrongly or broken by a client.

mod common;

use common::Daemon;
use gpumux_client::{Arg, Client, ConnectOptions, LaunchConfig, StreamId};
use gpumux_proto::{decode_frame_body, encode_frame, ClientFrame, ErrorKind, FrameReader, Reply, Request, ServerFrame};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const SOURCE: &str = "extern \"C\" __global__ void k(float* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1.0f; }";

/// Copies in and out around many launches and syncs, on two streams; the
/// bytes must come back as they went (the simulated device moves real bytes).
fn work(client: &Client, seed: u8) {
    let module = client.load_module("m", SOURCE, &[]).unwrap();
    let k = module.kernel("k").unwrap();
    let buf = client.alloc(1 << 20).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i as u8).wrapping_mul(seed).wrapping_add(seed)).collect();
    let stream = client.create_stream().unwrap();
    client.copy_to_device(&buf, 0, &data, stream).unwrap();
    let args = [Arg::buffer(&buf), Arg::bytes(256i32.to_le_bytes())];
    for i in 0..300 {
        let s = if i % 2 == 0 { stream } else { StreamId::DEFAULT };
        client.launch(&k, &LaunchConfig::new([2, 1, 1], [128, 1, 1]).stream(s).block_time_ns(2_000), &args).unwrap();
        if i % 10 == 0 {
            client.sync(s).unwrap();
        }
    }
    client.sync(StreamId::DEFAULT).unwrap();
    let mut back = vec![0u8; data.len()];
    client.copy_to_host(&buf, 0, &mut back, stream).unwrap();
    assert!(back == data, "the bytes came back as they went");
}

fn both_kinds_of_client_share_a_daemon(args: &[&str]) {
    let d = Daemon::start_with(None, args);
    let options =
        |name: &str, rings| ConnectOptions { socket: Some(d.socket.clone()), rings, ..ConnectOptions::named(name) };
    let ringed = Client::connect(options("ringed", true)).unwrap();
    let plain = Client::connect(options("plain", false)).unwrap();
    assert!(ringed.uses_rings(), "the daemon accepts the rings");
    assert!(!plain.uses_rings(), "a client may keep to the socket");
    std::thread::scope(|s| {
        s.spawn(|| work(&ringed, 3));
        s.spawn(|| work(&plain, 7));
    });
    // Idle for longer than every poll window: both sides sleep, and the
    // next request must wake the daemon's reader (doorbell) and the reply
    // the client's.
    std::thread::sleep(Duration::from_millis(30));
    let status = ringed.status().unwrap();
    assert_eq!(status.clients.len(), 2);
    std::thread::sleep(Duration::from_millis(30));
    work(&ringed, 11);
    ringed.close().unwrap();
    plain.close().unwrap();
}

#[test]
fn a_ringed_and_a_socket_client_share_the_daemon_and_lose_nothing() {
    both_kinds_of_client_share_a_daemon(&[]);
}

#[test]
fn a_ringed_client_and_a_device_process_with_rings_of_its_own() {
    both_kinds_of_client_share_a_daemon(&["--device-process"]);
}

fn refused(frame: Option<ServerFrame>, id: u64, kind: ErrorKind, words: &str) {
    match frame {
        Some(ServerFrame::Reply { id: got, result: Err(e) }) if got == id => {
            assert_eq!(e.kind, kind, "{e:?}");
            assert!(e.message.contains(words), "`{}` should say `{words}`", e.message);
        }
        other => panic!("expected request {id} refused ({words}), got {other:?}"),
    }
}

#[test]
fn rings_offered_wrongly_are_refused_on_the_socket_and_the_conversation_goes_on() {
    let d = Daemon::start(None);
    let (mut raw, _) = common::Client::hello(&d, "raw", 0);
    // No descriptor.
    let id = raw.send_fd(Request::UseRings { capacity: 4096 }, None);
    refused(raw.next_frame(), id, ErrorKind::Invalid, "without its memfd");
    // A file that could shrink under the daemon.
    let id = raw.send_fd(Request::UseRings { capacity: 4096 }, Some(&common::memfd(4096 + 2 * 4096)));
    refused(raw.next_frame(), id, ErrorKind::Invalid, "refused");
    // A capacity that is not a power of two.
    let pair = gpumux_ring::RingPair::create(4096).unwrap();
    let fd = pair.fd().try_clone_to_owned().unwrap();
    let id = raw.send_fd(Request::UseRings { capacity: 5000 }, Some(&fd));
    refused(raw.next_frame(), id, ErrorKind::Invalid, "power of two");
    // Still on the socket.
    assert!(matches!(raw.call(Request::Status), Ok(Reply::Status(_))));
}

/// Reads the next frame the daemon writes into our ring (polling it).
fn next_from_ring(rx: &mut gpumux_ring::RingReceiver, frames: &mut FrameReader) -> ServerFrame {
    let start = Instant::now();
    let mut inbox = Vec::new();
    loop {
        if let Some(body) = frames.next_body().unwrap() {
            return decode_frame_body(&body).unwrap();
        }
        inbox.clear();
        rx.read_into(&mut inbox, usize::MAX).unwrap();
        frames.extend(&inbox);
        assert!(start.elapsed() < Duration::from_secs(20), "no frame in the ring");
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[test]
fn a_second_offer_and_a_broken_ring_end_the_client_with_a_protocol_error() {
    let d = Daemon::start(None);
    let (mut raw, _) = common::Client::hello(&d, "raw", 0);
    let pair = gpumux_ring::RingPair::create(4096).unwrap();
    let fd = pair.fd().try_clone_to_owned().unwrap();
    // Our own second mapping of the file, to break it as a hostile client would.
    // SAFETY: a shared mapping of the whole (sealed) file, unmapped below.
    let len = 4096 + 2 * 4096;
    let map = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
    };
    assert_ne!(map, libc::MAP_FAILED);
    assert_eq!(raw.send_fd(Request::UseRings { capacity: 4096 }, Some(&fd)), 2);
    let (mut tx, mut rx) = pair.split();
    let mut frames = FrameReader::new();
    assert!(matches!(next_from_ring(&mut rx, &mut frames), ServerFrame::Reply { id: 2, result: Ok(Reply::Done) }));
    // A request through the ring works (the daemon's reader may sleep by
    // now: ring its doorbell as the protocol says); a second offer is refused.
    let put = |tx: &mut gpumux_ring::RingSender, request: Request, id: u64| {
        tx.write(&encode_frame(&ClientFrame { id, request }).unwrap()).unwrap();
        if tx.take_sleeper() {
            common::send_fd(&raw.sock, &[0], None);
        }
    };
    put(&mut tx, Request::Status, 3);
    assert!(matches!(next_from_ring(&mut rx, &mut frames), ServerFrame::Reply { id: 3, result: Ok(Reply::Status(_)) }));
    common::send_fd(&raw.sock, &[1], Some(&fd));
    put(&mut tx, Request::UseRings { capacity: 4096 }, 4);
    refused(Some(next_from_ring(&mut rx, &mut frames)), 4, ErrorKind::Protocol, "second UseRings");
    // Claim more bytes in the daemon's incoming ring (ring 0: ours to write) than it holds.
    // SAFETY: ring 0's tail index lies at byte 256 of the header page (gpumux-ring's layout).
    unsafe { std::ptr::write_volatile(map.cast::<u8>().add(256).cast::<u64>(), 1 << 40) };
    common::send_fd(&raw.sock, &[0], None);
    refused(Some(next_from_ring(&mut rx, &mut frames)), 0, ErrorKind::Protocol, "corrupt");
    // And the connection ends: an end of stream, or a reset where the daemon
    // closed its end with our last doorbell still unread (a race of timing).
    let mut buf = [0u8; 64];
    let start = Instant::now();
    loop {
        match (&raw.sock).read(&mut buf) {
            Ok(0) => break,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Ok(_) => assert!(start.elapsed() < Duration::from_secs(20)),
            Err(e) => panic!("the daemon should close the connection: {e}"),
        }
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map, len) };
    // The daemon serves others still.
    let (mut other, _) = common::Client::hello(&d, "raw", 0);
    assert!(matches!(other.call(Request::Status), Ok(Reply::Status(_))));
}

/// Replies the client does not read fill its ring: the core then hands them
/// to the connection's writer, which waits for room; once the client reads,
/// every reply comes, in the order of the requests.
#[test]
fn replies_that_overflow_a_small_ring_all_come_in_order_once_the_client_reads() {
    let d = Daemon::start(None);
    let (mut raw, _) = common::Client::hello(&d, "raw", 0);
    let pair = gpumux_ring::RingPair::create(4096).unwrap();
    assert_eq!(raw.send_fd(Request::UseRings { capacity: 4096 }, Some(&pair.fd().try_clone_to_owned().unwrap())), 2);
    let (mut tx, mut rx) = pair.split();
    let mut frames = FrameReader::new();
    assert!(matches!(next_from_ring(&mut rx, &mut frames), ServerFrame::Reply { id: 2, result: Ok(Reply::Done) }));
    const N: u64 = 200;
    for id in 3..3 + N {
        let frame = encode_frame(&ClientFrame { id, request: Request::Status }).unwrap();
        let mut sent = 0;
        while sent < frame.len() {
            sent += tx.write(&frame[sent..]).unwrap();
            if tx.take_sleeper() {
                common::send_fd(&raw.sock, &[0], None);
            }
        }
    }
    // Far more reply bytes than 4 KiB are due; let them pile up unread.
    std::thread::sleep(Duration::from_millis(200));
    let ids: Vec<u64> = (0..N)
        .map(|_| match next_from_ring(&mut rx, &mut frames) {
            ServerFrame::Reply { id, result: Ok(Reply::Status(_)) } => id,
            other => panic!("expected a Status reply, got {other:?}"),
        })
        .collect();
    assert_eq!(ids, (3..3 + N).collect::<Vec<_>>(), "every reply, in order");
}

/// A ringed client whose threads wait at once: each waiting call reads the
/// reply ring itself while it polls and routes whatever it finds, its own
/// reply or another thread's (gpumux-client's `reply_ring`). Every thread must
/// get its own replies: its own buffer's bytes back after its own launches
/// (each thread a different count of them), and the daemon's status between.
#[test]
fn threads_of_one_ringed_client_each_get_their_own_replies() {
    let d = Daemon::start(None);
    let client =
        Client::connect(ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named("threads") }).unwrap();
    assert!(client.uses_rings(), "the daemon accepts the rings");
    let k = client.load_module("m", SOURCE, &[]).unwrap().kernel("k").unwrap();
    const N: usize = 256;
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let (client, k) = (&client, &k);
            s.spawn(move || {
                let stream = client.create_stream().unwrap();
                let buf = client.alloc((N * 4) as u64).unwrap();
                let start: Vec<f32> = (0..N).map(|i| (t * 1000 + i as u32) as f32).collect();
                let bytes: Vec<u8> = start.iter().flat_map(|v| v.to_le_bytes()).collect();
                client.copy_to_device(&buf, 0, &bytes, stream).unwrap();
                let args = [Arg::buffer(&buf), Arg::bytes((N as i32).to_le_bytes())];
                // A different count per thread: a reply routed to the wrong thread shows.
                let rounds = 20 + 7 * t as usize;
                for round in 0..rounds {
                    let config = LaunchConfig::new([2, 1, 1], [128, 1, 1]).stream(stream).block_time_ns(1_000);
                    client.launch(k, &config, &args).unwrap();
                    client.sync(stream).unwrap();
                    if round % 5 == 0 {
                        assert!(!client.status().unwrap().clients.is_empty(), "thread {t}: the status names us");
                    }
                }
                let mut back = vec![0u8; bytes.len()];
                client.copy_to_host(&buf, 0, &mut back, stream).unwrap();
                // The simulated device's kernels take time but compute nothing.
                let added = if client.is_simulated() { 0.0 } else { rounds as f32 };
                for (i, word) in back.chunks_exact(4).enumerate() {
                    let got = f32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                    assert_eq!(
                        got,
                        start[i] + added,
                        "thread {t}, element {i}: its own buffer after {rounds} launches"
                    );
                }
            });
        }
    });
    client.close().unwrap();
}

/// A call whose reply comes long after its poll window: the call stops
/// reading the ring, wakes the client's reader thread and sleeps; the reader
/// must read the reply and hand it on (the fallback of `reply_ring`).
#[test]
fn a_reply_that_outlasts_the_callers_poll_still_reaches_it() {
    let d = Daemon::start(None);
    let client =
        Client::connect(ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named("slow") }).unwrap();
    assert!(client.uses_rings(), "the daemon accepts the rings");
    let k = client.load_module("m", SOURCE, &[]).unwrap().kernel("k").unwrap();
    let buf = client.alloc(4 * 256).unwrap();
    let args = [Arg::buffer(&buf), Arg::bytes(256i32.to_le_bytes())];
    for _ in 0..3 {
        // Idle past every window first, so the reader thread sleeps on the socket too.
        std::thread::sleep(Duration::from_millis(30));
        let started = Instant::now();
        // Two kernels of 100 ms of simulated blocks: far beyond the 100 µs a
        // call polls. Two, because the simulated device may start the first
        // at the time it was last advanced, before the idle (up to 30 ms
        // early, seen on 2adeb40 with sockets too); the second starts when
        // the first ends, so the pair ends at least 100 ms from now.
        let long = LaunchConfig::new([1, 1, 1], [32, 1, 1]).block_time_ns(100_000_000);
        client.launch(&k, &long, &args).unwrap();
        client.launch(&k, &long, &args).unwrap();
        client.sync(StreamId::DEFAULT).unwrap();
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(100), "the sync waited for the kernels: {took:?}");
        assert!(took < Duration::from_secs(10), "the sync's reply reached the sleeping caller: {took:?}");
    }
    client.close().unwrap();
}

/// A ringed client's call whose reply never comes, because the daemon died
/// while the call waited, gets an error, not a hang.
#[test]
fn a_call_waiting_when_the_daemon_dies_gets_an_error() {
    let mut d = Daemon::start(None);
    let client =
        Client::connect(ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named("orphan") }).unwrap();
    assert!(client.uses_rings(), "the daemon accepts the rings");
    let k = client.load_module("m", SOURCE, &[]).unwrap().kernel("k").unwrap();
    let buf = client.alloc(4 * 256).unwrap();
    let args = [Arg::buffer(&buf), Arg::bytes(256i32.to_le_bytes())];
    // 60 s of simulated blocks: the sync's reply would come long after the test.
    client.launch(&k, &LaunchConfig::new([1, 1, 1], [32, 1, 1]).block_time_ns(60_000_000_000), &args).unwrap();
    let pid = d.child.id() as i32;
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: signals our own child process.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let started = Instant::now();
    let synced = client.sync(StreamId::DEFAULT);
    let took = started.elapsed();
    killer.join().unwrap();
    let _ = d.child.wait();
    let e = synced.expect_err("the daemon died before the kernel ended");
    assert!(matches!(e, gpumux_client::ClientError::DaemonGone), "the daemon's end is reported: {e}");
    assert!(took < Duration::from_secs(10), "the error came soon after the daemon died: {took:?}");
}

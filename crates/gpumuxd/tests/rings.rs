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

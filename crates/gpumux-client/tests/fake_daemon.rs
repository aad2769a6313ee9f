//! The client library against a fake daemon (tests/support): handshake,
//! the shared region, chunked double-buffered copies, errors.

mod support;

use gpumux_client::{Client, ClientError, ConnectOptions, ErrorKind, StreamId};
use gpumux_proto::{BufferId, BufferSlice, Request};
use std::time::{Duration, Instant};
use support::{Behaviour, FakeDaemon};

fn options(fake: &FakeDaemon) -> ConnectOptions {
    ConnectOptions { socket: Some(fake.socket.clone()), ..ConnectOptions::named("test") }
}

#[test]
fn handshake_attaches_a_sealed_region_clamped_to_the_limit() {
    let fake = FakeDaemon::start(Behaviour::default());
    let client = Client::connect(options(&fake)).unwrap();
    assert_eq!(client.welcome().device, "sim:h100");
    assert!(client.is_simulated());
    assert_eq!(client.shm_bytes(), 4096, "8 MiB asked, the daemon allows 4096");
    drop(client);
    let log = fake.finish();
    assert!(matches!(&log.requests[0], Request::Hello { name, .. } if name == "test"));
    assert_eq!(log.requests[1], Request::AttachShm { bytes: 4096 });
    assert_eq!(log.requests.last(), Some(&Request::Goodbye), "drop says goodbye");
    assert!(log.fd_came_with_attach, "the memfd travels with the AttachShm frame");
    let want = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    assert_eq!(log.seals & want, want, "sealed against shrink and grow, seals sealed");
    assert_eq!(log.shm_size, 4096);
}

#[test]
fn a_copy_larger_than_the_region_round_trips_in_double_buffered_chunks() {
    let fake = FakeDaemon::start(Behaviour::default());
    let client = Client::connect(options(&fake)).unwrap();
    let data: Vec<u8> = (0..10_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    let buf = client.alloc(10_100).unwrap();
    client.copy_to_device(&buf, 100, &data, StreamId::DEFAULT).unwrap();
    let mut back = vec![0u8; data.len()];
    client.copy_to_host(&buf, 100, &mut back, StreamId::DEFAULT).unwrap();
    assert!(back == data, "data round-trips bitwise through 5 chunks each way");
    client.close().unwrap();
    let log = fake.finish();
    let to_device: Vec<_> = log
        .requests
        .iter()
        .filter_map(|r| match r {
            Request::CopyToDevice { dst, shm_offset, bytes, .. } => Some((*dst, *shm_offset, *bytes)),
            _ => None,
        })
        .collect();
    let at = |offset| BufferSlice { buffer: BufferId(1), offset };
    assert_eq!(
        to_device,
        vec![
            (at(100), 0, 2048),
            (at(2148), 2048, 2048),
            (at(4196), 0, 2048),
            (at(6244), 2048, 2048),
            (at(8292), 0, 1808)
        ]
    );
    let to_host = log.requests.iter().filter(|r| matches!(r, Request::CopyToHost { .. })).count();
    assert_eq!(to_host, 5);
    assert_eq!(log.max_outstanding, 2, "two chunks in flight, never more");
}

#[test]
fn a_small_copy_is_one_request() {
    let fake = FakeDaemon::start(Behaviour::default());
    let client = Client::connect(options(&fake)).unwrap();
    let buf = client.alloc(16).unwrap();
    client.copy_to_device(&buf, 0, &[7; 16], StreamId::DEFAULT).unwrap();
    drop(client);
    let log = fake.finish();
    assert_eq!(log.requests.iter().filter(|r| matches!(r, Request::CopyToDevice { .. })).count(), 1);
}

#[test]
fn daemon_errors_carry_their_kind_and_message() {
    let fake = FakeDaemon::start(Behaviour::default());
    let client = Client::connect(options(&fake)).unwrap();
    let e = client.alloc(0).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::Invalid));
    assert_eq!(e.to_string(), "Alloc: an allocation of 0 bytes; ask for at least 1");
    assert!(!e.is_fatal());
    let buf = client.alloc(8).unwrap();
    let past = client.copy_to_device(&buf, 4, &[0; 8], StreamId::DEFAULT).unwrap_err();
    assert!(matches!(past, ClientError::Invalid(_)), "checked before sending: {past}");
}

#[test]
fn a_closed_connection_fails_calls_with_daemon_gone() {
    let fake = FakeDaemon::start(Behaviour { close_after_welcome: true, ..Behaviour::default() });
    let e = Client::connect(options(&fake)).unwrap_err();
    assert!(matches!(e, ClientError::DaemonGone), "AttachShm after the close: {e}");
    assert!(e.is_fatal());
}

/// Issue 36, case 5: what the daemon said as it closed is what every call
/// reports, whether the close came before or after the call's write. On
/// 717b546 the id-0 frame was dropped and calls failed with `DaemonGone`.
#[test]
fn a_daemon_that_says_why_it_closes_is_heard() {
    for _ in 0..20 {
        let fake = FakeDaemon::start(Behaviour { farewell_after_welcome: true, ..Behaviour::default() });
        let e = Client::connect(options(&fake)).unwrap_err();
        assert!(matches!(&e, ClientError::Closed { .. }), "AttachShm after the farewell: {e}");
        assert_eq!(e.to_string(), "gpumuxd closed the connection: the fake daemon ends this connection");
        assert_eq!(e.kind(), Some(&ErrorKind::Protocol));
        assert!(e.is_fatal());
    }
}

#[test]
fn no_shared_region_means_host_copies_say_why() {
    let fake = FakeDaemon::start(Behaviour::default());
    let client = Client::connect(ConnectOptions { shm_bytes: 0, ..options(&fake) }).unwrap();
    let buf = client.alloc(8).unwrap();
    let e = client.copy_to_device(&buf, 0, &[1; 8], StreamId::DEFAULT).unwrap_err().to_string();
    assert!(e.contains("needs a shared region"), "{e}");
    drop(client);
    assert!(!fake.finish().requests.iter().any(|r| matches!(r, Request::AttachShm { .. })));
}

#[test]
fn no_daemon_says_how_to_start_one() {
    let socket = std::env::temp_dir().join("gpumux-client-test-nobody-here.sock");
    let wait = Duration::from_millis(300);
    let t = Instant::now();
    let options = ConnectOptions { socket: Some(socket.clone()), wait_for_daemon: wait, ..ConnectOptions::default() };
    let e = Client::connect(options.clone()).unwrap_err();
    assert!(t.elapsed() >= wait, "it waits for a daemon starting: {:?}", t.elapsed());
    assert_eq!(
        e.to_string(),
        format!(
            "no daemon listens on {} (waited 300ms for one to start): start one with `gpumuxd` or set GPUMUX_SOCKET",
            socket.display()
        )
    );
    let options = ConnectOptions { socket: Some(socket.clone()), wait_for_daemon: Duration::ZERO, ..options };
    assert_eq!(
        Client::connect(options).unwrap_err().to_string(),
        format!("no daemon listens on {}: start one with `gpumuxd` or set GPUMUX_SOCKET", socket.display())
    );
}

/// Issue 36, case 9: a client started right after its daemon (the README's
/// `gpumuxd ... &` then `gpumux ps`) waits for the socket to appear. On
/// 717b546 it tried once and failed with "no daemon listens".
#[test]
fn connect_waits_for_a_daemon_that_starts_a_moment_later() {
    let socket = std::env::temp_dir().join(format!("gpumux-client-test-late-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket);
    let path = socket.clone();
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // Accepted, then closed without a word: the client got as far as the handshake.
        drop(listener.accept().unwrap());
    });
    let t = Instant::now();
    let e = Client::connect(ConnectOptions { socket: Some(socket.clone()), ..ConnectOptions::default() }).unwrap_err();
    late.join().unwrap();
    let _ = std::fs::remove_file(&socket);
    assert!(matches!(e, ClientError::DaemonGone), "connected, then the fake closed: {e}");
    assert!(t.elapsed() >= Duration::from_millis(300), "{:?}", t.elapsed());
}

#[test]
fn notices_are_kept_until_taken() {
    let fake = FakeDaemon::start(Behaviour::default());
    let client = Client::connect(options(&fake)).unwrap();
    assert!(client.take_notices().is_empty());
    client.sync(StreamId::DEFAULT).unwrap();
    let notices = client.take_notices();
    assert!(
        matches!(&notices[..], [gpumux_client::Notice::ContextLost { caused_by_you: false, lost, .. }] if lost.copies == 1),
        "{notices:?}"
    );
    assert!(client.take_notices().is_empty(), "taken once");
}

#[test]
fn a_wrong_reply_is_a_protocol_error_naming_both() {
    let fake = FakeDaemon::start(Behaviour::default());
    let client = Client::connect(options(&fake)).unwrap();
    let e = client.status().unwrap_err();
    assert!(e.to_string().starts_with("gpumuxd answered Status with a Done reply"), "{e}");
    assert!(e.is_fatal());
}

#[test]
fn threads_share_one_client() {
    let fake = FakeDaemon::start(Behaviour::default());
    let client = Client::connect(options(&fake)).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4u8 {
            let client = &client;
            scope.spawn(move || {
                let data: Vec<u8> = (0..6000u32).map(|i| (i as u8).wrapping_mul(t + 3)).collect();
                let buf = client.alloc(data.len() as u64).unwrap();
                client.copy_to_device(&buf, 0, &data, StreamId::DEFAULT).unwrap();
                let mut back = vec![0u8; data.len()];
                client.copy_to_host(&buf, 0, &mut back, StreamId::DEFAULT).unwrap();
                assert!(back == data, "thread {t}'s data round-trips while others copy");
            });
        }
    });
    drop(client);
    let log = fake.finish();
    assert_eq!(log.requests.iter().filter(|r| matches!(r, Request::Alloc { .. })).count(), 4);
    assert!(log.max_outstanding <= 2, "copies take turns through the region");
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

/// The requests' `AttachShm` sizes, in order.
fn attaches(log: &support::Log) -> Vec<u64> {
    log.requests
        .iter()
        .filter_map(|r| match r {
            Request::AttachShm { bytes } => Some(*bytes),
            _ => None,
        })
        .collect()
}

#[test]
fn a_region_of_four_slots_keeps_four_chunks_in_flight_and_reuses_a_slot_only_after_its_reply() {
    // The fake answers a copy only once four wait, moving its bytes then: a
    // slot rewritten (or read) before its reply would corrupt the data.
    let fake = FakeDaemon::start(Behaviour { shm_limit: 8 << 20, hold: 4, ..Behaviour::default() });
    let client = Client::connect(ConnectOptions { shm_max_bytes: 0, copy_threads: 3, ..options(&fake) }).unwrap();
    assert_eq!(client.shm_bytes(), 8 << 20);
    let n = (20 << 20) + 100;
    let data = pattern(n, 1);
    let buf = client.alloc(n as u64).unwrap();
    client.copy_to_device(&buf, 0, &data, StreamId::DEFAULT).unwrap();
    let mut back = vec![0u8; n];
    client.copy_to_host(&buf, 0, &mut back, StreamId::DEFAULT).unwrap();
    assert!(back == data, "20 MiB round-trip bitwise through four 2 MiB slots, on 3 threads");
    client.close().unwrap();
    let log = fake.finish();
    let offsets: Vec<u64> = log
        .requests
        .iter()
        .filter_map(|r| match r {
            Request::CopyToDevice { shm_offset, .. } => Some(*shm_offset),
            _ => None,
        })
        .collect();
    let slot = 2 << 20;
    assert_eq!(offsets, (0..11).map(|i| (i % 4) * slot).collect::<Vec<_>>(), "11 chunks taking the slots in turn");
    assert_eq!(log.max_outstanding, 4, "one chunk in flight per slot");
    assert_eq!(attaches(&log), vec![8 << 20], "never grown (shm_max_bytes 0)");
}

#[test]
fn a_copy_larger_than_the_region_grows_it_once_up_to_the_cap() {
    let fake = FakeDaemon::start(Behaviour { shm_limit: 1 << 20, ..Behaviour::default() });
    let options = ConnectOptions { shm_bytes: 8192, shm_max_bytes: 64 << 10, copy_threads: 1, ..options(&fake) };
    let client = Client::connect(options).unwrap();
    let buf = client.alloc(200_000).unwrap();
    let small = pattern(8192, 2);
    client.copy_to_device(&buf, 0, &small, StreamId::DEFAULT).unwrap();
    assert_eq!(client.shm_bytes(), 8192, "a copy that fits leaves the region as it is");
    let data = pattern(40_000, 3);
    client.copy_to_device(&buf, 0, &data, StreamId::DEFAULT).unwrap();
    assert_eq!(client.shm_bytes(), 64 << 10, "40,000 bytes: a region of 64 KiB");
    let big = pattern(200_000, 4);
    client.copy_to_device(&buf, 0, &big, StreamId::DEFAULT).unwrap();
    let mut back = vec![0u8; big.len()];
    client.copy_to_host(&buf, 0, &mut back, StreamId::DEFAULT).unwrap();
    assert!(back == big, "through the grown region's two halves");
    assert_eq!(client.shm_bytes(), 64 << 10, "at the cap: not grown again");
    client.close().unwrap();
    let log = fake.finish();
    assert_eq!(attaches(&log), vec![8192, 64 << 10]);
    let last: Vec<u64> = log
        .requests
        .iter()
        .filter_map(|r| match r {
            Request::CopyToHost { shm_offset, bytes, .. } => Some(shm_offset + bytes),
            _ => None,
        })
        .collect();
    assert_eq!(last.len(), 200_000usize.div_ceil(32 << 10), "32 KiB halves");
    assert!(last.iter().all(|&end| end <= 64 << 10));
}

#[test]
fn a_refused_growth_keeps_the_region_and_is_not_asked_again() {
    let fake =
        FakeDaemon::start(Behaviour { shm_limit: 1 << 20, refuse_attach_from: Some(8193), ..Behaviour::default() });
    let options = ConnectOptions { shm_bytes: 8192, shm_max_bytes: 1 << 20, ..options(&fake) };
    let client = Client::connect(options).unwrap();
    let buf = client.alloc(50_000).unwrap();
    for seed in 0..2 {
        let data = pattern(50_000, seed);
        client.copy_to_device(&buf, 0, &data, StreamId::DEFAULT).unwrap();
        let mut back = vec![0u8; data.len()];
        client.copy_to_host(&buf, 0, &mut back, StreamId::DEFAULT).unwrap();
        assert!(back == data, "through the old region");
    }
    assert_eq!(client.shm_bytes(), 8192);
    client.close().unwrap();
    assert_eq!(attaches(&fake.finish()), vec![8192, 65536], "asked once, refused, not asked again");
}

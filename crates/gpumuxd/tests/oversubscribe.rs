//! Device memory oversubscription (issue 39; docs/daemon.md, "Memory
//! oversubscription") against a real daemon on a small simulated device
//! (`sim:h100,memory=64MiB`), whose memory is host RAM with real bytes: every
//! eviction and restore moves them, so a round trip is checked bitwise.

mod common;

use common::{own_uid, Daemon};
use gpumux_client::{Arg, Buffer, Client, ConnectOptions, ErrorKind, LaunchConfig, Notice, StreamId};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// The simulated device's memory in these tests.
const DEVICE: u64 = 64 * MIB;
/// 60 % of it, a multiple of 4 KiB.
const SIXTY: u64 = DEVICE * 6 / 10 / 4096 * 4096;

const KERNELS: &str = "__global__ void touch(float* x, unsigned n) { unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }\n\
__global__ void boom(int* p) { if (threadIdx.x == 0) __trap(); }\n";

fn small_device(config: Option<&str>, args: &[&str]) -> Daemon {
    Daemon::start_on(Some("sim:h100,memory=64MiB"), config, args)
}

fn client(d: &Daemon, name: &str) -> Client {
    let options = ConnectOptions { socket: Some(d.socket.clone()), shm_bytes: 8 * MIB, ..ConnectOptions::named(name) };
    Client::connect(options).expect("the client connects")
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

fn read_back(c: &Client, b: &Buffer) -> Vec<u8> {
    let mut out = vec![0u8; b.len() as usize];
    c.copy_to_host(b, 0, &mut out, StreamId::DEFAULT).expect("the copy back");
    out
}

fn evicted_of(c: &Client, name: &str) -> u64 {
    let s = c.status().expect("status");
    s.clients.iter().find(|r| r.name == name).map_or(0, |r| r.memory_evicted)
}

/// One client's work over all of its 60 %: its pattern in, a kernel over
/// all of it (simulated: it takes time, computes nothing), then rounds of
/// memsets and device copies inside the buffer, each followed by a read of
/// the whole buffer compared with the same steps done on the host.
fn one_client_work(d: &Daemon, name: &str, seed: u32, rounds: u32, all_in: Option<&Barrier>) -> Vec<u8> {
    let c = client(d, name);
    let n = SIXTY as usize;
    let m = c.load_module("k.cu", KERNELS, &[]).expect("the module loads");
    let touch = m.kernel("touch").expect("touch");
    let b = c.alloc(SIXTY).expect("60 % of the device is allocated");
    if let Some(all_in) = all_in {
        // Every client holds its 60 % before any works: oversubscribed for sure.
        all_in.wait();
    }
    let mut model = pattern(n, seed);
    c.copy_to_device(&b, 0, &model, StreamId::DEFAULT).expect("the pattern goes in");
    for r in 0..rounds {
        let cfg = LaunchConfig::for_threads((n / 4) as u32, 256).block_time_ns(20_000);
        c.launch(&touch, &cfg, &[Arg::buffer(&b), Arg::bytes(((n / 4) as u32).to_le_bytes())]).expect("launch");
        let at = (r as usize * 7919 * 4096) % (n - 65536);
        c.memset(&b, at as u64, (seed as u8).wrapping_add(r as u8), 65536, StreamId::DEFAULT).expect("memset");
        model[at..at + 65536].fill((seed as u8).wrapping_add(r as u8));
        c.copy_device(&b, 0, &b, (n / 2) as u64, 4096, StreamId::DEFAULT).expect("device copy");
        let head: Vec<u8> = model[..4096].to_vec();
        model[n / 2..n / 2 + 4096].copy_from_slice(&head);
        c.sync(StreamId::DEFAULT).expect("sync");
        assert!(read_back(&c, &b) == model, "{name}: round {r}'s bytes differ from the same steps alone");
    }
    let out = read_back(&c, &b);
    c.close().expect("close");
    out
}

/// Three clients, each with 60 % of the device, working at once: all
/// finish, each with exactly the bytes it gets alone; the daemon restored
/// along the way (two of the three were born evicted) and holds nothing
/// after. Whether a client is also evicted in its middle depends on how
/// long its rounds take against its kept time: the next test makes sure.
#[test]
fn three_clients_of_sixty_percent_each_finish_with_their_bytes_alone() {
    let s = three_clients(&[]);
    assert!(s.restores >= 2, "two clients at least were born evicted and restored: {s:?}");
}

/// The same with no kept time (`--swap-keep 0`): a client is evicted at
/// its first idle moment that another needs the room, so the three swap
/// their bytes out and back round after round, and still end bitwise.
#[test]
fn with_no_kept_time_three_clients_swap_their_bytes_and_end_bitwise() {
    let s = three_clients(&["--swap-keep", "0"]);
    assert!(s.evictions >= 2 && s.restores >= 4, "the bytes went out and back: {s:?}");
}

/// A device of 128 MiB whose daemon hands out 64 (`--device-memory`): the
/// clients see 64 MiB, and three of 60 % of it oversubscribe it (the
/// one-GPU check's setting, where the host's RAM is smaller than the GPU's
/// three clients of 60 %), swap, and end bitwise.
#[test]
fn a_daemon_that_hands_out_part_of_the_device_is_oversubscribed_past_that_part() {
    let d = Daemon::start_on(Some("sim:h100,memory=128MiB"), None, &["--device-memory", "64MiB", "--swap-keep", "0"]);
    let c = client(&d, "looker");
    assert_eq!(c.device_properties().expect("properties").memory_bytes, DEVICE, "the cap is the device's memory");
    assert_eq!(c.status().expect("status").memory_total, DEVICE);
    // Beyond the cap: refused with the numbers, although the device has room.
    match c.alloc(DEVICE + MIB) {
        Err(e) => {
            assert_eq!(e.kind(), Some(&ErrorKind::OutOfMemory), "{e}");
            assert!(e.to_string().contains(&(DEVICE + MIB).to_string()), "{e}");
        }
        Ok(_) => panic!("65 MiB of a daemon that hands out 64"),
    }
    c.close().expect("close");
    let s = three_clients_on(d);
    assert!(s.evictions >= 2 && s.restores >= 4, "oversubscribed past the cap, the bytes went out and back: {s:?}");
}

/// A cap above the device's memory stops start-up with both sizes.
#[test]
fn a_cap_above_the_device_stops_start_up_naming_both_sizes() {
    let dir = tempfile::Builder::new().prefix("gpumuxd-cap-").tempdir().expect("a temporary directory");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumuxd"))
        .args(["--device", "sim:h100,memory=64MiB", "--device-memory", "128MiB", "--socket"])
        .arg(dir.path().join("g.sock"))
        .env("RUST_LOG", "error")
        .output()
        .expect("gpumuxd runs");
    assert!(!out.status.success(), "a cap of 128 MiB on a device of 64 started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&(128 * MIB).to_string()) && stderr.contains(&DEVICE.to_string()),
        "both sizes named: {stderr}"
    );
}

fn three_clients(args: &[&str]) -> gpumux_proto::Status {
    three_clients_on(small_device(None, args))
}

fn three_clients_on(d: Daemon) -> gpumux_proto::Status {
    let alone: Vec<Vec<u8>> = (0..3).map(|i| one_client_work(&d, &format!("alone{i}"), 11 + i, 4, None)).collect();
    let watcher = client(&d, "watcher");
    let before = watcher.status().expect("status");
    assert_eq!((before.evictions, before.restores), (0, 0), "alone, nothing is evicted");
    let d2 = &d;
    let all_in = Barrier::new(3);
    let all_in = &all_in;
    let shared: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3u32)
            .map(|i| s.spawn(move || one_client_work(d2, &format!("shared{i}"), 11 + i, 4, Some(all_in))))
            .collect();
        handles.into_iter().map(|h| h.join().expect("a client thread")).collect()
    });
    for i in 0..3 {
        assert!(shared[i] == alone[i], "client {i}'s bytes shared differ from alone");
    }
    let s = watcher.status().expect("status");
    assert_eq!((s.memory_used, s.memory_evicted), (0, 0), "everything freed: {s:?}");
    s
}

/// Idle clients' buffers are evicted to make room, show in `Status` as
/// evicted, and come back with their bytes when their owner copies again.
#[test]
fn an_idle_clients_buffer_is_evicted_and_comes_back_bitwise() {
    idle_round_trip(&[]);
}

/// The same with the device in a child process (the calls cross its link).
#[test]
fn an_idle_clients_buffer_round_trips_with_the_device_in_a_child_process() {
    idle_round_trip(&["--device-process"]);
}

fn idle_round_trip(args: &[&str]) {
    let d = small_device(None, args);
    let a = client(&d, "a");
    let b = client(&d, "b");
    let n = SIXTY as usize;
    let data = pattern(n, 3);
    let ba = a.alloc(SIXTY).unwrap();
    a.copy_to_device(&ba, 0, &data, StreamId::DEFAULT).unwrap();
    assert_eq!(evicted_of(&a, "a"), 0);
    let bb = b.alloc(SIXTY).unwrap();
    b.memset(&bb, 0, 7, SIXTY, StreamId::DEFAULT).unwrap();
    b.sync(StreamId::DEFAULT).unwrap();
    let s = a.status().unwrap();
    assert_eq!(evicted_of(&a, "a"), SIXTY, "a was idle: its buffer made the room: {s:?}");
    assert_eq!((s.memory_used, s.memory_evicted), (2 * SIXTY, SIXTY));
    assert!(read_back(&a, &ba) == data, "a's bytes came back changed");
    assert_eq!(evicted_of(&a, "a"), 0, "a's buffer is resident again");
    assert_eq!(evicted_of(&a, "b"), SIXTY, "b was idle: its buffer made the room");
    assert!(read_back(&b, &bb).iter().all(|&x| x == 7), "b's memset survived its eviction");
    a.close().unwrap();
    b.close().unwrap();
}

/// A client killed (its connection gone) while its buffer is evicted, and
/// one killed while its restore waits for room, leave nothing: no device
/// memory, no host memory, no accounting.
#[test]
fn clients_killed_while_evicted_or_waiting_for_a_restore_leave_nothing() {
    let d = small_device(None, &[]);
    let watcher = client(&d, "watcher");
    let victim = client(&d, "victim");
    let vb = victim.alloc(SIXTY).unwrap();
    victim.memset(&vb, 0, 1, SIXTY, StreamId::DEFAULT).unwrap();
    // A memset is answered when accepted: idle (evictable) once it is done.
    victim.sync(StreamId::DEFAULT).unwrap();
    let busy = client(&d, "busy");
    let bb = busy.alloc(SIXTY).unwrap();
    assert_eq!(evicted_of(&watcher, "busy"), SIXTY, "no room: born evicted, its room made when it runs");
    busy.memset(&bb, 0, 2, SIXTY, StreamId::DEFAULT).unwrap();
    busy.sync(StreamId::DEFAULT).unwrap();
    assert_eq!(evicted_of(&watcher, "victim"), SIXTY, "busy's restore evicted the idle victim");
    // Killed while evicted.
    drop(victim);
    let deadline = Instant::now() + Duration::from_secs(5);
    while watcher.status().unwrap().memory_used != SIXTY {
        assert!(Instant::now() < deadline, "the killed client's memory stays: {:?}", watcher.status());
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = watcher.status().unwrap();
    assert_eq!(s.memory_evicted, 0, "its host copy is gone: {s:?}");

    // Killed while its restore waits: `busy` runs a long kernel over its
    // buffer, so it cannot be evicted; `waiter`'s buffer was born evicted
    // (no room), and its memset waits behind its restore.
    let m = busy.load_module("k.cu", KERNELS, &[]).unwrap();
    let touch = m.kernel("touch").unwrap();
    let cfg = LaunchConfig::for_threads(1024, 256).block_time_ns(2_000_000_000);
    busy.launch(&touch, &cfg, &[Arg::buffer(&bb), Arg::bytes(1024u32.to_le_bytes())]).unwrap();
    // The waiter speaks the raw protocol: its memset is sent, never waited for.
    let (mut waiter, _) = common::Client::hello(&d, "waiter", 0);
    let wb = waiter.alloc(SIXTY);
    assert_eq!(evicted_of(&watcher, "waiter"), SIXTY, "no room: born evicted");
    let dst = gpumux_proto::BufferSlice { buffer: wb, offset: 0 };
    waiter.send(gpumux_proto::Request::Memset { dst, value: 9, bytes: SIXTY, stream: StreamId::DEFAULT });
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let row = watcher.status().unwrap();
        let w = row.clients.iter().find(|c| c.name == "waiter").expect("waiter's row");
        if w.ops_queued == 2 {
            assert_eq!(w.memory_evicted, SIXTY, "its memset waits behind its restore's gate");
            break;
        }
        assert!(Instant::now() < deadline, "the waiter's memset never queued: {w:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Killed: its connection ends.
    drop(waiter);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let s = watcher.status().unwrap();
        if s.memory_used == SIXTY && s.memory_evicted == 0 && s.clients.len() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the killed waiter left something: {s:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    busy.close().unwrap();
}

/// The host memory for evicted buffers is capped (`--swap-memory`): an
/// allocation past device and cap is refused with the numbers, and nothing
/// of anyone's is lost.
#[test]
fn the_host_cap_refuses_cleanly_naming_the_numbers() {
    let d = small_device(None, &["--swap-memory", "40MiB"]);
    let a = client(&d, "a");
    let b = client(&d, "b");
    let c = client(&d, "c");
    let (da, db) = (pattern(SIXTY as usize, 5), pattern(SIXTY as usize, 6));
    let ba = a.alloc(SIXTY).unwrap();
    a.copy_to_device(&ba, 0, &da, StreamId::DEFAULT).unwrap();
    let bb = b.alloc(SIXTY).unwrap();
    b.copy_to_device(&bb, 0, &db, StreamId::DEFAULT).unwrap();
    let s = c.status().unwrap();
    assert_eq!((s.memory_evicted, s.swap_memory), (SIXTY, 40 * MIB), "{s:?}");
    let e = c.alloc(SIXTY).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::OutOfMemory), "{e}");
    let text = e.to_string();
    for needed in [SIXTY.to_string(), (40 * MIB).to_string(), "swap_memory".into(), "nothing was allocated".into()] {
        assert!(text.contains(&needed), "the error names {needed}: {text}");
    }
    assert!(read_back(&a, &ba) == da, "a's bytes survived");
    assert!(read_back(&b, &bb) == db, "b's bytes survived");
    let s = c.status().unwrap();
    assert_eq!(s.memory_used, 2 * SIXTY, "the refused allocation holds nothing: {s:?}");
}

/// With oversubscription off (`--oversubscribe off`, or `oversubscribe =
/// false` in the config), the daemon is as it was before issue 39: an
/// allocation the device has no room for is refused with the numbers
/// although an idle client's buffer could be evicted, nothing is evicted,
/// nothing of anyone's is lost, and an allocation that fits is served.
#[test]
fn with_oversubscription_off_an_allocation_beyond_the_device_is_refused_and_nothing_is_lost() {
    let uid = own_uid();
    let config = format!("[daemon]\noversubscribe = false\n\n[[allow]]\nuid = {uid}\n");
    for (config, args) in [
        (None, &["--oversubscribe", "off"][..]),
        (None, &["--oversubscribe", "off", "--device-process"][..]),
        (Some(config.as_str()), &[][..]),
    ] {
        let d = small_device(config, args);
        let a = client(&d, "a");
        let b = client(&d, "b");
        let data = pattern(SIXTY as usize, 9);
        let ba = a.alloc(SIXTY).expect("60 % fits");
        a.copy_to_device(&ba, 0, &data, StreamId::DEFAULT).expect("a's pattern goes in");
        a.sync(StreamId::DEFAULT).expect("a is idle: on, its buffer would be evicted");
        let e = b.alloc(SIXTY).expect_err("60 % more than the device holds, with oversubscription off");
        assert_eq!(e.kind(), Some(&ErrorKind::OutOfMemory), "{args:?}: {e}");
        let text = e.to_string();
        for needed in
            [SIXTY.to_string(), DEVICE.to_string(), "oversubscription is off".into(), "nothing was allocated".into()]
        {
            assert!(text.contains(&needed), "{args:?}: the error names {needed}: {text}");
        }
        // What fits is served, from the device's free memory.
        let rest = DEVICE - SIXTY - 4 * MIB;
        let bb = b.alloc(rest).expect("what is left of the device fits");
        b.memset(&bb, 0, 4, rest, StreamId::DEFAULT).expect("memset");
        b.sync(StreamId::DEFAULT).expect("sync");
        assert!(read_back(&a, &ba) == data, "{args:?}: a's bytes survived");
        let s = b.status().expect("status");
        assert_eq!((s.memory_used, s.memory_evicted), (SIXTY + rest, 0), "{args:?}: {s:?}");
        assert_eq!(
            (s.evictions, s.restores, s.swap_memory),
            (0, 0, 0),
            "{args:?}: nothing moves, no host memory: {s:?}"
        );
        a.close().expect("close");
        b.close().expect("close");
    }
}

/// `GPUMUX_OVERSUBSCRIBE` in gpumuxd's environment turns it off too (the
/// GPU A/B's switch, which `gpumux bench daemon` passes to its daemons),
/// `--oversubscribe on` wins over it, and a value that is neither stops
/// start-up naming the variable.
#[test]
fn the_environment_turns_oversubscription_off_and_a_bad_value_stops_start_up() {
    let off = |args: &[&str], var: &str| {
        let d = Daemon::start_env(Some("sim:h100,memory=64MiB"), None, args, &[("GPUMUX_OVERSUBSCRIBE", var)]);
        let a = client(&d, "a");
        let b = client(&d, "b");
        let _ba = a.alloc(SIXTY).expect("60 % fits");
        let refused = b.alloc(SIXTY).is_err();
        let s = b.status().expect("status");
        a.close().expect("close");
        b.close().expect("close");
        (refused, s.memory_evicted)
    };
    assert_eq!(off(&[], "off"), (true, 0), "GPUMUX_OVERSUBSCRIBE=off: refused");
    assert_eq!(off(&[], "0"), (true, 0), "GPUMUX_OVERSUBSCRIBE=0: refused");
    assert_eq!(off(&["--oversubscribe", "on"], "off"), (false, SIXTY), "the command line wins: born evicted");

    let dir = tempfile::Builder::new().prefix("gpumuxd-over-").tempdir().expect("a temporary directory");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpumuxd"))
        .args(["--device", "sim:h100,memory=64MiB", "--socket"])
        .arg(dir.path().join("g.sock"))
        .env("RUST_LOG", "error")
        .env("GPUMUX_OVERSUBSCRIBE", "maybe")
        .output()
        .expect("gpumuxd runs");
    assert!(!out.status.success(), "GPUMUX_OVERSUBSCRIBE=maybe started");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("GPUMUX_OVERSUBSCRIBE") && stderr.contains("maybe"), "the variable named: {stderr}");
}

/// Quotas count evicted bytes too, and no client may hold more than the
/// device (its buffers could never be resident together).
#[test]
fn quotas_cap_resident_plus_evicted() {
    let uid = own_uid();
    let d = small_device(Some(&format!("[[allow]]\nuid = {uid}\nmemory = \"50 MiB\"\n")), &[]);
    let a = client(&d, "a");
    let b = client(&d, "b");
    let _ba = a.alloc(SIXTY).unwrap();
    let _bb = b.alloc(SIXTY).unwrap();
    assert_eq!(evicted_of(&a, "b"), SIXTY, "no room: born evicted");
    let e = b.alloc(16 * MIB).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::Quota), "evicted bytes count against the quota: {e}");
    let d2 = small_device(None, &[]);
    let big = client(&d2, "big");
    let _one = big.alloc(SIXTY).unwrap();
    let e = big.alloc(SIXTY).unwrap_err();
    assert_eq!(e.kind(), Some(&ErrorKind::OutOfMemory), "{e}");
    assert!(e.to_string().contains("never be resident together"), "{e}");
}

/// After a kernel breaks the context, an evicted buffer comes back with its
/// contents (its owner's notice does not list it); resident ones are lost.
#[test]
fn evicted_buffers_survive_a_lost_context_with_their_contents() {
    let d = small_device(None, &[]);
    let a = client(&d, "a");
    let data = pattern(SIXTY as usize, 9);
    let ba = a.alloc(SIXTY).unwrap();
    a.copy_to_device(&ba, 0, &data, StreamId::DEFAULT).unwrap();
    let b = client(&d, "b");
    let bb = b.alloc(SIXTY).unwrap();
    assert_eq!(evicted_of(&a, "b"), SIXTY, "no room: born evicted, its room made when it runs");
    let m = b.load_module("k.cu", KERNELS, &[]).unwrap();
    let boom = m.kernel("boom").unwrap();
    // Its block ends (and the context breaks) 200 ms after launch: time for the sync to queue
    // behind it. With the default 10 µs the trap could be handled before the sync came, and
    // the sync of the rebuilt, empty stream answered Ok (one run in six on a loaded host).
    let config = LaunchConfig::new([1, 1, 1], [32, 1, 1]).block_time_ns(200_000_000);
    b.launch(&boom, &config, &[Arg::buffer(&bb)]).unwrap();
    assert!(b.sync(StreamId::DEFAULT).is_err(), "the trap breaks the context");
    assert_eq!(evicted_of(&a, "a"), SIXTY, "b's restore evicted a before its kernel ran");
    let deadline = Instant::now() + Duration::from_secs(5);
    let lost = loop {
        let notices = a.take_notices();
        if let Some(Notice::ContextLost { lost, .. }) = notices.into_iter().next() {
            break lost;
        }
        assert!(Instant::now() < deadline, "a heard nothing of the lost context");
        let _ = a.status();
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(lost.buffers.is_empty(), "a's evicted buffer is not lost: {lost:?}");
    assert!(read_back(&a, &ba) == data, "a's evicted bytes came back after the rebuild");
    assert_eq!(a.status().unwrap().context_rebuilds, 1);
}

/// One wave of 256-thread blocks on the simulated H100 (8 per SM, 132 SMs):
/// each block of a grid-stride kernel covers the whole grid's work.
const ONE_WAVE: [u32; 3] = [132 * 8, 1, 1];

/// The device of the urgent client's test: the others' 64 MiB. The
/// simulated device copies a move's bytes on a mover thread of its own, as
/// a GPU does; when it copied them on the daemon's core thread, its 38 MiB
/// buffers held the core 10 ms and more per move on a loaded machine, every
/// client's launches with it (75-86 % of the urgent client's rate lost),
/// and this test ran on 16 MiB.
const URGENT_DEVICE: u64 = DEVICE;

/// A neighbour of issue 39's urgent client: 60 % of [`URGENT_DEVICE`],
/// rounds of two one-wave kernels whose blocks each run `block_ns`, a
/// memset, a sync (where it may be evicted) and a read of its whole buffer
/// compared with the same steps on the host. Returns its final bytes.
fn long_block_neighbour(d: &Daemon, name: &str, seed: u32, rounds: u32, block_ns: u64) -> Vec<u8> {
    let c = client(d, name);
    let n = (URGENT_DEVICE * 6 / 10 / 4096 * 4096) as usize;
    let touch = c.load_module("k.cu", KERNELS, &[]).expect("the module loads").kernel("touch").expect("touch");
    let b = c.alloc(n as u64).expect("60 % of the device");
    let mut model = pattern(n, seed);
    c.copy_to_device(&b, 0, &model, StreamId::DEFAULT).expect("the pattern goes in");
    let cfg = LaunchConfig::new(ONE_WAVE, [256, 1, 1]).block_time_ns(block_ns);
    for r in 0..rounds {
        for _ in 0..2 {
            c.launch(&touch, &cfg, &[Arg::buffer(&b), Arg::bytes(((n / 4) as u32).to_le_bytes())]).expect("launch");
        }
        let at = (r as usize * 7919 * 4096) % (n - 65536);
        c.memset(&b, at as u64, (seed as u8).wrapping_add(r as u8), 65536, StreamId::DEFAULT).expect("memset");
        model[at..at + 65536].fill((seed as u8).wrapping_add(r as u8));
        c.sync(StreamId::DEFAULT).expect("sync");
        assert!(read_back(&c, &b) == model, "{name}: round {r}'s bytes differ from the same steps alone");
    }
    let out = read_back(&c, &b);
    c.close().expect("close");
    out
}

/// Issue 39's urgent client (priority 5, 5 % of [`URGENT_DEVICE`]):
/// `rounds` rounds of three one-wave kernels of 2 ms blocks and a sync; its
/// bytes must come back unchanged. Returns its time from its first kernel
/// to its last sync's answer, from its first round's end to it, and its
/// rounds' times.
fn urgent_client(d: &Daemon, rounds: u32) -> (Duration, Duration, Vec<Duration>) {
    let options = ConnectOptions {
        socket: Some(d.socket.clone()),
        shm_bytes: 8 * MIB,
        priority: 5,
        ..ConnectOptions::named("urgent")
    };
    let c = Client::connect(options).expect("the urgent client connects");
    let bytes = URGENT_DEVICE / 20 / 4096 * 4096;
    let touch = c.load_module("k.cu", KERNELS, &[]).expect("the module loads").kernel("touch").expect("touch");
    let b = c.alloc(bytes).expect("5 % of the device");
    let data = pattern(bytes as usize, 99);
    c.copy_to_device(&b, 0, &data, StreamId::DEFAULT).expect("its pattern goes in");
    c.sync(StreamId::DEFAULT).expect("sync");
    let cfg = LaunchConfig::new(ONE_WAVE, [256, 1, 1]).block_time_ns(2_000_000);
    let start = Instant::now();
    let mut first_round = None;
    let mut each = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..3 {
            c.launch(&touch, &cfg, &[Arg::buffer(&b), Arg::bytes(((bytes / 4) as u32).to_le_bytes())]).expect("launch");
        }
        c.sync(StreamId::DEFAULT).expect("sync");
        each.push(t.elapsed());
        first_round.get_or_insert_with(Instant::now);
    }
    let took = (start.elapsed(), first_round.map_or(Duration::ZERO, |t| t.elapsed()), each);
    assert!(read_back(&c, &b) == data, "the urgent client's bytes changed");
    c.close().expect("close");
    took
}

/// Issue 39's last goal on the simulated device, through the daemon: an
/// urgent client that fits keeps its rate beside two
/// clients of 60 % that swap (`--swap-keep 0`) and whose kernels are one
/// wave of 30 ms blocks, and both of them finish with the bytes they get
/// alone. Its rate is measured after its first round: that round waits for
/// the neighbour's blocks already running when it comes (one block time at
/// most; a block cannot be preempted on this device's drain), which on a
/// GPU is tens of milliseconds of a run of seconds and here would be a
/// tenth of a run kept short for CI. On a shared machine the real-time
/// device's rate varies by a third from run to run, so the test asserts the
/// mechanism (no neighbour block in the urgent client's gaps) and prints
/// the loss; the 10 % is asserted on virtual time (below). What keeps its rate is the policy's reserves
/// (`gpumux_engine::policies::reserve`): a neighbour's kernel started in
/// one of the urgent client's gaps would hold its SMs for a whole block
/// (gpumux-sim's `urgent_beside_long_blocks` shows the loss without them).
/// The device runs in real time: a gap longer than a neighbour's block (the
/// urgent client's thread descheduled that long on a loaded machine) lets a
/// neighbour in, which 30 ms blocks make rare.
#[test]
fn an_urgent_client_keeps_its_rate_beside_two_swapping_long_block_neighbours() {
    const ROUNDS: u32 = 60;
    const BLOCK_NS: u64 = 30_000_000;
    let device = format!("sim:h100,memory={}MiB", URGENT_DEVICE / MIB);
    let d = Daemon::start_on(Some(&device), None, &["--swap-keep", "0"]);
    // Best of two alone: the device runs in real time on a shared machine.
    let alone = urgent_client(&d, ROUNDS).min(urgent_client(&d, ROUNDS));
    let alone_bytes: Vec<Vec<u8>> =
        (0..2).map(|i| long_block_neighbour(&d, &format!("alone{i}"), 21 + i, 3, BLOCK_NS)).collect();
    let watcher = client(&d, "watcher");
    let d2 = &d;
    let (beside, shared, moves) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2u32)
            .map(|i| s.spawn(move || long_block_neighbour(d2, &format!("shared{i}"), 21 + i, 3, BLOCK_NS)))
            .collect();
        // Both have allocated: the device is oversubscribed, one of them waits to swap in.
        let deadline = Instant::now() + Duration::from_secs(10);
        while watcher.status().expect("status").memory_evicted == 0 {
            assert!(Instant::now() < deadline, "the neighbours never oversubscribed the device");
            std::thread::sleep(Duration::from_millis(1));
        }
        let before = watcher.status().expect("status");
        let beside = urgent_client(d2, ROUNDS);
        let after = watcher.status().expect("status");
        let moves = (after.evictions - before.evictions, after.restores - before.restores);
        let shared: Vec<Vec<u8>> = handles.into_iter().map(|h| h.join().expect("a neighbour")).collect();
        (beside, shared, moves)
    });
    let loss = |a: Duration, b: Duration| (1.0 - a.as_secs_f64() / b.as_secs_f64()) * 100.0;
    let (lost, lost_in_all) = (loss(alone.1, beside.1), loss(alone.0, beside.0));
    // A round is three kernels of 2 ms: one that waited for a neighbour's
    // block took half a block longer at least.
    let slow = Duration::from_nanos(6_000_000 + BLOCK_NS / 2);
    let waited = beside.2.iter().skip(1).filter(|&&t| t > slow).count();
    eprintln!(
        "urgent: alone {:?} ({:?} after its first round), beside two swapping long-block neighbours {:?} ({:?}): \
         {lost:.1} % lost after its first round, {lost_in_all:.1} % in all; {waited} of its later rounds over {slow:?} \
         ({} evictions, {} restores during its run)",
        alone.0, alone.1, beside.0, beside.1, moves.0, moves.1
    );
    for i in 0..2 {
        assert!(shared[i] == alone_bytes[i], "neighbour {i}'s bytes beside the urgent client differ from alone");
    }
    // The goal's 10 % is asserted on virtual time (gpumux-sim's
    // `urgent_beside_long_blocks`): here the device runs in real time on a
    // shared machine, where the same urgent run alone took 366-527 ms. What
    // must not happen is a neighbour's block in its gaps, which shows as a
    // round half a block longer than its kernels (without reserves, most of
    // them; a machine that descheduled the client that long, a few).
    assert!(
        waited <= ROUNDS as usize / 20,
        "{waited} of the urgent client's {} later rounds waited for a neighbour's block ({lost:.1} % lost)",
        ROUNDS - 1
    );
    let s = watcher.status().expect("status");
    assert!(s.evictions >= 1 && s.restores >= 1, "the neighbours swapped: {s:?}");
}

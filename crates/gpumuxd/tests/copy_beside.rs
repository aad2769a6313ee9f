//! A client copying from ordinary memory beside a client of short launches
//! (issue 35's last goal) on the simulated device: the launches keep being
//! served while the copy's chunks go through the shared region.
//!
//! Counted, not timed, so that this machine's load does not decide it: the
//! launching client's launch + syncs that began and ended while the copy
//! ran, against the copy's chunk requests. Both clients need the CPU alike,
//! so a loaded machine slows both; what the count tells apart is whether a
//! launch waits for the chunks. Served beside them, a launch + sync (a
//! round trip to the core and a 4-block kernel) takes a fraction of a
//! chunk's time (an 8 MiB `memcpy` in the client, another on the simulated
//! device's copy thread), so several come between two chunks; a launch that
//! waited behind each chunk in flight would get about one per chunk, and
//! one held behind the whole copy none.
//!
//! The count still moves with how the scheduler shares this machine's two
//! cores among the two clients, the copy's helper threads and the daemon's
//! threads (98 to 1,226 launch + syncs during the same 64 chunks in runs of
//! one build), so the copy is tried up to [`ATTEMPTS`] times and one count
//! at the bound passes: launches held behind the chunks would fall short in
//! every attempt, since that holds them by construction, not by chance.

mod common;

use common::Daemon;
use gpumux_client::{plan_chunks, slots_for, Arg, Client, ConnectOptions, LaunchConfig, StreamId};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const SOURCE: &str = "extern \"C\" __global__ void k(float* p, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] += 1.0f; }";

/// Bytes the copier moves each way a round: larger than the region's
/// largest default (32 MiB), so it goes in chunks.
const BYTES: usize = 64 << 20;
/// Rounds up and down.
const ROUNDS: usize = 4;
/// Launch + syncs the launcher must get done per chunk of the copy, at
/// least (module doc: about one if launches waited behind chunks).
const LAUNCHES_PER_CHUNK: usize = 2;
/// Copies tried, each with its own count, until one reaches the bound (module doc).
const ATTEMPTS: usize = 3;

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

#[test]
fn a_pageable_copy_does_not_hold_back_another_clients_launches() {
    let d = Daemon::start(None);
    let mut counts = Vec::new();
    for _ in 0..ATTEMPTS {
        let (during, chunks, total) = launches_beside_a_copy(&d);
        eprintln!("copy_beside: {during} launch + syncs during {chunks} chunks ({total} in all)");
        counts.push(format!("{during} during {chunks} chunks"));
        if during >= LAUNCHES_PER_CHUNK * chunks {
            return;
        }
    }
    panic!(
        "the other client's launch + syncs while the copy's chunks went, in {ATTEMPTS} attempts: {}; under \
         {LAUNCHES_PER_CHUNK} per chunk in each: its launches waited for the chunks",
        counts.join(", ")
    );
}

/// One copy of [`BYTES`] up and down [`ROUNDS`] times by a copier client
/// beside a launcher client's launch + syncs: the launch + syncs that began
/// and ended while the copy ran, the copy's chunks, and the launch + syncs
/// in all.
fn launches_beside_a_copy(d: &Daemon) -> (usize, usize, usize) {
    let options = |name: &str| ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named(name) };
    let launcher = Client::connect(options("launcher")).expect("the launcher connects");
    let module = launcher.load_module("m", SOURCE, &[]).expect("the kernel compiles");
    let k = module.kernel("k").expect("the module has k");
    let x = launcher.alloc(4096).expect("a buffer");
    let args = [Arg::buffer(&x), Arg::bytes(1024i32.to_le_bytes())];
    let config = LaunchConfig::new([4, 1, 1], [256, 1, 1]);

    // The copier: ready (its region grown, its buffer allocated) before
    // `copying` is set, so that only the chunks' time is counted.
    let copying = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let copier = {
        let (copying, finished) = (copying.clone(), finished.clone());
        // Two threads: the helper pool, its stores and its nice value.
        let options = ConnectOptions { copy_threads: 2, ..options("copier") };
        std::thread::spawn(move || {
            let client = Client::connect(options).expect("the copier connects");
            let buf = client.alloc(BYTES as u64).expect("the copier's buffer");
            let data = pattern(BYTES, 3);
            let mut back = vec![0u8; BYTES];
            client.copy_to_device(&buf, 0, &data[..1 << 20], StreamId::DEFAULT).expect("a first small copy");
            // A copy larger than the region grows it first: do that now.
            client.copy_to_device(&buf, 0, &data, StreamId::DEFAULT).expect("the growing copy");
            let region = client.shm_bytes();
            copying.store(true, Ordering::SeqCst);
            for round in 0..ROUNDS {
                client.copy_to_device(&buf, 0, &data, StreamId::DEFAULT).expect("a copy up");
                client.copy_to_host(&buf, 0, &mut back, StreamId::DEFAULT).expect("a copy down");
                assert!(back == data, "round {round}: the bytes came back");
                back.fill(0);
            }
            copying.store(false, Ordering::SeqCst);
            finished.store(true, Ordering::SeqCst);
            client.close().expect("the copier leaves");
            region
        })
    };

    // The launcher: launch + sync until the copier is done, counting those
    // that began and ended while it copied.
    let mut during = 0usize;
    let mut total = 0usize;
    while !finished.load(Ordering::SeqCst) {
        let began = copying.load(Ordering::SeqCst);
        launcher.launch(&k, &config, &args).expect("a launch");
        launcher.sync(StreamId::DEFAULT).expect("its sync");
        total += 1;
        if began && copying.load(Ordering::SeqCst) {
            during += 1;
        }
    }
    let region = copier.join().expect("the copier's thread did not panic");
    launcher.close().expect("the launcher leaves");

    let chunks = plan_chunks(BYTES as u64, region, slots_for(region)).len() * 2 * ROUNDS;
    assert!(chunks >= 2 * 2 * ROUNDS, "the copy went in chunks ({chunks} through a region of {region} bytes)");
    (during, chunks, total)
}

/// How long the other client's kernel runs on the simulated device in
/// [`a_copy_takes_its_threads_beside_only_while_another_client_is_busy`]:
/// longer than a copy of [`BYTES`] up and down on a loaded machine (tens of
/// ms; the test checks that it was), so that the other client is busy for
/// the whole copy by construction.
const BUSY_NS: u64 = 3_000_000_000;

/// Longer than the daemon's window after a client's last submitted
/// operation in which it still counts as busy (50 ms, `core/beside.rs`).
const PAST_THE_WINDOW: std::time::Duration = std::time::Duration::from_millis(250);

/// Issue 35: a copier from ordinary memory takes its threads beside (2)
/// while another client of the daemon is busy, and all of them (4) alone,
/// told by each chunk's reply. Counted by the copier (`Client::copy_stats`:
/// its chunks by the threads they went on), not timed.
#[test]
fn a_copy_takes_its_threads_beside_only_while_another_client_is_busy() {
    let d = Daemon::start(None);
    let options = |name: &str| ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named(name) };
    let copier = Client::connect(ConnectOptions { copy_threads: 4, copy_threads_beside: 2, ..options("copier") })
        .expect("the copier connects");
    assert_eq!((copier.copy_threads(), copier.copy_threads_beside()), (4, 2));
    let buf = copier.alloc(BYTES as u64).expect("the copier's buffer");
    let data = pattern(BYTES, 5);
    let mut back = vec![0u8; BYTES];
    // Alone on the daemon; grows the region, so that every copy below is cut alike.
    copier.copy_to_device(&buf, 0, &data, StreamId::DEFAULT).expect("the growing copy");
    let region = copier.shm_bytes();
    let (chunks, slots) = (plan_chunks(BYTES as u64, region, slots_for(region)).len() as u64, slots_for(region));
    assert!(chunks > slots, "{chunks} chunks each way through {slots} slots");
    let mut round_trip = |what: &str| {
        let before = copier.copy_stats();
        copier.copy_to_device(&buf, 0, &data, StreamId::DEFAULT).expect("a copy up");
        copier.copy_to_host(&buf, 0, &mut back, StreamId::DEFAULT).expect("a copy down");
        assert!(back == data, "{what}: the bytes came back");
        back.fill(0);
        let after = copier.copy_stats();
        let on = |n: usize| after.on_threads[n] - before.on_threads[n];
        let (alone, beside) = (after.alone - before.alone, after.beside - before.beside);
        eprintln!("{what}: {alone} chunks alone, {beside} beside; on 4 threads {}, on 2 {}", on(4), on(2));
        assert_eq!(alone + beside, 2 * chunks, "{what}: every chunk counted once");
        assert_eq!((on(4), on(2)), (alone, beside), "{what}: alone on 4 threads, beside on 2");
        (alone, beside)
    };

    // Another client, connected but idle: it launched and synced, then
    // nothing for longer than the daemon's window.
    let (other, _module, k, x) = {
        let c = Client::connect(options("other")).expect("the other client connects");
        let module = c.load_module("m", SOURCE, &[]).expect("the kernel compiles");
        let k = module.kernel("k").expect("the module has k");
        let x = c.alloc(4096).expect("a buffer");
        (c, module, k, x)
    };
    let args = [Arg::buffer(&x), Arg::bytes(1024i32.to_le_bytes())];
    other.launch(&k, &LaunchConfig::new([4, 1, 1], [256, 1, 1]), &args).expect("a short launch");
    other.sync(StreamId::DEFAULT).expect("its sync");
    std::thread::sleep(PAST_THE_WINDOW);
    assert_eq!(
        round_trip("beside an idle client"),
        (2 * chunks, 0),
        "an idle client leaves the copier all its threads"
    );

    // The other client busy: a kernel runs through the whole copy. The
    // upload's first `slots` chunks go out before any reply of this copy
    // comes: they keep what the last reply said (alone).
    other.launch(&k, &LaunchConfig::new([4, 1, 1], [256, 1, 1]).block_time_ns(BUSY_NS), &args).expect("a long launch");
    let running = other.record_event(StreamId::DEFAULT).expect("an event after it");
    let counts = round_trip("beside a busy client");
    assert!(
        !other.query_event(running).expect("its query"),
        "the other client's kernel ({} s) ended before the copy did: this machine is too slow for the test",
        BUSY_NS / 1_000_000_000
    );
    assert_eq!(
        counts,
        (slots, 2 * chunks - slots),
        "beside a busy client: every chunk after the first reply on 2 threads"
    );

    // Idle again: all threads from the first reply on.
    other.sync(StreamId::DEFAULT).expect("the long kernel's sync");
    std::thread::sleep(PAST_THE_WINDOW);
    assert_eq!(round_trip("after the other went idle"), (2 * chunks - slots, slots), "all threads again");
    other.close().expect("the other client leaves");
    copier.close().expect("the copier leaves");
}

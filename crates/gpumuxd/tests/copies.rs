//! A large copy by one client does not hold back another client's launches
//! (issue 35). The simulated device moves a copy's bytes for real; until
//! this test's change it moved them on the core's thread when the copy was
//! done, so every other client's request waited for the `memcpy` of a whole
//! chunk (tens of ms for this test's 1 GiB). Now a copy engine thread
//! moves them (`backend/copy_engine.rs`), as a GPU's DMA engines do.
//!
//! The bound is relative to this machine and this moment: a launch + sync
//! of the other client never takes half of what one chunk's copy takes
//! meanwhile (the copier's median, which stretches with the machine's load
//! as the launches' waits do), and it took about the whole of it, for a
//! launch that came as the move began, when the core moved the bytes.

mod common;

use common::{launch, memfd, Client, Daemon};
use gpumux_proto::{BufferSlice, Reply, Request, StreamId};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Large enough that its `memcpy` (~80 ms) stands well above what a launch
/// may wait for a CPU on a busy 2-core machine (a few scheduler ticks, 4-17
/// ms measured there while the copy engine's thread holds a core); the
/// daemon's default limit of a client's shared region.
const CHUNK: u64 = 1 << 30;
/// The part of it whose `memcpy` is timed (scaled up), to spare the memory.
const TIMED: u64 = 256 << 20;
/// Launch + syncs of the other client measured while copies run, at least.
const LAUNCHES: usize = 60;
/// Chunks copied while they are measured, at least.
const CHUNKS: u64 = 4;

/// How long moving one chunk takes on this machine (the best of three, of a
/// quarter of it, times four).
fn memcpy_time() -> Duration {
    let from = vec![1u8; TIMED as usize];
    let mut to = vec![0u8; TIMED as usize];
    (0..3)
        .map(|_| {
            let t = Instant::now();
            to.copy_from_slice(&from);
            std::hint::black_box(&to);
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
        * (CHUNK / TIMED) as u32
}

#[test]
fn a_large_copy_does_not_hold_back_another_clients_launches() {
    let memcpy = memcpy_time();
    let d = Daemon::start(None);
    let stop = Arc::new(AtomicBool::new(false));
    let copies = Arc::new(AtomicU64::new(0));
    let chunk_times = Arc::new(std::sync::Mutex::new(Vec::new()));
    // The copier speaks the protocol itself: the same span of its region
    // each time, so none of this machine's time goes to filling it.
    let copier = {
        let (stop, copies, chunk_times) = (stop.clone(), copies.clone(), chunk_times.clone());
        let mut c = Client::hello(&d, "copier", 0).0;
        std::thread::spawn(move || {
            let fd = memfd(CHUNK);
            c.attach(&fd, CHUNK).expect("a 1 GiB shared region");
            let buffer = c.alloc(CHUNK);
            while !stop.load(Ordering::Relaxed) {
                let copy = Request::CopyToDevice {
                    dst: BufferSlice { buffer, offset: 0 },
                    shm_offset: 0,
                    bytes: CHUNK,
                    stream: StreamId(0),
                };
                let t = Instant::now();
                let copied = c.call(copy);
                assert!(matches!(copied, Ok(Reply::Copied { .. })), "a chunk copied: {copied:?}");
                chunk_times.lock().expect("not poisoned").push(t.elapsed());
                copies.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let (mut launcher, _) = Client::hello(&d, "launcher", 0);
    let kernel = launcher.load("__global__ void k() {}")[0].kernel;
    let sync = || Request::SyncStream(StreamId(0));
    // Warm up, and wait for the copies to be under way.
    launcher.launch_ok(launch(kernel, 1, 5_000, vec![]));
    launcher.ok(sync());
    let deadline = Instant::now() + Duration::from_secs(60);
    while copies.load(Ordering::Relaxed) < 1 {
        assert!(Instant::now() < deadline, "the copier never copied");
        std::thread::sleep(Duration::from_millis(1));
    }
    let first = copies.load(Ordering::Relaxed);
    let mut took = Vec::with_capacity(LAUNCHES);
    while took.len() < LAUNCHES || copies.load(Ordering::Relaxed) - first < CHUNKS {
        assert!(Instant::now() < deadline, "{CHUNKS} chunks were not copied in a minute");
        let t = Instant::now();
        launcher.launch_ok(launch(kernel, 1, 5_000, vec![]));
        launcher.ok(sync());
        took.push(t.elapsed());
    }
    let during = copies.load(Ordering::Relaxed) - first;
    stop.store(true, Ordering::Relaxed);
    copier.join().expect("the copier ran without an error");
    took.sort();
    let worst = took[took.len() - 1];
    let mut chunks = chunk_times.lock().expect("not poisoned").clone();
    chunks.sort();
    let chunk = chunks[chunks.len() / 2];
    eprintln!(
        "copies: {during} chunks of 1 GiB copied meanwhile, {chunk:?} each (median); launch + sync p50 {:?}, \
         worst {worst:?}; one chunk's memcpy alone here {memcpy:?}",
        took[took.len() / 2]
    );
    assert!(during >= CHUNKS, "the launches were measured while chunks were copied");
    assert!(
        worst < chunk / 2,
        "a launch + sync took {worst:?} beside the copies, at least half of one chunk's copy ({chunk:?}; its \
         memcpy alone {memcpy:?}): the copy held the launch back"
    );
}

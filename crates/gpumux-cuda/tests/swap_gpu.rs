//! Address-stable buffers moved out and back on the device's mover thread
//! (issue 39; `client/swap.rs`, `client/mover.rs`) on a real GPU: two
//! buffers larger than the pinned ring (so the ring wraps) evicted together
//! and restored at their addresses, bitwise; a pointer stored in one still
//! names the other; a buffer born evicted comes back as zeros; a buffer
//! freed while its move is under way leaves nothing; and the device's own
//! thread launches copies while a move runs; with a pinned host pool, moves
//! go straight between the device and pinned memory, copies are reused, and
//! nothing is pinned past the pool's cap; the pool grows ahead, in chunks, once
//! oversubscription is possible, so that the first eviction of a size never
//! seen finds them pinned, and gives them back when its buffers are gone;
//! asked to (gpumuxd's GPUMUX_SWAP_AHEAD), it grows from the start.
//! Without a GPU each test says it skipped and why.

mod gpu_test;

use gpu_test::{test_name, Pinned};
use gpumux_cuda::client::{ClientDevice, ClientWork, MemoryError};
use gpumux_engine::device::{Command, CopyDirection, Device, Event};
use gpumux_engine::ids::{CopyId, OpId, ProcessId};
use std::time::{Duration, Instant};

fn device_or_skip(test: &str) -> Option<ClientDevice> {
    match ClientDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("SKIPPED {test}: {}", gpumux_cuda::error::Chain(&e));
            None
        }
    }
}

/// One copy through the engine's commands, run to its end.
fn copy(d: &mut ClientDevice, id: u64, work: ClientWork, bytes: u64) {
    // SAFETY: the tests' host buffers are registered and outlive the copy.
    unsafe { d.bind(OpId(id), work) }.expect("bind");
    let c = CopyId(id);
    let cmd =
        Command::Copy { copy: c, op: OpId(id), process: ProcessId(0), direction: CopyDirection::DeviceToDevice, bytes };
    d.submit(d.now(), cmd).expect("submit copy");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut events = Vec::new();
    while !events.iter().any(|e| matches!(e, Event::CopyDone { copy, .. } if *copy == c)) {
        assert!(Instant::now() < deadline, "copy {id} did not end in 30 s: {events:?}");
        let now = d.now();
        d.advance(Some(now + 1_000_000), &mut events).expect("advance");
    }
    d.unbind(OpId(id));
}

/// Waits for the moves with these tokens; returns their results.
fn wait_moves(d: &mut ClientDevice, tokens: &[u64]) -> Vec<(u64, Result<Duration, MemoryError>)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    while !tokens.iter().all(|t| got.iter().any(|(g, _)| g == t)) {
        assert!(Instant::now() < deadline, "moves {tokens:?} did not end in 60 s: {got:?}");
        d.take_moved(&mut got);
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

/// [`device_or_skip`] for a test of moves: `None` too, with a line saying
/// so, where the GPU cannot map memory (no moves there); else the device
/// and its swap granularity.
fn swapping_device_or_skip(test: &str) -> Option<(ClientDevice, u64)> {
    let d = device_or_skip(test)?;
    let Some(g) = d.swap_granularity() else {
        eprintln!("SKIPPED {test}: this GPU cannot map memory");
        return None;
    };
    Some((d, g))
}

/// A buffer holding `data` (copied from pinned host memory, copy 1), that
/// pinned source, and pinned host memory of its size to read it back into.
fn filled(d: &mut ClientDevice, data: &[u8]) -> (u64, Pinned, Pinned) {
    let n = data.len();
    let a = d.alloc(n as u64).expect("alloc a");
    let mut src = Pinned::new(d, data.to_vec());
    let back = Pinned::new(d, vec![0u8; n]);
    copy(d, 1, ClientWork::ToDevice { dst: a, src: src.ptr(), bytes: n as u64 }, n as u64);
    (a, src, back)
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed).collect()
}

#[test]
fn buffers_moved_out_and_back_on_the_mover_keep_their_bytes_and_addresses() {
    let test = test_name!();
    let Some((mut d, g)) = swapping_device_or_skip(test) else { return };
    // Through the ring only (the pinned pool's test is below).
    d.set_swap_pinned(0);
    // 300 MiB and a bit: more than the ring's 4 x 64 MiB, and not a multiple of a chunk.
    let n = (300 << 20) + 4096 * 3;
    let (a, b) = (d.alloc(n as u64).expect("alloc a"), d.alloc(n as u64).expect("alloc b"));
    assert!(n as u64 >= g);
    let mut data_a = pattern(n, 1);
    data_a[..8].copy_from_slice(&b.to_le_bytes());
    let data_b = pattern(n, 2);
    let mut src_a = Pinned::new(&mut d, data_a.clone());
    let mut src_b = Pinned::new(&mut d, data_b.clone());
    let mut back = Pinned::new(&mut d, vec![0u8; n]);
    copy(&mut d, 1, ClientWork::ToDevice { dst: a, src: src_a.ptr(), bytes: n as u64 }, n as u64);
    copy(&mut d, 2, ClientWork::ToDevice { dst: b, src: src_b.ptr(), bytes: n as u64 }, n as u64);
    let before = d.mem_info().expect("mem info").0;
    d.start_move(10, true, a).expect("evict a");
    d.start_move(11, true, b).expect("evict b");
    assert!(d.start_move(12, true, a).is_err(), "a move of a buffer under way is refused");
    // The device's own thread works meanwhile: a copy of a buffer not moving.
    let c = d.alloc(1 << 20).expect("alloc c");
    copy(&mut d, 3, ClientWork::Memset { dst: c, value: 7, bytes: 1 << 20 }, 1 << 20);
    for (t, r) in wait_moves(&mut d, &[10, 11]) {
        r.unwrap_or_else(|e| panic!("move {t}: {e}"));
    }
    let after = d.mem_info().expect("mem info").0;
    assert!(after >= before + 2 * n as u64 - (64 << 20), "evictions gave the memory back: {before} -> {after} free");
    d.start_move(20, false, b).expect("restore b");
    d.start_move(21, false, a).expect("restore a");
    for (t, r) in wait_moves(&mut d, &[20, 21]) {
        r.unwrap_or_else(|e| panic!("move {t}: {e}"));
    }
    copy(&mut d, 4, ClientWork::ToHost { src: a, dst: back.ptr(), bytes: n as u64 }, n as u64);
    assert!(back.0 == data_a, "a came back bitwise");
    assert_eq!(u64::from_le_bytes(back.0[..8].try_into().expect("8 bytes")), b, "the pointer in a still names b");
    copy(&mut d, 5, ClientWork::ToHost { src: b, dst: back.ptr(), bytes: n as u64 }, n as u64);
    assert!(back.0 == data_b, "b came back bitwise");

    // Born evicted: zeros; freed while its move is under way: nothing left.
    let z = d.reserve_evicted(n as u64).expect("reserve");
    d.start_move(30, false, z).expect("restore z");
    wait_moves(&mut d, &[30])[0].1.as_ref().expect("restore z");
    copy(&mut d, 6, ClientWork::ToHost { src: z, dst: back.ptr(), bytes: n as u64 }, n as u64);
    assert!(back.0.iter().all(|&x| x == 0), "a buffer born evicted comes back as zeros");
    // Born evicted again: the mover faults host memory in ahead for the
    // eviction that makes its room, and that eviction writes into it.
    let z2 = d.reserve_evicted(n as u64).expect("reserve z2");
    d.start_move(31, true, a).expect("evict a into memory faulted in ahead");
    d.start_move(32, false, z2).expect("restore z2");
    // A buffer under way is refused a second move (see above): `a` comes
    // back only once its eviction was taken, as the daemon's core does
    // (it starts a client's restore after the moves before it ended).
    assert!(d.start_move(33, false, a).is_err(), "a restore of a buffer whose eviction is under way is refused");
    for (t, r) in wait_moves(&mut d, &[31, 32]) {
        r.unwrap_or_else(|e| panic!("move {t}: {e}"));
    }
    d.start_move(33, false, a).expect("restore a");
    for (t, r) in wait_moves(&mut d, &[33]) {
        r.unwrap_or_else(|e| panic!("move {t}: {e}"));
    }
    copy(&mut d, 7, ClientWork::ToHost { src: a, dst: back.ptr(), bytes: n as u64 }, n as u64);
    assert!(back.0 == data_a, "a came back bitwise through memory faulted in ahead");
    d.free(z2).expect("free z2");
    d.start_move(40, true, a).expect("evict a again");
    d.free(a).expect("free a while it moves");
    for p in [b, c, z] {
        d.free(p).expect("free");
    }
    let mut left = Vec::new();
    d.take_moved(&mut left);
    assert!(left.iter().any(|(t, _)| *t == 40), "the move of a freed buffer still ends: {left:?}");
    assert_eq!(d.allocated(), 0, "nothing left");
    d.unregister_host(src_a.ptr().0);
    d.unregister_host(src_b.ptr().0);
    d.unregister_host(back.ptr().0);
}

/// Evicts and restores `a` (`n` bytes, holding `data`) until a round trip
/// goes wholly straight through pinned memory or `rounds` are done; checks
/// its bytes after each. Returns the rounds made and whether the last was direct.
fn round_trips(d: &mut ClientDevice, a: u64, n: usize, data: &[u8], back: &mut Pinned, rounds: u64) -> (u64, bool) {
    for r in 0..rounds {
        let before = d.swap_moved_direct();
        d.start_move(100 + 2 * r, true, a).expect("evict");
        wait_moves(d, &[100 + 2 * r])[0].1.as_ref().expect("evict");
        d.start_move(101 + 2 * r, false, a).expect("restore");
        wait_moves(d, &[101 + 2 * r])[0].1.as_ref().expect("restore");
        back.0.fill(0);
        copy(d, 200 + r, ClientWork::ToHost { src: a, dst: back.ptr(), bytes: n as u64 }, n as u64);
        assert!(back.0 == data, "round {r}: a came back bitwise");
        let after = d.swap_moved_direct();
        let (direct, moved) = (after.0 - before.0, after.1 - before.1);
        assert!(moved > 0 && direct <= moved, "round {r}: {direct} of {moved} bytes straight");
        if direct == moved {
            return (r + 1, true);
        }
        // The mover grows the pool while it has nothing to move.
        std::thread::sleep(Duration::from_millis(200));
    }
    (rounds, false)
}

#[test]
fn moves_go_straight_through_the_pinned_pool_and_never_past_its_cap() {
    let test = test_name!();
    let Some((mut d, _)) = swapping_device_or_skip(test) else { return };
    // 300 MiB and a bit: more than a pinned piece (128 MiB), not a multiple of one.
    let n = (300 << 20) + 4096 * 5;
    d.set_swap_pinned(1 << 30);
    let data = pattern(n, 3);
    let (a, mut src, mut back) = filled(&mut d, &data);
    // The pool is empty: the first eviction makes a copy and pins it on its path, straight.
    let (rounds, direct) = round_trips(&mut d, a, n, &data, &mut back, 5);
    assert!(direct, "after {rounds} round trips, moves still went through the ring: {:?}", d.swap_moved_direct());
    assert_eq!(rounds, 1, "the first round trip is straight: its copy was pinned on the eviction's path");
    // The copy is reused: the next round trip is straight too, with no growth between.
    let (again, direct) = round_trips(&mut d, a, n, &data, &mut back, 1);
    assert!(again == 1 && direct, "the pinned copy was reused");
    // Freed while evicted: its copy goes back to the pool, and a buffer of
    // the same size evicted next is straight at once.
    d.start_move(500, true, a).expect("evict a");
    wait_moves(&mut d, &[500])[0].1.as_ref().expect("evict a");
    d.free(a).expect("free a while evicted");
    let b = d.alloc(n as u64).expect("alloc b");
    copy(&mut d, 2, ClientWork::ToDevice { dst: b, src: src.ptr(), bytes: n as u64 }, n as u64);
    let (first, direct) = round_trips(&mut d, b, n, &data, &mut back, 1);
    assert!(first == 1 && direct, "a freed buffer's pinned copy was reused at once");
    d.free(b).expect("free b");
    assert_eq!(d.allocated(), 0, "nothing left");
    d.unregister_host(src.ptr().0);
    d.unregister_host(back.ptr().0);

    // A cap below the buffer: nothing is pinned for it, every move goes through the ring.
    drop(d);
    let Some(mut d) = device_or_skip(test) else { return };
    d.set_swap_pinned(64 << 20);
    let (a, mut src, mut back) = filled(&mut d, &data);
    let (rounds, direct) = round_trips(&mut d, a, n, &data, &mut back, 5);
    assert!(rounds == 5 && !direct, "past the cap, no move is straight");
    assert_eq!(d.swap_moved_direct().0, 0, "no byte went straight past the cap");
    d.free(a).expect("free a");
    d.unregister_host(src.ptr().0);
    d.unregister_host(back.ptr().0);
}

/// The pool's chunks (`client/pinned_pool.rs`), 128 MiB each.
const CHUNK: usize = 128 << 20;

/// Waits up to 30 s for the pool to hold `bytes` or more (`at_least`), or
/// at most `bytes`; returns what it holds.
fn pool_reaches(d: &ClientDevice, bytes: usize, at_least: bool) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = d.swap_pinned_held();
        if (at_least && held >= bytes) || (!at_least && held <= bytes) {
            return held;
        }
        assert!(Instant::now() < deadline, "the pinned pool holds {held} bytes after 30 s, not {bytes}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn the_pool_grows_ahead_in_chunks_and_the_first_eviction_finds_them_pinned() {
    let test = test_name!();
    let Some((mut d, _)) = swapping_device_or_skip(test) else { return };
    // Two chunks and 5/8 of one (a multiple of the 2 MiB granularity): its
    // copy is three chunks, the last one part filled.
    let n = 2 * CHUNK + 5 * CHUNK / 8;
    d.set_swap_pinned(2 << 30);
    let data = pattern(n, 7);
    let (a, mut src, mut back) = filled(&mut d, &data);
    assert_eq!(d.swap_pinned_held(), 0, "nothing oversubscribed: nothing pinned ahead");
    // A buffer born evicted: oversubscribed. The pool grows, before any
    // eviction, to the two buffers' bytes, in whole chunks.
    let z = d.reserve_evicted(n as u64).expect("a buffer born evicted");
    let level = 2 * n;
    let held = pool_reaches(&d, level, true);
    assert!(held < level + CHUNK, "grown to its level in whole chunks and no further: {held} for {level}");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(d.swap_pinned_held(), held, "and stays there");
    // The first eviction, of a size the pool never saw, takes chunks pinned
    // ahead: all of it straight, and nothing made or pinned on its path.
    let before = d.swap_moved_direct();
    d.start_move(10, true, a).expect("evict a");
    wait_moves(&mut d, &[10])[0].1.as_ref().expect("evict a");
    let after = d.swap_moved_direct();
    assert_eq!(after.1 - before.1, n as u64, "one eviction of a");
    assert_eq!(after.0 - before.0, n as u64, "wholly straight from pinned memory");
    assert_eq!(d.swap_pinned_held(), held, "its chunks were pinned ahead");
    d.start_move(11, false, a).expect("restore a");
    wait_moves(&mut d, &[11])[0].1.as_ref().expect("restore a");
    back.0.fill(0);
    copy(&mut d, 2, ClientWork::ToHost { src: a, dst: back.ptr(), bytes: n as u64 }, n as u64);
    assert!(back.0 == data, "a came back bitwise, across its chunks' boundaries");
    // Its owner gone: no bytes left to hold ahead, and the pool gives its chunks back.
    d.free(z).expect("free z");
    d.free(a).expect("free a");
    assert_eq!(pool_reaches(&d, 0, false), 0, "nothing pinned left");
    assert_eq!(d.allocated(), 0, "nothing allocated left");
    d.unregister_host(src.ptr().0);
    d.unregister_host(back.ptr().0);
}

#[test]
fn the_pool_grows_from_the_start_when_asked_and_serves_the_first_eviction() {
    let test = test_name!();
    let Some((mut d, _)) = swapping_device_or_skip(test) else { return };
    // What gpumuxd's GPUMUX_SWAP_AHEAD asks: three chunks before anything is allocated.
    d.set_swap_pinned(1 << 30);
    d.set_swap_ahead(3 * CHUNK);
    assert_eq!(pool_reaches(&d, 3 * CHUNK, true), 3 * CHUNK, "three chunks, no more");
    let n = 2 * CHUNK + 5 * CHUNK / 8;
    let data = pattern(n, 9);
    let (a, mut src, mut back) = filled(&mut d, &data);
    let before = d.swap_moved_direct();
    d.start_move(10, true, a).expect("evict a");
    wait_moves(&mut d, &[10])[0].1.as_ref().expect("evict a");
    let after = d.swap_moved_direct();
    assert_eq!(after.0 - before.0, n as u64, "the first eviction went wholly straight");
    assert_eq!(d.swap_pinned_held(), 3 * CHUNK, "into the chunks pinned from the start");
    d.start_move(11, false, a).expect("restore a");
    wait_moves(&mut d, &[11])[0].1.as_ref().expect("restore a");
    copy(&mut d, 2, ClientWork::ToHost { src: a, dst: back.ptr(), bytes: n as u64 }, n as u64);
    assert!(back.0 == data, "a came back bitwise");
    d.free(a).expect("free a");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(d.swap_pinned_held(), 3 * CHUNK, "what was asked from the start stays");
    d.unregister_host(src.ptr().0);
    d.unregister_host(back.ptr().0);
}

//! Issue 36, case 0: a launch the device cannot run fails its own client with
//! the reason, and nobody else notices. On 717b546 a grid of (1, 70000, 1)
//! stopped the daemon for every client on a GPU (`cuLaunchKernel` refused
//! it in the device process), and one of 2^31 − 1 blocks ran nothing and
//! synced clean; the simulated device accepted both.
//!
//! Random launch shapes, CUDA's limits ±1 included, from one client, while
//! another launches correct kernels throughout: each launch either runs
//! (its sync is clean) or fails at the next sync with `Invalid` and the
//! limit it broke, as an oracle written here from CUDA's table says; the
//! bystander never sees an error and the daemon never stops.
//!
//! On a GPU (`GPUMUXD_TEST_DEVICE=cuda:0 GPUMUXD_TEST_BIN=.../gpumuxd`, as
//! `scripts/daemon-gpu-check.sh` runs it) a launch that runs must also have
//! run: its block (0, 0, 0) writes a word the test reads back.

mod common;

use common::Daemon;
use gpumux_client::{Arg, Client, ConnectOptions, ErrorKind, LaunchConfig};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SOURCE: &str = "extern \"C\" __global__ void k(unsigned* out) {\n\
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) *out = 0x600du;\n\
}\n";
/// What block (0, 0, 0) writes.
const MARK: u32 = 0x600d;
/// On a GPU a worker's own shared memory (its control words) comes off the
/// kernel's 48 KiB, so launches this close below it may go either way there.
const SMEM_SLACK: u64 = 256;

/// CUDA's limits (compute capability 3.0 and later), written out again here
/// rather than taken from the daemon: the oracle must not share its bugs.
const GRID: [u64; 3] = [(1 << 31) - 1, 65_535, 65_535];
const BLOCK: [u64; 3] = [1024, 1024, 64];
/// Blocks a launch may have: the workers' 31-bit block index, less one.
const MOST_BLOCKS: u64 = (1 << 31) - 2;
/// Dynamic shared memory of a kernel that did not opt in to more.
const DYNAMIC_SMEM: u64 = 48 * 1024;

/// Valid launches of more blocks than this are not generated: they are
/// right, and run, but their simulated time is the test's whole budget
/// (bounded device steps are issue 36's case 4).
const MOST_BLOCKS_RUN: u64 = 1 << 20;

#[derive(Clone, Debug)]
struct Shape {
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
}

impl Shape {
    fn blocks(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }

    /// Whether CUDA (and so the daemon) accepts it.
    fn valid(&self) -> bool {
        let threads: u64 = self.block.iter().map(|&b| b as u64).product();
        (0..3)
            .all(|i| (1..=GRID[i]).contains(&(self.grid[i] as u64)) && (1..=BLOCK[i]).contains(&(self.block[i] as u64)))
            && self.blocks() <= MOST_BLOCKS
            && threads <= 1024
            && (self.shared as u64) <= DYNAMIC_SMEM
    }

    /// Whether a GPU may refuse it though the oracle says it is valid: its
    /// dynamic shared memory is within the workers' own of the limit.
    fn borderline(&self) -> bool {
        (DYNAMIC_SMEM - SMEM_SLACK..=DYNAMIC_SMEM).contains(&(self.shared as u64))
    }
}

/// Mostly 1, else one of `edges` (the limits and their neighbours).
fn dim(edges: &'static [u32]) -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(1u32), 2 => proptest::sample::select(edges)]
}

fn shapes() -> impl Strategy<Value = Shape> {
    const GX: &[u32] = &[0, 2, 32, 65_535, 65_536, (1 << 31) - 2, (1 << 31) - 1, 1 << 31, u32::MAX];
    const GYZ: &[u32] = &[0, 2, 1024, 65_534, 65_535, 65_536, u32::MAX];
    const BXY: &[u32] = &[0, 32, 1023, 1024, 1025, u32::MAX];
    const BZ: &[u32] = &[0, 2, 63, 64, 65];
    const SMEM: &[u32] = &[1, 1024, 48 * 1024 - 1, 48 * 1024, 48 * 1024 + 1, 233_472, u32::MAX];
    (dim(GX), dim(GYZ), dim(GYZ), dim(BXY), dim(BXY), dim(BZ), prop_oneof![Just(0u32), proptest::sample::select(SMEM)])
        .prop_map(|(gx, gy, gz, bx, by, bz, shared)| Shape { grid: [gx, gy, gz], block: [bx, by, bz], shared })
        .prop_filter("a valid launch of more blocks than the test runs", |s| {
            !s.valid() || s.blocks() <= MOST_BLOCKS_RUN
        })
}

fn connect(d: &Daemon, name: &str) -> Client {
    Client::connect(ConnectOptions { socket: Some(d.socket.clone()), ..ConnectOptions::named(name) })
        .expect("a client connects")
}

#[test]
fn a_launch_over_any_limit_fails_its_own_client_and_nobody_else() {
    let mut d = Daemon::start(None);
    let stop = Arc::new(AtomicBool::new(false));
    let bystander_runs = Arc::new(AtomicU64::new(0));
    let bystander = {
        let (stop, runs, client) = (stop.clone(), bystander_runs.clone(), connect(&d, "bystander"));
        std::thread::spawn(move || {
            let k = client.load_module("b", SOURCE, &[]).unwrap().kernel("k").unwrap();
            let stream = client.create_stream().unwrap();
            let out = client.alloc(4).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let config = LaunchConfig::new([264, 1, 1], [128, 1, 1]).stream(stream).block_time_ns(2_000);
                client.launch(&k, &config, &[Arg::buffer(&out)]).expect("the bystander's launch");
                client.sync(stream).expect("the bystander's sync is never touched by the other client");
                runs.fetch_add(1, Ordering::Relaxed);
            }
            client.close().unwrap();
        })
    };

    // The bystander's first kernel needs its module compiled and its shape timed, which on a
    // GPU can outlast the whole property test: wait for it, so that "throughout" is what the
    // final assertion checks (on the H200 the test once ended before the bystander's first
    // sync, 1 run in 13, and failed for it).
    let deadline = Instant::now() + Duration::from_secs(60);
    while bystander_runs.load(Ordering::Relaxed) == 0 {
        assert!(!bystander.is_finished(), "the bystander stopped before its first kernel ran");
        assert!(Instant::now() < deadline, "the bystander ran no kernel within 60 s of connecting");
        std::thread::sleep(Duration::from_millis(5));
    }
    let bystander_before = bystander_runs.load(Ordering::Relaxed);

    let client = connect(&d, "shapes");
    let k = client.load_module("m", SOURCE, &[]).unwrap().kernel("k").unwrap();
    let stream = client.create_stream().unwrap();
    let out = client.alloc(4).unwrap();
    let real = !client.is_simulated();
    let (ran, refused) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    let mut runner = TestRunner::new(Config { cases: 160, failure_persistence: None, ..Config::default() });
    let result = runner.run(&shapes(), |s| {
        let config = LaunchConfig::new(s.grid, s.block).shared_bytes(s.shared).stream(stream).block_time_ns(100);
        client.memset(&out, 0, 0, 4, stream).expect("the mark cleared");
        // Launches do not wait for the daemon: a refusal comes at the sync.
        client.launch(&k, &config, &[Arg::buffer(&out)]).expect("a launch call returns at once");
        let synced = client.sync(stream);
        let mut word = [0u8; 4];
        if real && synced.is_ok() {
            client.copy_to_host(&out, 0, &mut word, stream).expect("the mark read back");
        }
        if real && s.valid() && s.borderline() && synced.is_err() {
            // Within the workers' own shared memory of the limit: refused is right too.
            refused.set(refused.get() + 1);
        } else if s.valid() {
            prop_assert!(synced.is_ok(), "{s:?} is within every limit and failed: {}", synced.unwrap_err());
            if real {
                prop_assert_eq!(u32::from_le_bytes(word), MARK, "{:?} synced clean but did not run", s);
            }
            ran.set(ran.get() + 1);
        } else {
            let e = synced.expect_err("over a limit, and synced clean");
            prop_assert_eq!(e.kind(), Some(&ErrorKind::Invalid), "{:?}: {}", s, e);
            let said = e.to_string();
            prop_assert!(
                said.contains("limit") || said.contains("at least 1"),
                "{s:?}: the error names the limit it broke: {said}"
            );
            refused.set(refused.get() + 1);
            // Reported once: the stream is clean again.
            prop_assert!(client.sync(stream).is_ok(), "the error stayed after it was reported");
        }
        Ok(())
    });
    stop.store(true, Ordering::Relaxed);
    bystander.join().expect("the bystander finished without an error");
    result.unwrap();
    let (ran, refused) = (ran.get(), refused.get());
    assert!(ran > 10 && refused > 10, "both sides of the limits were tried: {ran} ran, {refused} refused");
    let bystander_during = bystander_runs.load(Ordering::Relaxed) - bystander_before;
    assert!(bystander_during > 0, "the bystander ran kernels throughout: {bystander_during} while the shapes ran");
    client.close().unwrap();
    assert!(d.alive(), "the daemon is still serving");
}

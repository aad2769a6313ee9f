//! The bench's jobs: what one stream of a role process does, written once
//! against [`JobGpu`] so the native baselines and the gpumuxd clients run
//! the same launches. Each job prepares (buffers, inputs, warm-up launches:
//! through gpumuxd the first launch of a kernel is the one that measures its
//! block time), waits for the common start, runs, and checks its own work.

use super::copier::{self, CopierResult};
use super::gpu::{HostMemory, JobGpu, KArg};
use super::programs::{self, Program, ProgramResult};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Threads per block of every bench kernel but `sgemm` (16 × 16, also 256).
pub const THREADS: u32 = 256;
/// Bytes of an output compared bitwise across settings.
const CHECKSUM_BYTES: u64 = 4 << 20;

/// A kernel the co-run experiment loops over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopKernel {
    /// STREAM triad on 3 × 256 MiB (memory-bound).
    Triad,
    /// Register FMA chains (compute-bound).
    Fma,
    /// Tiled SGEMM, 1024 × 1024.
    Sgemm,
    /// 256-bin histogram of 64 MiB (shared-memory atomics).
    Histogram,
}

impl LoopKernel {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            LoopKernel::Triad => "triad",
            LoopKernel::Fma => "fma",
            LoopKernel::Sgemm => "sgemm",
            LoopKernel::Histogram => "histogram",
        }
    }
}

/// One job (module doc).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Job {
    /// High priority: `launches` small kernels (`blocks` blocks spinning
    /// `spin_ns`) at random moments (a gap uniform in `gap_us`), each launch
    /// followed by a sync; the turnaround of each, host call to sync return.
    Urgent { launches: u32, blocks: u32, spin_ns: u64, gap_us: (u64, u64), seed: u64 },
    /// Low priority: keeps the GPU full with launches of `blocks` blocks that
    /// spin `block_us` each, two in flight, until told to stop.
    Fill { block_us: u64, blocks: u32, pause_ns: u32 },
    /// `launches` launches of `kernel`, at most 24 queued.
    Loop { kernel: LoopKernel, launches: u32 },
    /// An empty kernel's launch + sync, `trials` times, `idle_us` apart
    /// (0: back to back; else the client and the daemon's threads have gone
    /// to sleep between two, as an urgent client's have).
    Latency { trials: u32, idle_us: u32 },
    /// `launches` asynchronous launches of an empty kernel, then one sync.
    Rate { launches: u32 },
    /// The GPU's SMs and resident `spin` blocks per SM (what the plans need).
    Probe,
    /// `reps` timed repetitions of a whole program, each checked against its
    /// CPU reference ([`programs`]).
    Program { program: Program, reps: u32 },
    /// `bytes` up and down from host memory `host`, round after round,
    /// until told to stop ([`copier`]).
    Copier { host: HostMemory, bytes: u64 },
}

impl Job {
    /// Whether it runs at high priority.
    pub fn urgent(&self) -> bool {
        matches!(self, Job::Urgent { .. })
    }
    /// Whether it ends by itself (the others run until stopped).
    pub fn finite(&self) -> bool {
        !matches!(self, Job::Fill { .. } | Job::Copier { .. })
    }
}

/// What a job measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum JobResult {
    Urgent {
        /// Turnaround of each launch, ns.
        turnaround_ns: Vec<u64>,
        /// Blocks the kernels counted / blocks launched (warm-up included).
        blocks_done: u64,
        blocks_launched: u64,
    },
    Fill {
        /// Blocks of the launches that completed before the stop, over the
        /// time from the start to the last of those completions.
        blocks_per_s: f64,
        blocks_done: u64,
        blocks_launched: u64,
        launches: u64,
    },
    Loop {
        /// From the common start to the last launch's end.
        elapsed_ns: u64,
        /// FNV-1a of the output's first 4 MiB (compared across settings).
        checksum: u64,
    },
    Latency {
        ns: Vec<u64>,
    },
    Rate {
        /// CLOCK_MONOTONIC at the first launch and after the sync (comparable across processes).
        start_ns: u64,
        end_ns: u64,
        launches: u64,
    },
    Probe {
        sms: u32,
        per_sm: u32,
    },
    Program(ProgramResult),
    Copier(CopierResult),
}

/// CLOCK_MONOTONIC in ns: the same clock in every process of the machine.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// FNV-1a, 64 bits.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// splitmix64: the urgent job's gaps, the same for the same seed in every setting.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn grid(blocks: u32) -> [u32; 3] {
    [blocks, 1, 1]
}
const BLOCK: [u32; 3] = [THREADS, 1, 1];
/// Warm-up launches of a kernel before the start.
const WARMUP: u32 = 3;

/// A job ready to start: its buffers and what the run needs.
pub struct Prepared {
    job: Job,
    /// The buffer the run's check reads.
    out: usize,
    /// The loop kernel's launch (grid, block, arguments, block time hint).
    launch: Option<LoopLaunch>,
    /// Blocks launched so far (warm-up).
    launched: u64,
    /// A program's buffers and reference.
    program: Option<programs::Ready>,
    /// A copier's buffers.
    copier: Option<copier::Copier>,
}

struct LoopLaunch {
    kernel: &'static str,
    grid: [u32; 3],
    block: [u32; 3],
    args: Vec<KArg>,
    block_ns: u64,
}

/// The loop kernel's buffers, inputs and launch.
fn prepare_loop(gpu: &mut dyn JobGpu, kernel: LoopKernel) -> Result<(usize, LoopLaunch)> {
    let init = |gpu: &mut dyn JobGpu, kernel: &str, buf: usize, n: u64, seed: u32| {
        gpu.launch(kernel, grid(1024), BLOCK, &[KArg::Buf(buf), KArg::U64(n), KArg::U32(seed)], 5_000)
    };
    Ok(match kernel {
        LoopKernel::Triad => {
            let n4: u32 = 16 << 20;
            let bytes = n4 as u64 * 16;
            let (a, b, c) = (gpu.alloc(bytes)?, gpu.alloc(bytes)?, gpu.alloc(bytes)?);
            init(gpu, "init_f32", b, n4 as u64 * 4, 1)?;
            init(gpu, "init_f32", c, n4 as u64 * 4, 2)?;
            let args = vec![KArg::Buf(a), KArg::Buf(b), KArg::Buf(c), KArg::F32(3.0), KArg::U32(n4)];
            (a, LoopLaunch { kernel: "triad", grid: grid(n4 / THREADS), block: BLOCK, args, block_ns: 1_000 })
        }
        LoopKernel::Fma => {
            let blocks = 4096;
            let out = gpu.alloc(blocks as u64 * THREADS as u64 * 4)?;
            let args = vec![KArg::Buf(out), KArg::U32(4096)];
            (out, LoopLaunch { kernel: "fma_loop", grid: grid(blocks), block: BLOCK, args, block_ns: 60_000 })
        }
        LoopKernel::Sgemm => {
            let n: u32 = 1024;
            let bytes = n as u64 * n as u64 * 4;
            let (a, b, c) = (gpu.alloc(bytes)?, gpu.alloc(bytes)?, gpu.alloc(bytes)?);
            init(gpu, "init_f32", a, n as u64 * n as u64, 3)?;
            init(gpu, "init_f32", b, n as u64 * n as u64, 4)?;
            let args = vec![KArg::Buf(a), KArg::Buf(b), KArg::Buf(c), KArg::I32(n as i32)];
            (c, LoopLaunch { kernel: "sgemm", grid: [n / 16, n / 16, 1], block: [16, 16, 1], args, block_ns: 40_000 })
        }
        LoopKernel::Histogram => {
            let n: u32 = 64 << 20;
            let data = gpu.alloc(n as u64)?;
            let bins = gpu.alloc(256 * 4)?;
            init(gpu, "init_bytes", data, n as u64, 5)?;
            let args = vec![KArg::Buf(data), KArg::U32(n), KArg::Buf(bins)];
            (bins, LoopLaunch { kernel: "histogram", grid: grid(2048), block: BLOCK, args, block_ns: 30_000 })
        }
    })
}

/// One launch of `spin`: `blocks` blocks spinning `ns` each (sleeping
/// `pause_ns` between clock reads), counting themselves in `out`.
fn launch_spin(gpu: &mut dyn JobGpu, blocks: u32, ns: u64, out: usize, pause_ns: u32) -> Result<()> {
    gpu.launch("spin", grid(blocks), BLOCK, &[KArg::U64(ns), KArg::Buf(out), KArg::U32(pause_ns)], ns)
}

/// Buffers, inputs and warm-up launches of `job` (everything before the start).
pub fn prepare(gpu: &mut dyn JobGpu, job: &Job) -> Result<Prepared> {
    let mut p = Prepared { job: job.clone(), out: 0, launch: None, launched: 0, program: None, copier: None };
    match *job {
        Job::Urgent { blocks, spin_ns, .. } => {
            p.out = gpu.alloc(4)?;
            for _ in 0..WARMUP {
                launch_spin(gpu, blocks, spin_ns, p.out, 0)?;
                p.launched += blocks as u64;
            }
        }
        Job::Fill { block_us, blocks, pause_ns } => {
            p.out = gpu.alloc(4)?;
            // One launch of a single wave: the daemon measures the block time on it.
            let ns = block_us * 1000;
            launch_spin(gpu, blocks.min(1024), ns, p.out, pause_ns)?;
            p.launched += blocks.min(1024) as u64;
        }
        Job::Loop { kernel, .. } => {
            let (out, l) = prepare_loop(gpu, kernel)?;
            for _ in 0..WARMUP {
                gpu.launch(l.kernel, l.grid, l.block, &l.args, l.block_ns)?;
            }
            p.out = out;
            p.launch = Some(l);
        }
        Job::Probe => {}
        Job::Program { program, .. } => p.program = Some(programs::prepare(gpu, program)?),
        Job::Copier { host, bytes } => p.copier = Some(copier::prepare(gpu, host, bytes)?),
        Job::Latency { .. } | Job::Rate { .. } => {
            for _ in 0..100 {
                gpu.launch("empty", grid(1), [32, 1, 1], &[], 1_000)?;
            }
        }
    }
    gpu.sync()?;
    Ok(p)
}

/// Runs a prepared job from the common start; `stop` ends a `Fill`.
pub fn run(gpu: &mut dyn JobGpu, mut p: Prepared, stop: &AtomicBool) -> Result<JobResult> {
    match p.job.clone() {
        Job::Urgent { launches, blocks, spin_ns, gap_us: (lo, hi), seed } => {
            let mut rng = seed;
            let mut turnaround_ns = Vec::with_capacity(launches as usize);
            for _ in 0..launches {
                let gap = lo + next_random(&mut rng) % (hi.saturating_sub(lo) + 1);
                std::thread::sleep(Duration::from_micros(gap));
                let t0 = Instant::now();
                launch_spin(gpu, blocks, spin_ns, p.out, 0)?;
                gpu.sync()?;
                turnaround_ns.push(t0.elapsed().as_nanos() as u64);
                p.launched += blocks as u64;
            }
            let blocks_done = read_u32(gpu, p.out)?;
            Ok(JobResult::Urgent { turnaround_ns, blocks_done, blocks_launched: p.launched })
        }
        Job::Fill { block_us, blocks, pause_ns } => {
            let ns = block_us * 1000;
            let t0 = Instant::now();
            let (mut issued, mut completed, mut last_done) = (0u64, 0u64, t0);
            let mut counted: Option<(u64, Instant)> = None;
            while !stop.load(Ordering::Relaxed) || issued == 0 {
                launch_spin(gpu, blocks, ns, p.out, pause_ns)?;
                gpu.mark()?;
                issued += 1;
                p.launched += blocks as u64;
                gpu.wait_marks(1)?;
                if issued >= 2 {
                    completed = issued - 1;
                    last_done = Instant::now();
                }
                if stop.load(Ordering::Relaxed) && counted.is_none() {
                    counted = Some((completed, last_done));
                }
            }
            gpu.sync()?;
            let (completed, last_done) = counted.unwrap_or((completed, last_done));
            let span = last_done.duration_since(t0).as_secs_f64();
            let blocks_per_s = if span > 0.0 { (completed * blocks as u64) as f64 / span } else { 0.0 };
            let blocks_done = read_u32(gpu, p.out)?;
            Ok(JobResult::Fill { blocks_per_s, blocks_done, blocks_launched: p.launched, launches: issued })
        }
        Job::Loop { launches, .. } => {
            let Some(l) = p.launch.take() else { bail!("a loop job without its launch") };
            let t0 = Instant::now();
            for i in 0..launches {
                gpu.launch(l.kernel, l.grid, l.block, &l.args, l.block_ns)?;
                // A mark every 8 launches, at most 2 marks ahead: up to 24
                // launches queued, as a program that launches a loop of
                // kernels and syncs now and then keeps them.
                if i % 8 == 7 {
                    gpu.mark()?;
                    gpu.wait_marks(2)?;
                }
            }
            gpu.sync()?;
            let elapsed_ns = t0.elapsed().as_nanos() as u64;
            let checksum = fnv1a(&gpu.download(p.out, CHECKSUM_BYTES)?);
            Ok(JobResult::Loop { elapsed_ns, checksum })
        }
        Job::Latency { trials, idle_us } => {
            let mut ns = Vec::with_capacity(trials as usize);
            for _ in 0..trials {
                if idle_us > 0 {
                    std::thread::sleep(std::time::Duration::from_micros(idle_us as u64));
                }
                let t0 = Instant::now();
                gpu.launch("empty", grid(1), [32, 1, 1], &[], 1_000)?;
                gpu.sync()?;
                ns.push(t0.elapsed().as_nanos() as u64);
            }
            Ok(JobResult::Latency { ns })
        }
        Job::Rate { launches } => {
            let start_ns = monotonic_ns();
            for i in 0..launches {
                gpu.launch("empty", grid(1), [32, 1, 1], &[], 1_000)?;
                // A mark every 256 launches, at most 4 ahead: bounded queues
                // (the daemon limits queued operations per client).
                if i % 256 == 255 {
                    gpu.mark()?;
                    gpu.wait_marks(4)?;
                }
            }
            gpu.sync()?;
            Ok(JobResult::Rate { start_ns, end_ns: monotonic_ns(), launches: launches as u64 })
        }
        Job::Probe => {
            let (sms, per_sm) = gpu.shape("spin", THREADS)?;
            Ok(JobResult::Probe { sms, per_sm })
        }
        Job::Program { reps, .. } => {
            let Some(ready) = p.program.take() else { bail!("a program job without its buffers") };
            Ok(JobResult::Program(programs::run(gpu, ready, reps)?))
        }
        Job::Copier { .. } => {
            let Some(c) = p.copier.take() else { bail!("a copier job without its buffers") };
            Ok(JobResult::Copier(copier::run(gpu, c, stop)?))
        }
    }
}

fn read_u32(gpu: &mut dyn JobGpu, buf: usize) -> Result<u64> {
    let b = gpu.download(buf, 4)?;
    let w: [u8; 4] = b.get(..4).and_then(|s| s.try_into().ok()).unwrap_or_default();
    Ok(u32::from_le_bytes(w) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_are_the_same_for_the_same_seed_and_stay_in_range() {
        let (mut a, mut b) = (7u64, 7u64);
        for _ in 0..1000 {
            let (x, y) = (next_random(&mut a), next_random(&mut b));
            assert_eq!(x, y);
            assert!(500 + x % 2501 <= 3000);
        }
    }

    #[test]
    fn fnv1a_matches_its_reference_values() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn jobs_round_trip_through_json() {
        let jobs = vec![
            Job::Urgent { launches: 200, blocks: 132, spin_ns: 10_000, gap_us: (500, 3000), seed: 1 },
            Job::Fill { block_us: 100, blocks: 21_120, pause_ns: 0 },
            Job::Loop { kernel: LoopKernel::Triad, launches: 10 },
            Job::Copier { host: HostMemory::Pinned, bytes: 1 << 30 },
        ];
        let text = serde_json::to_string(&jobs).unwrap();
        let back: Vec<Job> = serde_json::from_str(&text).unwrap();
        assert_eq!(format!("{back:?}"), format!("{jobs:?}"));
        assert!(back[0].urgent() && back[0].finite() && !back[1].finite());
        assert!(!back[3].urgent() && !back[3].finite(), "a copier runs until stopped");
    }
}

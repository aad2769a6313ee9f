//! Preemption latency. A long low-priority `spin` kernel fills the GPU; a
//! short high-priority `probe` arrives at a random moment. The probe's blocks
//! write host-mapped flags, and a host thread spinning on them (not the one
//! issuing the calls) stamps arrival → first block and arrival → completion
//! on one clock for every mode:
//!
//! * `native-priority`: one process, probe on a high-priority stream (the
//!   hardware starts it as low-priority blocks finish);
//! * `gpumux`: the spin kernel runs as preemptible workers; at arrival the host
//!   sets its retreat flag and launches the probe's workers on a high-priority
//!   stream, then resumes the spin kernel; every spin block must run exactly once;
//! * `timeslice` / `mps`: the spin kernel runs in a second process (`lp-hog`),
//!   under the driver's default time slicing or under MPS if its daemon runs.

use crate::percentile;
use gpumux_cuda::error::{CudaError, Result};
use gpumux_cuda::exec::spin_for;
use gpumux_cuda::launch_plan::Chunk;
use gpumux_cuda::preempt::{SmMask, WorkerLaunch};
use gpumux_cuda::runtime::{DeviceBuffer, Function, Gpu, HostMapped, MappedWords, Params, Stream};
use gpumux_cuda::suite::{self, Rng};
use serde::Serialize;
use std::io::BufRead as _;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One way of preempting, at one block time of the low-priority kernel.
#[derive(Clone, Debug, Serialize)]
pub struct PreemptRow {
    /// How the urgent kernel gets the GPU (`native-priority`, `gpumux`, ...).
    pub mode: String,
    /// Block time of the low-priority kernel, µs.
    pub block_us: u64,
    /// Urgent arrivals measured.
    pub trials: u32,
    /// Arrival to the urgent kernel's first block, µs: p50, p99, max.
    pub first_us: [f64; 3],
    /// Arrival to the urgent kernel's completion, µs: p50, p99, max.
    pub done_us: [f64; 3],
    /// Probe alone on an idle GPU, same measurement (median µs to completion).
    pub idle_done_us: f64,
    /// Spin blocks that ran other than exactly once (gpumux only).
    pub lost_or_redone: Option<u64>,
    /// µs from arrival until the host's calls returned (the launch, and for
    /// gpumux the retreat request before it): p50, p99, max. What of the
    /// latency is host API time rather than the GPU making room.
    pub host_calls_us: [f64; 3],
    /// The slowest 2% of trials by time to first block: their mean host-call
    /// time and mean time to the first block.
    pub slowest_2pct_split_us: [f64; 2],
}

const PROBE_BLOCKS_PER_SM: u32 = 1;
const PROBE_THREADS: u32 = 256;
const PROBE_ITERS: u32 = 2000;
const SPIN_THREADS: u32 = 128;
/// How long a trial may take before the bench calls the probe lost.
const TRIAL_LIMIT: Duration = Duration::from_secs(20);

/// Host-mapped flag words the probe writes a trial's number into.
const FIRST_BLOCK: usize = 0;
const COMPLETED: usize = 1;

struct Probe {
    flags: HostMapped,
    done: DeviceBuffer,
    work: DeviceBuffer,
    grid: u32,
}

impl Probe {
    fn new(gpu: &Gpu) -> Result<Probe> {
        let grid = gpu.sm_count() * PROBE_BLOCKS_PER_SM;
        let done = DeviceBuffer::new(4)?;
        done.fill(0)?;
        Ok(Probe {
            flags: HostMapped::new(4 * (COMPLETED + 1))?,
            done,
            work: DeviceBuffer::new((grid * PROBE_THREADS * 4) as usize)?,
            grid,
        })
    }
    fn args(&self, trial: u32) -> Vec<Vec<u8>> {
        vec![
            self.flags.dev.to_le_bytes().to_vec(),
            self.done.ptr.to_le_bytes().to_vec(),
            self.work.ptr.to_le_bytes().to_vec(),
            PROBE_ITERS.to_le_bytes().to_vec(),
            trial.to_le_bytes().to_vec(),
        ]
    }
    /// Launches trial `trial` of the probe natively: its arrival time and µs
    /// until the launch call returned.
    fn launch_native(&self, trial: u32, f: &Function, s: &Stream) -> Result<(Instant, f64)> {
        let mut p = Params::default();
        for a in self.args(trial) {
            p.push_bytes(&a);
        }
        let t0 = Instant::now();
        // SAFETY: matches `probe`'s parameters.
        unsafe { f.launch([self.grid, 1, 1], [PROBE_THREADS, 1, 1], 0, s, &mut p)? };
        Ok((t0, t0.elapsed().as_secs_f64() * 1e6))
    }
}

/// When a trial's signals reached the host.
#[derive(Clone, Copy, Debug)]
struct Stamps {
    first: Instant,
    done: Instant,
}

/// Stamps the probe's flags from a host thread of its own, spinning while the
/// issuing thread makes its calls. Polling from the issuing thread would stamp
/// a first block no earlier than its last call's return, though the GPU does
/// not wait for calls queued after the launch (e.g. the event that marks the
/// launch's end): that is host time, reported apart as `host_calls_us`.
struct Watcher {
    /// Trial to watch (0: none yet).
    armed: AtomicU32,
    /// Trial the watcher is spinning on.
    ready: AtomicU32,
    quit: AtomicBool,
    result: Mutex<Option<std::result::Result<Stamps, &'static str>>>,
}

impl Watcher {
    fn new() -> Watcher {
        Watcher {
            armed: AtomicU32::new(0),
            ready: AtomicU32::new(0),
            quit: AtomicBool::new(false),
            result: Mutex::new(None),
        }
    }

    /// The watcher thread's loop: one trial per arming, until `quit`.
    fn run(&self, words: MappedWords<'_>) {
        let mut last = 0;
        while !self.quit.load(Ordering::Acquire) {
            let trial = self.armed.load(Ordering::Acquire);
            if trial == last {
                std::hint::spin_loop();
                continue;
            }
            last = trial;
            self.ready.store(trial, Ordering::Release);
            let r = self.watch(words, trial);
            if let Ok(mut slot) = self.result.lock() {
                *slot = Some(r);
            }
        }
    }

    fn watch(&self, words: MappedWords<'_>, trial: u32) -> std::result::Result<Stamps, &'static str> {
        let t0 = Instant::now();
        let first = loop {
            if words.read(FIRST_BLOCK) == trial {
                break Instant::now();
            }
            if t0.elapsed() > TRIAL_LIMIT || self.quit.load(Ordering::Relaxed) {
                return Err("probe never started");
            }
            std::hint::spin_loop();
        };
        while words.read(COMPLETED) != trial {
            if t0.elapsed() > TRIAL_LIMIT || self.quit.load(Ordering::Relaxed) {
                return Err("probe never finished");
            }
            std::hint::spin_loop();
        }
        Ok(Stamps { first, done: Instant::now() })
    }

    /// Arms the watcher for `trial` and returns once it spins on it, so that
    /// the trial's arrival can be stamped right after.
    fn arm(&self, trial: u32) -> Result<()> {
        self.result.lock().map_err(|_| CudaError::Check("probe watcher panicked".into()))?.take();
        self.armed.store(trial, Ordering::Release);
        let t = Instant::now();
        while self.ready.load(Ordering::Acquire) != trial {
            if t.elapsed() > TRIAL_LIMIT {
                return Err(CudaError::Check("probe watcher thread did not start".into()));
            }
            std::hint::spin_loop();
        }
        Ok(())
    }

    /// Waits for the armed trial's stamps, as µs since `t0`: (first block, completion).
    fn collect(&self, t0: Instant) -> Result<(f64, f64)> {
        loop {
            let r = self.result.lock().map_err(|_| CudaError::Check("probe watcher panicked".into()))?.take();
            if let Some(r) = r {
                let s = r.map_err(|e| CudaError::Check(e.into()))?;
                let us = |i: Instant| i.saturating_duration_since(t0).as_secs_f64() * 1e6;
                return Ok((us(s.first), us(s.done)));
            }
            std::hint::spin_loop();
        }
    }
}

/// One trial's stamps, µs since arrival.
#[derive(Clone, Copy, Debug, Default)]
struct Trial {
    /// The issuing thread's launch (and retreat) calls returned.
    calls: f64,
    first: f64,
    done: f64,
}

fn p50_p99_max(mut v: Vec<f64>) -> [f64; 3] {
    [percentile(&mut v, 50.0), percentile(&mut v, 99.0), percentile(&mut v, 100.0)]
}

fn summarize(mode: &str, block_us: u64, trials: &[Trial], idle: f64, lost: Option<u64>) -> PreemptRow {
    let f = p50_p99_max(trials.iter().map(|t| t.first).collect());
    let d = p50_p99_max(trials.iter().map(|t| t.done).collect());
    let c = p50_p99_max(trials.iter().map(|t| t.calls).collect());
    let mut by_first = trials.to_vec();
    by_first.sort_by(|a, b| b.first.total_cmp(&a.first));
    let slow = &by_first[..by_first.len().div_ceil(50).min(by_first.len())];
    let n = slow.len().max(1) as f64;
    let split = [slow.iter().map(|t| t.calls).sum::<f64>() / n, slow.iter().map(|t| t.first).sum::<f64>() / n];
    println!(
        "{:<16} {:>8} {:>6} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8.1} {:>6}",
        mode,
        block_us,
        trials.len(),
        f[0],
        f[1],
        f[2],
        d[0],
        d[1],
        d[2],
        idle,
        lost.map_or("-".to_string(), |l| l.to_string())
    );
    let before = trials.iter().filter(|t| t.first < t.calls).count();
    println!(
        "{:<16} host calls p50 {:.1} p99 {:.1} max {:.1} us (first block before they returned: {before}/{}); slowest 2%: calls {:.1}, first block {:.1} us",
        "",
        c[0],
        c[1],
        c[2],
        trials.len(),
        split[0],
        split[1]
    );
    PreemptRow {
        mode: mode.to_string(),
        block_us,
        trials: trials.len() as u32,
        first_us: f,
        done_us: d,
        idle_done_us: idle,
        lost_or_redone: lost,
        host_calls_us: c,
        slowest_2pct_split_us: split,
    }
}

/// Latency of a short urgent kernel while a long low-priority one fills
/// the GPU, for each block time and mode, `trials` arrivals each. Prints the
/// table. Modes `timeslice` and `mps` start a second process ([`lp_hog`]).
pub fn preemption(gpu: &Gpu, block_us: &[u64], trials: u32, modes: &[String], seed: u64) -> Result<Vec<PreemptRow>> {
    let probe = Probe::new(gpu)?;
    let watcher = Watcher::new();
    let words = probe.flags.words();
    std::thread::scope(|scope| {
        scope.spawn(|| watcher.run(words));
        // Stops the watcher however `measure` ends (a panic too), so the scope can join it.
        let _stop = StopOnDrop(&watcher.quit);
        measure(gpu, &probe, &watcher, block_us, trials, modes, seed)
    })
}

/// Sets its flag when dropped.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Every mode at every block time, with `watcher` stamping the probe's signals.
fn measure(
    gpu: &Gpu,
    probe: &Probe,
    watcher: &Watcher,
    block_us: &[u64],
    trials: u32,
    modes: &[String],
    seed: u64,
) -> Result<Vec<PreemptRow>> {
    let (native_m, worker_m, _) = gpu.native_and_worker("synthetic", suite::SYNTHETIC_SOURCE)?;
    let spin_n = native_m.function("spin")?;
    let probe_n = native_m.function("probe")?;
    let spin_w = worker_m.function("spin")?;
    let probe_w = worker_m.function("probe")?;
    let low = Stream::low(gpu)?;
    let high = Stream::high(gpu)?;
    let ctl = Stream::high(gpu)?;
    let all = SmMask::range(0, gpu.sm_count());
    let mut trial = 0u32;
    let mut rng = Rng::new(seed ^ 0x9EE);
    let cap = spin_n.blocks_per_sm(SPIN_THREADS, 0)? * gpu.sm_count();
    let mut rows = Vec::new();

    // The probe alone, for reference.
    let mut idle = Vec::new();
    for _ in 0..50 {
        trial += 1;
        watcher.arm(trial)?;
        let (t0, _) = probe.launch_native(trial, &probe_n, &high)?;
        idle.push(watcher.collect(t0)?.1);
        high.sync()?;
    }
    let idle = percentile(&mut idle, 50.0);

    println!("\n== preemption: short high-priority probe ({} blocks x {PROBE_THREADS} threads) arriving during a long low-priority spin kernel ==", probe.grid);
    println!(
        "{:<16} {:>8} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>6}",
        "mode", "block us", "trials", "first p50", "p99", "max", "done p50", "p99", "max", "idle", "lost"
    );
    for &bus in block_us {
        let block_ns = bus * 1000;
        // Long enough that the arrival, at 25-50% of it, falls well inside.
        let lp_us = (8 * bus).max(3000);
        let lp_blocks = (lp_us / bus.max(1)).max(1) as u32 * cap;
        let runs = DeviceBuffer::new(lp_blocks as usize * 4)?;
        let delay = |rng: &mut Rng| Duration::from_micros(lp_us / 4 + rng.below(lp_us / 4));
        for mode in modes {
            let mut stamps: Vec<Trial> = Vec::new();
            let mut lost = None;
            match mode.as_str() {
                "native-priority" => {
                    for _ in 0..trials {
                        let mut p = Params::default();
                        p.ptr(runs.ptr).u64(block_ns);
                        // SAFETY: matches `spin`'s parameters.
                        unsafe { spin_n.launch([lp_blocks, 1, 1], [SPIN_THREADS, 1, 1], 0, &low, &mut p)? };
                        spin_for(delay(&mut rng));
                        trial += 1;
                        watcher.arm(trial)?;
                        let (t0, calls) = probe.launch_native(trial, &probe_n, &high)?;
                        let (first, done) = watcher.collect(t0)?;
                        stamps.push(Trial { calls, first, done });
                        low.sync()?;
                        high.sync()?;
                    }
                }
                "gpumux" | "gpumux-chunk1" => {
                    // `gpumux`: the default path; `gpumux-chunk1`: both kernels as
                    // workers claiming one block at a time (the path before launch plans).
                    let chunk = if mode == "gpumux-chunk1" { Chunk::Fixed(1) } else { Chunk::Auto };
                    let mut wrong = 0u64;
                    let spin_args = vec![runs.ptr.to_le_bytes().to_vec(), block_ns.to_le_bytes().to_vec()];
                    // The default path: the chunk (and native or not) chosen per launch
                    // from each kernel's block time, measured on its first launch.
                    let mut lp = WorkerLaunch::new(
                        spin_w.clone(),
                        spin_args,
                        [lp_blocks, 1, 1],
                        [SPIN_THREADS, 1, 1],
                        0,
                        chunk,
                        gpu.sm_count(),
                    )?
                    .with_native(spin_n.clone());
                    let mut hp = WorkerLaunch::new(
                        probe_w.clone(),
                        probe.args(trial),
                        [probe.grid, 1, 1],
                        [PROBE_THREADS, 1, 1],
                        0,
                        chunk,
                        gpu.sm_count(),
                    )?
                    .with_native(probe_n.clone())
                    .urgent(true);
                    for _ in 0..trials {
                        runs.fill(0)?;
                        lp.rewind()?;
                        lp.start(&low, all)?;
                        spin_for(delay(&mut rng));
                        trial += 1;
                        hp.set_arg(4, trial.to_le_bytes().to_vec());
                        watcher.arm(trial)?;
                        hp.rewind()?;
                        let t0 = Instant::now();
                        lp.retreat(&ctl)?;
                        hp.start(&high, all)?;
                        let calls = t0.elapsed().as_secs_f64() * 1e6;
                        let (first, done) = watcher.collect(t0)?;
                        stamps.push(Trial { calls, first, done });
                        hp.finish()?;
                        while !lp.finish()?.done() {
                            lp.start(&low, all)?;
                        }
                        let counts = runs.download()?;
                        wrong += counts
                            .chunks_exact(4)
                            .filter(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) != 1)
                            .count() as u64;
                    }
                    lost = Some(wrong);
                }
                "timeslice" | "mps" => {
                    let mut child = spawn_hog(bus, trials as f64 * (lp_us as f64 / 1e6 + 0.01) + 10.0)?;
                    let r = (|| -> Result<()> {
                        for _ in 0..trials {
                            spin_for(Duration::from_micros(1000 + rng.below(4000)));
                            trial += 1;
                            watcher.arm(trial)?;
                            let (t0, calls) = probe.launch_native(trial, &probe_n, &high)?;
                            let (first, done) = watcher.collect(t0)?;
                            stamps.push(Trial { calls, first, done });
                            high.sync()?;
                        }
                        Ok(())
                    })();
                    // Closing its stdin asks the second process to stop after its
                    // current kernels: killing an MPS client mid-kernel can fault
                    // the other clients of the server.
                    drop(child.stdin.take());
                    let _ = child.wait();
                    r?;
                }
                other => return Err(CudaError::Invalid(format!("unknown preemption mode `{other}`"))),
            }
            rows.push(summarize(mode, bus, &stamps, idle, lost));
        }
    }
    Ok(rows)
}

/// Starts `lp-hog` in a second process with the same program and waits until it runs.
fn spawn_hog(block_us: u64, seconds: f64) -> Result<std::process::Child> {
    let exe = std::env::current_exe().map_err(|e| CudaError::Invalid(format!("cannot find this program: {e}")))?;
    // Everything before the bench subcommand (e.g. `bench` for the gpumux CLI) is kept.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let pos = args.iter().position(|a| a == "preempt" || a == "all").unwrap_or(args.len());
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args[..pos])
        .args(["lp-hog", "--block-us", &block_us.to_string(), "--seconds", &format!("{seconds:.1}")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| CudaError::Invalid(format!("cannot start the second process: {e}")))?;
    let out = child.stdout.take().ok_or_else(|| CudaError::Invalid("no stdout from the second process".into()))?;
    let mut line = String::new();
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| CudaError::Invalid(format!("second process: {e}")))?;
    if line.trim() != "ready" {
        let _ = child.kill();
        return Err(CudaError::Invalid(format!("second process did not start: {line:?}")));
    }
    Ok(child)
}

/// The second process of the two-process modes: back-to-back spin kernels.
pub fn lp_hog(ordinal: i32, block_us: u64, seconds: f64) -> anyhow::Result<()> {
    let gpu = Gpu::open(ordinal)?;
    let m = gpu.module("synthetic", suite::SYNTHETIC_SOURCE)?;
    let spin = m.function("spin")?;
    let cap = spin.blocks_per_sm(SPIN_THREADS, 0)? * gpu.sm_count();
    // About 20 ms per kernel.
    let blocks = ((20_000 / block_us.max(1)).max(1) as u32) * cap;
    let runs = DeviceBuffer::new(blocks as usize * 4)?;
    let s = Stream::low(&gpu)?;
    let t = Instant::now();
    let mut said = false;
    // Stop when stdin closes (the parent is done) or the time is up.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut sink = String::new();
        while std::io::stdin().read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {}
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    while t.elapsed().as_secs_f64() < seconds && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for _ in 0..2 {
            let mut p = Params::default();
            p.ptr(runs.ptr).u64(block_us * 1000);
            // SAFETY: matches `spin`'s parameters.
            unsafe { spin.launch([blocks, 1, 1], [SPIN_THREADS, 1, 1], 0, &s, &mut p)? };
        }
        if !said {
            spin_for(Duration::from_millis(5));
            println!("ready");
            said = true;
        }
        s.sync()?;
    }
    Ok(())
}

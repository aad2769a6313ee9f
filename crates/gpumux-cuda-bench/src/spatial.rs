//! Spatial sharing: a memory-bound app (triad) and a compute-bound one (sgemm),
//! side by side in one run:
//!
//! * each alone (native kernels, primary context): the reference of every slowdown;
//! * one after the other (one stream);
//! * together with the hardware's own block scheduling (two streams, native kernels);
//! * gpumux workers on disjoint SM masks (`%smid` filtering);
//! * native kernels on two disjoint green contexts (`cuGreenCtxCreate`) of the same SM
//!   counts (multiples of the driver's group size, 8 SMs on an H100);
//! * two processes under MPS with `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` set per process
//!   to the same splits (child processes: the hidden `spatial-child` subcommand);
//! * a green context's own cost: each app alone on a green context holding all SMs vs
//!   the primary context.
//!
//! In-process rows start both apps together behind one gate (a stream waits on a
//! host-mapped word, then records the start event; every app's stream waits for that
//! event) and time them with device events. MPS rows are timed by each child on the host
//! clock from the moment it reads the common start signal to its stream's end.

use crate::median;
use gpumux_cuda::error::{CudaError, Result};
use gpumux_cuda::exec::Prepared;
use gpumux_cuda::preempt::{SmMask, WorkerLaunch};
use gpumux_cuda::runtime::{Event, Function, Gpu, GreenContext, HostMapped, Params, SmResource, SmSplit, Stream};
use gpumux_cuda::suite::{self, App, Scale};
use serde::Serialize;
use std::collections::HashMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// SM group size of a green-context split on compute capability 9.0 (the driver's own
/// value is used when green contexts are available).
pub const GROUP_SMS: u32 = 8;
/// SMs of the memory-bound app in the default sweep; the compute-bound one gets the rest
/// of the whole groups.
pub const DEFAULT_MEM_SMS: [u32; 4] = [16, 32, 48, 64];
/// Row groups `--modes` may name.
pub const MODES: [&str; 5] = ["hardware", "workers", "green", "green-cost", "mps"];
/// Two bindings closer than this (relative) are a tie.
pub const TIE: f64 = 0.02;

/// One binding of the memory-bound and the compute-bound app.
#[derive(Clone, Debug, Serialize)]
pub struct SpatialRow {
    /// What the row measured, as printed.
    pub mode: String,
    /// alone, alone-workers, sequential, hardware, workers, green, green-cost, mps-alone, mps.
    pub kind: String,
    /// SMs given to each app (None: no restriction).
    pub mem_sms: Option<u32>,
    /// SMs of the compute-bound app (None: no restriction).
    pub compute_sms: Option<u32>,
    /// MPS rows: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` of each process (None: not set).
    pub mem_percent: Option<u32>,
    /// MPS rows: the compute-bound process's percentage.
    pub compute_percent: Option<u32>,
    /// MPS rows: SMs each child process saw (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`).
    pub mem_sms_seen: Option<u32>,
    /// MPS rows: SMs the compute-bound child saw.
    pub compute_sms_seen: Option<u32>,
    /// Completion times from the common start, ms (median over the repetitions). In
    /// rows of kind alone*, green-cost and mps-alone each app ran alone.
    pub mem_ms: f64,
    /// The compute-bound app's completion time, ms.
    pub compute_ms: f64,
    /// Time over the app's native time alone in the primary context.
    pub mem_slowdown: f64,
    /// The compute-bound app's time over its native time alone.
    pub compute_slowdown: f64,
    /// System throughput, sum of alone/shared (None where the apps did not share).
    pub stp: Option<f64>,
    /// Workers and green rows at equal SM counts: which binding finished first
    /// ("workers", "green" or "tie" within 2%) for each app and for the pair (makespan).
    pub mem_faster: Option<String>,
    /// The same for the compute-bound app.
    pub compute_faster: Option<String>,
    /// The same for the pair's makespan.
    pub makespan_faster: Option<String>,
    /// "device events" or "host clock".
    pub timing: String,
}

/// One split of the sweep: whole groups to each app.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub mem_groups: u32,
    pub compute_groups: u32,
    pub mem_sms: u32,
    pub compute_sms: u32,
}

/// The splits for `mem_sms` when the GPU splits into `groups` groups of `group_sms` SMs:
/// the memory app gets `mem_sms / group_sms` groups, the compute app the other groups
/// (SMs outside whole groups, 4 on an H100, stay idle in every split row).
pub fn plan_splits(mem_sms: &[u32], groups: u32, group_sms: u32) -> std::result::Result<Vec<Split>, String> {
    if group_sms == 0 || groups < 2 {
        return Err(format!("cannot split {groups} group(s) of {group_sms} SMs between two apps"));
    }
    mem_sms
        .iter()
        .map(|&m| {
            if m % group_sms != 0 {
                return Err(format!(
                    "{m} SMs for the memory-bound app is not a multiple of the green-context group size ({group_sms})"
                ));
            }
            let mg = m / group_sms;
            if mg == 0 || mg >= groups {
                return Err(format!(
                    "{m} SMs for the memory-bound app leaves no SMs to the other: between {group_sms} and {} (whole groups of {group_sms})",
                    (groups - 1) * group_sms
                ));
            }
            let cg = groups - mg;
            Ok(Split { mem_groups: mg, compute_groups: cg, mem_sms: m, compute_sms: cg * group_sms })
        })
        .collect()
}

/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` that gives a process at least `sms` of `total`
/// SMs: the percentage rounded up (1..=100).
pub fn mps_percent(sms: u32, total: u32) -> u32 {
    if total == 0 {
        return 100;
    }
    ((sms as u64 * 100).div_ceil(total as u64) as u32).clamp(1, 100)
}

/// Time shared over time alone.
pub fn slowdown(shared_ms: f64, alone_ms: f64) -> f64 {
    shared_ms / alone_ms
}

/// System throughput of apps that shared the GPU: sum of alone/shared, from (alone, shared) pairs.
pub fn stp(pairs: &[(f64, f64)]) -> f64 {
    pairs.iter().map(|&(alone, shared)| alone / shared).sum()
}

/// Which binding was faster: "workers", "green", or "tie" within `tie` (relative).
pub fn faster(workers_ms: f64, green_ms: f64, tie: f64) -> &'static str {
    let lo = workers_ms.min(green_ms);
    if (workers_ms - green_ms).abs() <= tie * lo {
        "tie"
    } else if workers_ms < green_ms {
        "workers"
    } else {
        "green"
    }
}

/// Arguments for a child process of this program: everything before the bench
/// subcommand (e.g. `bench cuda` of the gpumux CLI) except the global options, which go
/// after the child's subcommand in `tail` (clap refuses a global option given twice).
pub fn child_args(args: &[String], subcommands: &[&str], tail: &[String]) -> Vec<String> {
    const GLOBAL: [&str; 3] = ["--json", "--gpu", "--seed"];
    let pos = args.iter().position(|a| subcommands.contains(&a.as_str())).unwrap_or(args.len());
    let mut out = Vec::new();
    let mut i = 0;
    while i < pos {
        let a = &args[i];
        if GLOBAL.contains(&a.as_str()) {
            i += 2;
            continue;
        }
        if GLOBAL.iter().any(|g| a.starts_with(&format!("{g}="))) {
            i += 1;
            continue;
        }
        out.push(a.clone());
        i += 1;
    }
    out.extend(tail.iter().cloned());
    out
}

/// What `spatial` measures.
#[derive(Clone, Debug)]
pub struct SpatialConfig {
    /// Repetitions per row (the median is reported).
    pub reps: u32,
    /// SMs of the memory-bound app in each split.
    pub mem_sms: Vec<u32>,
    /// Row groups to run (hardware, workers, green, green-cost, mps); empty = all.
    pub modes: Vec<String>,
    /// MPS pipe directory for the child processes (None: $GPUMUX_MPS_PIPE_DIRECTORY,
    /// else $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps).
    pub mps_pipe_dir: Option<PathBuf>,
    /// Seed of the apps' inputs.
    pub seed: u64,
}

impl SpatialConfig {
    /// Every mode, the default splits, `reps` repetitions.
    pub fn new(reps: u32, seed: u64) -> SpatialConfig {
        SpatialConfig { reps, mem_sms: DEFAULT_MEM_SMS.to_vec(), modes: Vec::new(), mps_pipe_dir: None, seed }
    }
    fn wants(&self, mode: &str) -> bool {
        self.modes.is_empty() || self.modes.iter().any(|m| m == mode)
    }
    fn pipe_dir(&self) -> PathBuf {
        self.mps_pipe_dir
            .clone()
            .or_else(|| std::env::var_os("GPUMUX_MPS_PIPE_DIRECTORY").map(PathBuf::from))
            .or_else(|| std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from("/tmp/nvidia-mps"))
    }
}

// ---------------------------------------------------------------------------------------
// In-process runs

/// How one app runs in a measurement.
enum How<'a> {
    /// Native kernels on a primary-context stream.
    Native(&'a Stream),
    /// gpumux workers on an SM mask.
    Workers(&'a Stream, &'a mut Vec<WorkerLaunch>, SmMask),
    /// Native kernels on a green-context stream; `local` holds kernels loaded inside the
    /// green context once the driver refused the primary context's.
    Green(&'a Stream, &'a GreenContext, &'a mut Option<HashMap<&'static str, Function>>),
}

struct Side<'a> {
    p: &'a Prepared,
    how: How<'a>,
    end: Event,
}

impl<'a> Side<'a> {
    fn new(p: &'a Prepared, how: How<'a>) -> Result<Side<'a>> {
        Ok(Side { p, how, end: Event::new()? })
    }
    fn stream(&self) -> &Stream {
        match &self.how {
            How::Native(s) | How::Workers(s, _, _) | How::Green(s, _, _) => s,
        }
    }
}

/// Driver codes that mean "this handle does not belong to that stream's context".
fn refused(e: &CudaError) -> bool {
    matches!(e, CudaError::Driver(d) if d.is_foreign_handle())
}

/// The workload's native launches with the given kernels (same as `Prepared::enqueue_native`).
fn enqueue_funcs(p: &Prepared, funcs: &HashMap<&'static str, Function>, s: &Stream) -> Result<()> {
    for l in &p.workload.launches {
        let f = funcs
            .get(l.kernel)
            .ok_or_else(|| CudaError::Invalid(format!("kernel `{}` not loaded in the green context", l.kernel)))?;
        let mut params = Params::default();
        for a in &l.args {
            params.arg(a, &p.buffers)?;
        }
        // SAFETY: the suite's argument lists match its kernels.
        unsafe { f.launch(l.grid, l.block, l.shared_bytes, s, &mut params)? };
    }
    Ok(())
}

fn enqueue(side: &mut Side) -> Result<()> {
    let p = side.p;
    match &mut side.how {
        How::Native(s) => p.enqueue_native(s),
        How::Workers(s, w, mask) => p.enqueue_workers(w, s, *mask),
        How::Green(s, g, local) => {
            if let Some(funcs) = local.as_ref() {
                return enqueue_funcs(p, funcs, s);
            }
            match p.enqueue_native(s) {
                Err(e) if refused(&e) => {
                    eprintln!(
                        "note: the driver refused a primary-context kernel on a green-context stream ({e}); \
                         loading `{}` inside the green context instead",
                        p.workload.app.name()
                    );
                    let m = g.module(p.workload.app.name(), p.workload.app.source())?;
                    let mut funcs = HashMap::new();
                    for l in &p.workload.launches {
                        if !funcs.contains_key(l.kernel) {
                            funcs.insert(l.kernel, m.function(l.kernel)?);
                        }
                    }
                    enqueue_funcs(p, &funcs, s)?;
                    **local = Some(funcs);
                    Ok(())
                }
                r => r,
            }
        }
    }
}

fn record_end(side: &Side) -> Result<()> {
    match (side.end.record(side.stream()), &side.how) {
        // A primary-context event on a green-context stream: the documented way for a
        // green context is cuGreenCtxRecordEvent (one stream per green context here).
        (Err(e), How::Green(_, g, _)) if refused(&e) => g.record(&side.end),
        (r, _) => r,
    }
}

/// One run of `p` on a green-context stream outside any gate, synchronously: decides
/// whether the primary context's kernels are accepted there (else loads them inside the
/// green context) before a measurement enqueues work behind a closed gate, where a
/// module load could wait for that work.
fn warm_green(
    p: &Prepared,
    s: &Stream,
    g: &GreenContext,
    local: &mut Option<HashMap<&'static str, Function>>,
) -> Result<()> {
    let mut side = Side::new(p, How::Green(s, g, local))?;
    enqueue(&mut side)?;
    s.sync()
}

/// Holds every app's stream until all are enqueued, so they start together.
struct Gate {
    stream: Stream,
    flag: HostMapped,
    value: u32,
}

impl Gate {
    fn new(gpu: &Gpu) -> Result<Gate> {
        Ok(Gate { stream: Stream::high(gpu)?, flag: HostMapped::new(64)?, value: 0 })
    }
    fn open(&self) {
        self.flag.write_bytes(0, &self.value.to_le_bytes());
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// One common start of `sides`: their completion times (ms) from it.
fn run_once(gate: &mut Gate, sides: &mut [Side]) -> Result<Vec<f64>> {
    gate.value = gate.value.wrapping_add(1).max(1);
    let start = Event::new()?;
    let enqueued = (|| -> Result<()> {
        gate.stream.wait_u32_geq(gate.flag.dev, gate.value)?;
        start.record(&gate.stream)?;
        for side in sides.iter_mut() {
            side.stream().wait(&start)?;
            enqueue(side)?;
            record_end(side)?;
        }
        Ok(())
    })();
    // Always open the gate: whatever was enqueued must be able to run.
    gate.open();
    if let Err(e) = enqueued {
        let _ = gate.stream.sync();
        for side in sides.iter() {
            let _ = side.stream().sync();
        }
        return Err(e);
    }
    for side in sides.iter() {
        side.end.sync()?;
    }
    let mut times = Vec::with_capacity(sides.len());
    for side in sides.iter_mut() {
        if let How::Workers(_, w, _) = &mut side.how {
            side.p.finish_workers(w)?;
        }
        times.push(start.elapsed_ms(&side.end)? as f64);
    }
    Ok(times)
}

/// `reps` timed runs after one warm-up: the median time of each side.
fn measure(gate: &mut Gate, sides: &mut [Side], reps: u32) -> Result<Vec<f64>> {
    let mut cols = vec![Vec::new(); sides.len()];
    for r in 0..reps.max(1) + 1 {
        let t = run_once(gate, sides)?;
        if r > 0 {
            for (c, x) in cols.iter_mut().zip(t) {
                c.push(x);
            }
        }
    }
    Ok(cols.iter_mut().map(|c| median(c)).collect())
}

/// Times of a pair run together.
fn pair(gate: &mut Gate, a: Side, b: Side, reps: u32) -> Result<(f64, f64)> {
    let mut sides = [a, b];
    let t = measure(gate, &mut sides, reps)?;
    Ok((t[0], t[1]))
}

fn alone(gate: &mut Gate, a: Side, reps: u32) -> Result<f64> {
    Ok(measure(gate, &mut [a], reps)?[0])
}

// ---------------------------------------------------------------------------------------
// Rows and the table

struct Table {
    ta: f64,
    tb: f64,
    rows: Vec<SpatialRow>,
}

impl Table {
    fn row(
        &self,
        mode: String,
        kind: &str,
        sms: (Option<u32>, Option<u32>),
        t: (f64, f64),
        shared: bool,
    ) -> SpatialRow {
        SpatialRow {
            mode,
            kind: kind.to_string(),
            mem_sms: sms.0,
            compute_sms: sms.1,
            mem_percent: None,
            compute_percent: None,
            mem_sms_seen: None,
            compute_sms_seen: None,
            mem_ms: t.0,
            compute_ms: t.1,
            mem_slowdown: slowdown(t.0, self.ta),
            compute_slowdown: slowdown(t.1, self.tb),
            stp: shared.then(|| stp(&[(self.ta, t.0), (self.tb, t.1)])),
            mem_faster: None,
            compute_faster: None,
            makespan_faster: None,
            timing: "device events".into(),
        }
    }
    fn push(&mut self, r: SpatialRow) {
        print_row(&r);
        self.rows.push(r);
    }
}

fn opt(v: Option<u32>) -> String {
    v.map_or("all".to_string(), |x| x.to_string())
}

fn print_header() {
    println!(
        "{:<44} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>6}",
        "mode", "SMs m", "SMs c", "triad ms", "sgemm ms", "slow mem", "slow cmp", "STP"
    );
}

fn print_row(r: &SpatialRow) {
    println!(
        "{:<44} {:>6} {:>6} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>6}",
        r.mode,
        opt(r.mem_sms),
        opt(r.compute_sms),
        r.mem_ms,
        r.compute_ms,
        r.mem_slowdown,
        r.compute_slowdown,
        r.stp.map_or("-".to_string(), |s| format!("{s:.3}"))
    );
}

/// The device's SMs split into groups by the driver, or why not.
struct GreenSetup {
    whole: SmResource,
    split: SmSplit,
    group_sms: u32,
}

fn green_setup(gpu: &Gpu) -> Result<GreenSetup> {
    let whole = gpu.sm_resource()?;
    let split = gpu.split_sms(&whole, GROUP_SMS)?;
    let group_sms = split.group_sms().ok_or_else(|| {
        CudaError::Invalid(format!(
            "the driver split the SMs into groups of unequal size: {:?}",
            split.groups.iter().map(|g| g.sm_count()).collect::<Vec<_>>()
        ))
    })?;
    println!(
        "green contexts: {} SMs split into {} groups of {} (driver granularity {}, minimum partition {}), remainder {} SMs",
        whole.sm_count(),
        split.groups.len(),
        group_sms,
        whole.coscheduled_alignment(),
        whole.min_partition_size(),
        split.remainder.map_or(0, |r| r.sm_count())
    );
    Ok(GreenSetup { whole, split, group_sms })
}

/// A green context over all SMs: the device's whole resource, else every group plus the
/// remainder, else every group.
fn green_all(gpu: &Gpu, g: &GreenSetup) -> Result<GreenContext> {
    let whole = gpu.green_context(&[g.whole]);
    if whole.is_ok() {
        return whole;
    }
    if let Some(rem) = g.split.remainder {
        let mut v = g.split.groups.clone();
        v.push(rem);
        if let Ok(c) = gpu.green_context(&v) {
            return Ok(c);
        }
    }
    gpu.green_context(&g.split.groups).map_err(|e| {
        CudaError::Invalid(format!(
            "no green context over all SMs (whole resource: {}; all groups: {e})",
            whole.err().map_or(String::new(), |x| x.to_string())
        ))
    })
}

/// A pair on two disjoint green contexts of `s`'s SM counts.
fn green_pair(
    gpu: &Gpu,
    gate: &mut Gate,
    g: &GreenSetup,
    s: &Split,
    a: &Prepared,
    b: &Prepared,
    reps: u32,
) -> Result<(f64, f64, u32, u32)> {
    let groups = &g.split.groups;
    let (mg, cg) = (s.mem_groups as usize, s.compute_groups as usize);
    if mg + cg > groups.len() {
        return Err(CudaError::Invalid(format!("split {mg}+{cg} groups of {} available", groups.len())));
    }
    let ga = gpu.green_context(&groups[..mg])?;
    let gb = gpu.green_context(&groups[mg..mg + cg])?;
    let (sa, sb) = (ga.low_stream()?, gb.low_stream()?);
    let (mut la, mut lb) = (None, None);
    warm_green(a, &sa, &ga, &mut la)?;
    warm_green(b, &sb, &gb, &mut lb)?;
    let t =
        pair(gate, Side::new(a, How::Green(&sa, &ga, &mut la))?, Side::new(b, How::Green(&sb, &gb, &mut lb))?, reps)?;
    // Streams go before their green contexts (drop order: reverse of declaration).
    drop((sa, sb));
    Ok((t.0, t.1, ga.sm_count(), gb.sm_count()))
}

/// triad (memory-bound) and sgemm (compute-bound): alone, one after the
/// other, together under the hardware's scheduling, on disjoint SM sets
/// (gpumux workers, green contexts) and as two MPS client processes
/// ([`spatial_child`]), as `cfg` selects. Prints the table.
pub fn spatial(gpu: &Gpu, cfg: &SpatialConfig) -> Result<Vec<SpatialRow>> {
    for m in &cfg.modes {
        if !MODES.contains(&m.as_str()) {
            return Err(CudaError::Invalid(format!("unknown spatial mode `{m}` (known: {})", MODES.join(", "))));
        }
    }
    let n = gpu.sm_count();
    let reps = cfg.reps.max(1);
    if gpu.mps_enabled().unwrap_or(false) {
        println!(
            "note: this process is itself an MPS client: every in-process row below runs under MPS, \
             and green contexts may be refused (run without CUDA_MPS_PIPE_DIRECTORY; pass the pipe \
             directory to the MPS rows with --mps-pipe-dir or GPUMUX_MPS_PIPE_DIRECTORY)"
        );
    }

    // Green contexts first: their split decides the SM counts of every split row.
    let green = if cfg.wants("green") || cfg.wants("green-cost") {
        match green_setup(gpu) {
            Ok(g) => Some(g),
            Err(e) => {
                println!("green contexts unavailable: {e}; green-context rows skipped");
                None
            }
        }
    } else {
        None
    };
    let (groups, group_sms) = match &green {
        Some(g) => (g.split.groups.len() as u32, g.group_sms),
        None => (n / GROUP_SMS, GROUP_SMS),
    };
    let splits = plan_splits(&cfg.mem_sms, groups, group_sms).map_err(CudaError::Invalid)?;

    let a = Prepared::new(gpu, suite::build(App::Triad, Scale::Bench, cfg.seed))?;
    let b = Prepared::new(gpu, suite::build(App::Sgemm, Scale::Bench, cfg.seed))?;
    a.reset()?;
    b.reset()?;
    let mut gate = Gate::new(gpu)?;
    let (s1, s2) = (Stream::low(gpu)?, Stream::low(gpu)?);

    // Native alone: the reference of every slowdown.
    let ta = alone(&mut gate, Side::new(&a, How::Native(&s1))?, reps)?;
    let tb = alone(&mut gate, Side::new(&b, How::Native(&s1))?, reps)?;
    let mut t = Table { ta, tb, rows: Vec::new() };
    println!(
        "\n== spatial sharing: triad (memory-bound, {} launches) + sgemm (compute-bound, {} launches), \
         completion from a common start, median of {reps} ==",
        a.workload.launches.len(),
        b.workload.launches.len()
    );
    print_header();
    let r = t.row("alone, native (primary context)".into(), "alone", (None, None), (ta, tb), false);
    t.push(r);

    let mut wa = a.worker_launches(gpu, 4)?;
    let mut wb = b.worker_launches(gpu, 4)?;
    let all = SmMask::range(0, n);
    let xa = alone(&mut gate, Side::new(&a, How::Workers(&s1, &mut wa, all))?, reps)?;
    let xb = alone(&mut gate, Side::new(&b, How::Workers(&s1, &mut wb, all))?, reps)?;
    let r = t.row("alone, gpumux workers on all SMs".into(), "alone-workers", (Some(n), Some(n)), (xa, xb), false);
    t.push(r);

    let seq = pair(&mut gate, Side::new(&a, How::Native(&s1))?, Side::new(&b, How::Native(&s1))?, reps)?;
    let r = t.row("one after the other (one stream)".into(), "sequential", (None, None), seq, true);
    t.push(r);

    if cfg.wants("hardware") {
        let hw = pair(&mut gate, Side::new(&a, How::Native(&s1))?, Side::new(&b, How::Native(&s2))?, reps)?;
        let r = t.row("together, hardware (2 streams, native)".into(), "hardware", (None, None), hw, true);
        t.push(r);
    }

    let mut worker_rows: HashMap<u32, (f64, f64)> = HashMap::new();
    if cfg.wants("workers") {
        for s in &splits {
            let (ma, mb) = (SmMask::range(0, s.mem_sms), SmMask::range(s.mem_sms, s.mem_sms + s.compute_sms));
            let x = pair(
                &mut gate,
                Side::new(&a, How::Workers(&s1, &mut wa, ma))?,
                Side::new(&b, How::Workers(&s2, &mut wb, mb))?,
                reps,
            )?;
            worker_rows.insert(s.mem_sms, x);
            let label = format!("gpumux workers, triad {} / sgemm {} SMs", s.mem_sms, s.compute_sms);
            let r = t.row(label, "workers", (Some(s.mem_sms), Some(s.compute_sms)), x, true);
            t.push(r);
        }
    }

    if let Some(g) = green.as_ref().filter(|_| cfg.wants("green")) {
        for s in &splits {
            match green_pair(gpu, &mut gate, g, s, &a, &b, reps) {
                Ok((x, y, sa, sb)) => {
                    if (sa, sb) != (s.mem_sms, s.compute_sms) {
                        println!(
                            "note: the green contexts hold {sa} / {sb} SMs (asked {} / {})",
                            s.mem_sms, s.compute_sms
                        );
                    }
                    let label = format!("green contexts, triad {sa} / sgemm {sb} SMs");
                    let mut r = t.row(label, "green", (Some(sa), Some(sb)), (x, y), true);
                    if let Some(&(wx, wy)) = worker_rows.get(&s.mem_sms) {
                        r.mem_faster = Some(faster(wx, x, TIE).into());
                        r.compute_faster = Some(faster(wy, y, TIE).into());
                        r.makespan_faster = Some(faster(wx.max(wy), x.max(y), TIE).into());
                        if let Some(w) =
                            t.rows.iter_mut().rev().find(|w| w.kind == "workers" && w.mem_sms == Some(s.mem_sms))
                        {
                            w.mem_faster = r.mem_faster.clone();
                            w.compute_faster = r.compute_faster.clone();
                            w.makespan_faster = r.makespan_faster.clone();
                        }
                    }
                    t.push(r);
                }
                Err(e) => {
                    println!(
                        "green contexts failed at triad {} / sgemm {} SMs: {e}; remaining green rows skipped",
                        s.mem_sms, s.compute_sms
                    );
                    break;
                }
            }
        }
    }

    if let Some(g) = green.as_ref().filter(|_| cfg.wants("green-cost")) {
        let cost = (|| -> Result<(f64, f64, u32)> {
            let gc = green_all(gpu, g)?;
            let gs = gc.low_stream()?;
            let (mut la, mut lb) = (None, None);
            warm_green(&a, &gs, &gc, &mut la)?;
            warm_green(&b, &gs, &gc, &mut lb)?;
            let x = alone(&mut gate, Side::new(&a, How::Green(&gs, &gc, &mut la))?, reps)?;
            let y = alone(&mut gate, Side::new(&b, How::Green(&gs, &gc, &mut lb))?, reps)?;
            drop(gs);
            Ok((x, y, gc.sm_count()))
        })();
        match cost {
            Ok((x, y, sms)) => {
                let label = format!("alone, native on a green context of {sms} SMs");
                let r = t.row(label, "green-cost", (Some(sms), Some(sms)), (x, y), false);
                t.push(r);
                if sms != n {
                    println!("note: that green context holds {sms} of {n} SMs, so its cost includes fewer SMs");
                }
            }
            Err(e) => println!("green context over all SMs failed: {e}; its cost row skipped"),
        }
    }

    if cfg.wants("mps") {
        mps_rows(gpu, cfg, &splits, &mut t, reps)?;
    }

    print_comparison(&t.rows);
    Ok(t.rows)
}

fn print_comparison(rows: &[SpatialRow]) {
    let greens: Vec<&SpatialRow> = rows.iter().filter(|r| r.kind == "green" && r.makespan_faster.is_some()).collect();
    if greens.is_empty() {
        return;
    }
    println!("\n== workers (%smid filtering) vs green contexts at equal SM counts: which finished first (tie within {:.0}%) ==", TIE * 100.0);
    println!(
        "{:>6} {:>6} {:>11} {:>11} {:>9} {:>11} {:>11} {:>9} {:>9}",
        "SMs m", "SMs c", "wk triad", "gc triad", "triad", "wk sgemm", "gc sgemm", "sgemm", "makespan"
    );
    for g in greens {
        if let Some(w) = rows.iter().find(|w| w.kind == "workers" && w.mem_sms == g.mem_sms) {
            println!(
                "{:>6} {:>6} {:>11.3} {:>11.3} {:>9} {:>11.3} {:>11.3} {:>9} {:>9}",
                opt(g.mem_sms),
                opt(g.compute_sms),
                w.mem_ms,
                g.mem_ms,
                g.mem_faster.as_deref().unwrap_or("-"),
                w.compute_ms,
                g.compute_ms,
                g.compute_faster.as_deref().unwrap_or("-"),
                g.makespan_faster.as_deref().unwrap_or("-")
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// MPS: two child processes

const READY_TIMEOUT: Duration = Duration::from_secs(300);
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// A `spatial-child` process: one app, run once per "go" line on its stdin.
struct ChildApp {
    app: App,
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    sms_seen: u32,
    mps: i32,
}

impl ChildApp {
    fn spawn(app: App, cfg: &SpatialConfig, gpu: i32, pipe_dir: &Path, percent: Option<u32>) -> Result<ChildApp> {
        let exe = std::env::current_exe()
            .map_err(|e| CudaError::Invalid(format!("cannot find this program for a child process: {e}")))?;
        let args: Vec<String> = std::env::args().skip(1).collect();
        let tail: Vec<String> = vec![
            "spatial-child".into(),
            "--app".into(),
            app.name().into(),
            "--gpu".into(),
            gpu.to_string(),
            "--seed".into(),
            cfg.seed.to_string(),
        ];
        let mut cmd = std::process::Command::new(exe);
        cmd.args(child_args(&args, &["spatial", "all"], &tail))
            .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped());
        match percent {
            Some(p) => cmd.env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", p.to_string()),
            None => cmd.env_remove("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        };
        let mut child = cmd
            .spawn()
            .map_err(|e| CudaError::Invalid(format!("cannot start the {} child process: {e}", app.name())))?;
        let out = child.stdout.take();
        let stdin = child.stdin.take();
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(out) = out {
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines() {
                    match line {
                        Ok(l) => {
                            if tx.send(l).is_err() {
                                break;
                            }
                        }
                        Err(_) => break,
                    }
                }
            });
        }
        let mut c = ChildApp { app, child, stdin, lines: rx, sms_seen: 0, mps: -1 };
        let line = c.next_line(READY_TIMEOUT, "ready")?;
        match parse_ready(&line) {
            Some((sms, mps)) => {
                c.sms_seen = sms;
                c.mps = mps;
                Ok(c)
            }
            None => {
                c.stop();
                Err(CudaError::Invalid(format!(
                    "{} child process: expected `ready sms=N mps=M`, got {line:?}",
                    app.name()
                )))
            }
        }
    }

    fn next_line(&mut self, timeout: Duration, what: &str) -> Result<String> {
        self.lines.recv_timeout(timeout).map_err(|e| {
            let status = self.child.try_wait().ok().flatten();
            CudaError::Invalid(format!(
                "{} child process: no `{what}` line ({e}){}",
                self.app.name(),
                status.map_or(String::new(), |s| format!("; it exited with {s} (its stderr is above)"))
            ))
        })
    }

    fn go(&mut self) -> Result<()> {
        let name = self.app.name();
        let w = self.stdin.as_mut().ok_or_else(|| CudaError::Invalid(format!("{name} child process: stdin closed")))?;
        w.write_all(b"go\n")
            .and_then(|_| w.flush())
            .map_err(|e| CudaError::Invalid(format!("{name} child process: cannot send the start signal: {e}")))
    }

    fn done(&mut self) -> Result<f64> {
        let line = self.next_line(RUN_TIMEOUT, "done")?;
        line.strip_prefix("done ").and_then(|x| x.trim().parse::<f64>().ok()).ok_or_else(|| {
            CudaError::Invalid(format!("{} child process: expected `done MS`, got {line:?}", self.app.name()))
        })
    }

    /// Closes its stdin (it then ends after its current run) and waits; kills it only if
    /// it does not end (killing an MPS client mid-kernel can fault the server's other clients).
    fn stop(&mut self) {
        drop(self.stdin.take());
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildApp {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            self.stop();
        }
    }
}

/// `ready sms=132 mps=1` → (132, 1).
pub fn parse_ready(line: &str) -> Option<(u32, i32)> {
    let mut it = line.split_whitespace();
    if it.next()? != "ready" {
        return None;
    }
    let sms = it.next()?.strip_prefix("sms=")?.parse().ok()?;
    let mps = it.next()?.strip_prefix("mps=")?.parse().ok()?;
    Some((sms, mps))
}

/// Median completion times (ms) of the children started together `reps` times (after
/// one warm-up start).
fn run_children(children: &mut [&mut ChildApp], reps: u32) -> Result<Vec<f64>> {
    let mut cols = vec![Vec::new(); children.len()];
    for r in 0..reps + 1 {
        for c in children.iter_mut() {
            c.go()?;
        }
        for (i, c) in children.iter_mut().enumerate() {
            let ms = c.done()?;
            if r > 0 {
                cols[i].push(ms);
            }
        }
    }
    Ok(cols.iter_mut().map(|c| median(c)).collect())
}

fn mps_rows(gpu: &Gpu, cfg: &SpatialConfig, splits: &[Split], t: &mut Table, reps: u32) -> Result<()> {
    let dir = cfg.pipe_dir();
    if !dir.is_dir() {
        println!(
            "MPS is not running: no MPS pipe directory {} (start it as scripts/gpu-check.sh does, or pass \
             --mps-pipe-dir); MPS rows skipped",
            dir.display()
        );
        return Ok(());
    }
    let n = gpu.sm_count();
    let ord = gpu.ordinal;
    // Each app alone under MPS, no SM limit: what MPS itself costs, and the check that
    // the children really are MPS clients.
    let alone_mps = (|| -> Result<Option<(f64, f64)>> {
        let mut ca = ChildApp::spawn(App::Triad, cfg, ord, &dir, None)?;
        if ca.mps != 1 {
            println!(
                "MPS is not running for pipe directory {} (a child process sees CU_DEVICE_ATTRIBUTE_MPS_ENABLED = {}); \
                 MPS rows skipped",
                dir.display(),
                ca.mps
            );
            return Ok(None);
        }
        let x = run_children(&mut [&mut ca], reps)?[0];
        drop(ca);
        let mut cb = ChildApp::spawn(App::Sgemm, cfg, ord, &dir, None)?;
        let y = run_children(&mut [&mut cb], reps)?[0];
        Ok(Some((x, y)))
    })();
    let (x, y) = match alone_mps {
        Ok(Some(v)) => v,
        Ok(None) => return Ok(()),
        Err(e) => {
            println!("MPS child processes failed: {e}; MPS rows skipped");
            return Ok(());
        }
    };
    let mut r = t.row("alone, native in an MPS client (no SM limit)".into(), "mps-alone", (None, None), (x, y), false);
    r.timing = "host clock".into();
    t.push(r);

    let mut run = |label: String, pa: Option<u32>, pb: Option<u32>, sms: (Option<u32>, Option<u32>)| -> Result<()> {
        let mut ca = ChildApp::spawn(App::Triad, cfg, ord, &dir, pa)?;
        let mut cb = ChildApp::spawn(App::Sgemm, cfg, ord, &dir, pb)?;
        let v = run_children(&mut [&mut ca, &mut cb], reps)?;
        let mut r = t.row(label, "mps", sms, (v[0], v[1]), true);
        r.mem_percent = pa;
        r.compute_percent = pb;
        r.mem_sms_seen = Some(ca.sms_seen);
        r.compute_sms_seen = Some(cb.sms_seen);
        r.timing = "host clock".into();
        if pa.is_some() {
            println!(
                "  (MPS: triad {}% -> sees {} SMs, sgemm {}% -> sees {} SMs; MPS limits are not disjoint SM sets)",
                pa.unwrap_or(100),
                ca.sms_seen,
                pb.unwrap_or(100),
                cb.sms_seen
            );
        }
        t.push(r);
        Ok(())
    };
    let mut result = run("two processes, MPS, no SM limit".into(), None, None, (None, None));
    for s in splits {
        if result.is_err() {
            break;
        }
        let (pa, pb) = (mps_percent(s.mem_sms, n), mps_percent(s.compute_sms, n));
        let label = format!("two processes, MPS, triad {pa}% / sgemm {pb}%");
        result = run(label, Some(pa), Some(pb), (Some(s.mem_sms), Some(s.compute_sms)));
    }
    if let Err(e) = result {
        println!("MPS child processes failed: {e}; remaining MPS rows skipped");
    }
    Ok(())
}

/// The child process of the MPS rows (`spatial-child`): prepares `app`, says `ready
/// sms=N mps=M`, then runs it once per `go` line on stdin and answers `done MS` (host
/// clock from reading `go` to the end of its stream). Ends at end of input or `quit`.
pub fn spatial_child(ordinal: i32, app: App, seed: u64) -> anyhow::Result<()> {
    let gpu = Gpu::open(ordinal)?;
    let p = Prepared::new(&gpu, suite::build(app, Scale::Bench, seed))?;
    p.reset()?;
    let s = Stream::low(&gpu)?;
    // Warm-up: module load and first-launch costs stay out of the times.
    p.enqueue_native(&s)?;
    s.sync()?;
    let mps = gpu.mps_enabled().map(i32::from).unwrap_or(-1);
    let mut out = std::io::stdout();
    writeln!(out, "ready sms={} mps={}", gpu.sm_count(), mps)?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        match line?.trim() {
            "go" => {
                let t0 = Instant::now();
                p.enqueue_native(&s)?;
                s.sync()?;
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                writeln!(out, "done {ms:.4}")?;
                out.flush()?;
            }
            "quit" => break,
            other => anyhow::bail!("spatial-child: unknown command {other:?}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_in_whole_groups_of_eight() {
        // H100: 132 SMs = 16 groups of 8 + 4.
        let s = plan_splits(&DEFAULT_MEM_SMS, 132 / GROUP_SMS, GROUP_SMS).expect("valid");
        let got: Vec<(u32, u32, u32, u32)> =
            s.iter().map(|s| (s.mem_groups, s.mem_sms, s.compute_groups, s.compute_sms)).collect();
        assert_eq!(got, vec![(2, 16, 14, 112), (4, 32, 12, 96), (6, 48, 10, 80), (8, 64, 8, 64)]);
        assert!(s.iter().all(|s| s.mem_sms + s.compute_sms == 128));
        assert!(plan_splits(&[12], 16, 8).unwrap_err().contains("multiple"));
        assert!(plan_splits(&[0], 16, 8).is_err());
        assert!(plan_splits(&[128], 16, 8).unwrap_err().contains("between 8 and 120"));
        assert!(plan_splits(&[8], 1, 8).is_err());
        assert!(plan_splits(&[8], 16, 0).is_err());
    }

    #[test]
    fn mps_percentages_round_up() {
        assert_eq!(mps_percent(16, 132), 13); // 12.1% -> 13% (17.2 SMs)
        assert_eq!(mps_percent(112, 132), 85); // 84.8%
        assert_eq!(mps_percent(64, 132), 49); // 48.5%
        assert_eq!(mps_percent(66, 132), 50);
        assert_eq!(mps_percent(132, 132), 100);
        assert_eq!(mps_percent(0, 132), 1);
        assert_eq!(mps_percent(5, 0), 100);
        for s in DEFAULT_MEM_SMS {
            assert!(mps_percent(s, 132) as f64 * 132.0 / 100.0 >= s as f64);
        }
    }

    #[test]
    fn slowdown_and_stp() {
        assert_eq!(slowdown(15.0, 10.0), 1.5);
        // One after the other: the first app is not slowed, the second waits for it.
        let (ta, tb) = (10.0, 5.0);
        let seq = stp(&[(ta, ta), (tb, ta + tb)]);
        assert!((seq - (1.0 + 5.0 / 15.0)).abs() < 1e-12);
        // Perfect sharing of two apps that need disjoint resources: STP 2.
        assert_eq!(stp(&[(ta, ta), (tb, tb)]), 2.0);
        assert_eq!(stp(&[]), 0.0);
    }

    #[test]
    fn faster_with_a_tie_band() {
        assert_eq!(faster(10.0, 12.0, TIE), "workers");
        assert_eq!(faster(12.0, 10.0, TIE), "green");
        assert_eq!(faster(10.0, 10.1, TIE), "tie");
        assert_eq!(faster(10.2, 10.0, TIE), "tie");
    }

    #[test]
    fn child_args_keep_the_prefix_and_move_globals() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let tail = s(&["spatial-child", "--app", "triad", "--gpu", "0", "--seed", "1"]);
        // gpumux CLI, globals before the subcommand.
        let got = child_args(
            &s(&["bench", "cuda", "--json", "o.json", "--gpu=0", "spatial", "--reps", "3"]),
            &["spatial", "all"],
            &tail,
        );
        assert_eq!(got, s(&["bench", "cuda", "spatial-child", "--app", "triad", "--gpu", "0", "--seed", "1"]));
        // gpumux-cuda-check, globals after the subcommand (dropped with it).
        let got = child_args(&s(&["spatial", "--json", "x"]), &["spatial", "all"], &tail);
        assert_eq!(got, tail);
        let got = child_args(&s(&["--seed", "7", "all"]), &["spatial", "all"], &tail);
        assert_eq!(got, tail);
    }

    #[test]
    fn ready_lines() {
        assert_eq!(parse_ready("ready sms=132 mps=1"), Some((132, 1)));
        assert_eq!(parse_ready("ready sms=18 mps=-1"), Some((18, -1)));
        assert_eq!(parse_ready("ready"), None);
        assert_eq!(parse_ready("error: no GPU"), None);
    }

    #[test]
    fn modes_are_known() {
        let c = SpatialConfig::new(3, 1);
        assert!(c.wants("green") && c.wants("mps"));
        let c = SpatialConfig { modes: vec!["green".into()], ..SpatialConfig::new(3, 1) };
        assert!(c.wants("green") && !c.wants("mps"));
        assert_eq!(c.mem_sms, DEFAULT_MEM_SMS.to_vec());
    }
}

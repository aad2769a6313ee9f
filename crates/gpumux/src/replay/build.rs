//! A recording turned into a workload: one process per client, its
//! operations in submission order, the host's time between them, and each
//! kernel's simulator timing fitted to the time it took with the device to
//! itself (docs/calibration.md, "Replaying the daemon's clients").
//!
//! **The host.** A client's host is busy between its operations, and waits
//! for an operation whose end answers it (a sync, a copy through its shared
//! region) when its next submission came after that end: the replay then
//! puts a `sync` there and counts the host's time from the end. Otherwise
//! (launches, which are never answered, or a copy the library pipelined) the
//! host's time runs from the submission. Every process may run ahead of its
//! stream without bound (the daemon's `queued_ops` limit is far above what
//! the examples queue).
//!
//! **Kernel times.** A kernel's time is from when it could start (submitted,
//! and the operation before it on its stream done) to its end as the core saw
//! it: the daemon's launch and polling latency are inside, as `calibrate`
//! leaves the launch overhead inside its block times. The simulator's block
//! time is fitted (`calibrate::measure::fit_kernel`) so that the kernel alone
//! on the target simulator takes the mean of those times, per kernel shape
//! (name, grid, block, shared memory, registers), taken from the alone
//! recordings when given, else from the instances of the replayed recording
//! that no other client's work overlapped, else (noted) the shortest instance.

use super::recording::{ClientRec, Recording};
use crate::calibrate::measure::{fit_kernel, sim_alone, KernelRuns};
use anyhow::{Context, Result};
use gpumux_engine::kernel::{DeviceInfo, KernelDesc, KernelShape, SimTiming};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumuxd::recording::{OpLine, What};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// A kernel's identity across recordings.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    pub name: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
    pub regs_per_thread: u32,
}

impl Shape {
    pub(super) fn of(what: &What) -> Option<Shape> {
        match what {
            What::Kernel { name, grid, block, shared_bytes, regs_per_thread, .. } => Some(Shape {
                name: name.clone(),
                grid: *grid,
                block: *block,
                shared_bytes: *shared_bytes,
                regs_per_thread: *regs_per_thread,
            }),
            _ => None,
        }
    }

    pub(super) fn desc(&self, timing: SimTiming) -> KernelDesc {
        let blocks = self.grid.iter().map(|&g| u64::from(g)).product();
        let threads = self.block.iter().product();
        let shape = KernelShape::new(blocks, threads, self.regs_per_thread).with_smem_per_block(self.shared_bytes);
        // A client's kernel may write in place, as the daemon assumes (`launch`).
        KernelDesc::new(self.name.clone(), shape).with_idempotent(false).with_sim_timing(timing)
    }
}

/// Where a kernel's fitted time came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The alone recordings.
    Alone,
    /// Instances of the replayed recording that no other client's work overlapped.
    Uncontended,
    /// The shortest instance of the replayed recording: it never had the device to itself.
    Shortest,
}

/// One kernel shape's fitted timing.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Fitted {
    pub name: String,
    pub blocks: u64,
    pub threads: u32,
    /// Recorded time it was fitted to (mean), µs.
    pub recorded_us: f64,
    pub instances: usize,
    pub source: Source,
    pub block_time_us: f64,
    /// Memory intensity the simulator gives it: 0 unless `--mem-intensity` or `--probe` gives one.
    pub mem_intensity: f64,
}

/// For each completed operation of a client, when it could start: its
/// submission, or the end of the operation before it on its stream if later
/// (memsets and device copies skipped: see inside).
pub(super) fn ready_times(c: &ClientRec) -> Vec<(u64, &OpLine)> {
    let mut last_end: HashMap<u32, u64> = HashMap::new();
    let mut out = Vec::new();
    for o in c.completed() {
        let ready = last_end.get(&o.stream).map_or(o.submitted_ns, |&e| e.max(o.submitted_ns));
        // A memset or device copy is left out of the workload (it has none):
        // the operation after it counts from where the memset could start,
        // so its time (and its round through the daemon) is in that one's.
        if !matches!(o.what, What::D2d { .. }) {
            last_end.insert(o.stream, o.ended_ns);
        }
        out.push((ready.min(o.ended_ns), o));
    }
    out
}

/// Recorded kernel times per shape: (durations with the device to itself, all durations).
#[derive(Default)]
struct Samples {
    clean: Vec<f64>,
    all: Vec<f64>,
}

fn kernel_samples(r: &Recording, only_clean: bool) -> BTreeMap<Shape, Samples> {
    // Device intervals of every client's kernels and copies.
    let mut busy: Vec<(u64, u64, u64)> = Vec::new();
    for c in &r.clients {
        for o in c.completed() {
            if let Some(s) = o.started_ns {
                busy.push((s, o.ended_ns, c.id));
            }
        }
    }
    busy.sort_unstable();
    let mut out: BTreeMap<Shape, Samples> = BTreeMap::new();
    for c in &r.clients {
        for (ready, o) in ready_times(c) {
            let Some(shape) = Shape::of(&o.what) else { continue };
            let t = (o.ended_ns - ready) as f64;
            // Any other client's interval starting before this one's end and ending after its start?
            let upto = busy.partition_point(|b| b.0 < o.ended_ns);
            let shared = busy[..upto].iter().any(|b| b.2 != c.id && b.1 > ready);
            let e = out.entry(shape).or_default();
            if !shared || !only_clean {
                e.clean.push(t);
            }
            e.all.push(t);
        }
    }
    out
}

/// Mean recorded time of each kernel shape over `alone` recordings (every instance: each
/// client ran by itself), ns.
pub(super) fn alone_means(alone: &[Recording]) -> BTreeMap<Shape, f64> {
    let mut all: BTreeMap<Shape, Vec<f64>> = BTreeMap::new();
    for a in alone {
        for (shape, s) in kernel_samples(a, false) {
            all.entry(shape).or_default().extend(s.all);
        }
    }
    all.into_iter().filter(|(_, t)| !t.is_empty()).map(|(s, t)| (s, t.iter().sum::<f64>() / t.len() as f64)).collect()
}

/// Fits every kernel shape of `r` for `target`, from `alone` recordings first. A kernel
/// named in `mem` gets that memory intensity (`--mem-intensity`), its block time fitted with
/// it, so that alone it still takes its recorded time.
pub fn fit_kernels(
    r: &Recording,
    alone: &[Recording],
    target: &DeviceInfo,
    mem: &HashMap<String, f64>,
    notes: &mut Vec<String>,
) -> Result<BTreeMap<Shape, (SimTiming, Fitted)>> {
    let mut from_alone: BTreeMap<Shape, Vec<f64>> = BTreeMap::new();
    for a in alone {
        // A client of an alone recording ran by itself: every instance counts.
        for (shape, s) in kernel_samples(a, false) {
            from_alone.entry(shape).or_default().extend(s.all);
        }
    }
    let mut out = BTreeMap::new();
    for (shape, s) in kernel_samples(r, true) {
        let (times, source) = match from_alone.get(&shape) {
            Some(t) if !t.is_empty() => (t.clone(), Source::Alone),
            _ if !s.clean.is_empty() => (s.clean, Source::Uncontended),
            _ => {
                let min = s.all.iter().copied().fold(f64::INFINITY, f64::min);
                notes.push(format!(
                    "kernel {} ({:?} x {:?}) never had the device to itself{}: timed from its shortest run, \
                     {:.1} us, which sharing may have stretched",
                    gpumux_files::text::quote(&shape.name),
                    shape.grid,
                    shape.block,
                    if alone.is_empty() { " (no --alone recording)" } else { " nor ran in the --alone recordings" },
                    min / 1e3
                ));
                (vec![min], Source::Shortest)
            }
        };
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        let fitted = fit(&shape, mean, target, mem.get(&shape.name).copied())
            .with_context(|| format!("fitting kernel {}", gpumux_files::text::quote(&shape.name)))?;
        let desc = shape.desc(fitted);
        out.insert(
            shape.clone(),
            (
                fitted,
                Fitted {
                    name: shape.name.clone(),
                    blocks: desc.shape.blocks,
                    threads: desc.shape.threads_per_block,
                    recorded_us: mean / 1e3,
                    instances: times.len(),
                    source,
                    block_time_us: fitted.block_time_ns as f64 / 1e3,
                    mem_intensity: fitted.mem_intensity,
                },
            ),
        );
    }
    Ok(out)
}

/// The block time for which `shape` alone on `target` takes `alone_ns`
/// (calibrate's fit, with no spread or memory measurements: both stay 0), or with memory
/// intensity `mem` when given: a recording made with the whole device has no run on fewer
/// SMs to identify it from (docs/calibration.md), so it can only be given.
pub(super) fn fit(shape: &Shape, alone_ns: f64, target: &DeviceInfo, mem: Option<f64>) -> Result<SimTiming> {
    if let Some(m) = mem {
        return fit_with_mem(shape, alone_ns, target, m);
    }
    let desc = shape.desc(SimTiming::new(1000));
    let bps = target.blocks_per_sm(&desc).with_context(|| format!("on {}", target.name))?;
    let runs = KernelRuns {
        bps,
        alone: vec![alone_ns.max(1.0)],
        small_sms: target.num_sms,
        small: None,
        one_sm: None,
        singles: Vec::new(),
        retreat: None,
    };
    let cal = fit_kernel(&desc, &runs, target, 0.0)?;
    Ok(SimTiming {
        block_time_ns: (cal.block_time_us * 1000.0).round().max(1.0) as u64,
        block_time_spread: cal.block_time_spread,
        mem_intensity: cal.mem_intensity,
    })
}

/// `fit` with memory intensity `m`: the block time scaled until the simulated alone time on
/// every SM is `alone_ns` (the memory model's factor alone cancels, as in `fit_kernel`).
fn fit_with_mem(shape: &Shape, alone_ns: f64, target: &DeviceInfo, m: f64) -> Result<SimTiming> {
    let timing =
        |bt: f64| SimTiming { block_time_ns: bt.round().max(1.0) as u64, block_time_spread: 0.0, mem_intensity: m };
    let alone_ns = alone_ns.max(1.0);
    let mut bt = 1000.0;
    for _ in 0..4 {
        let t = sim_alone(target, &Arc::new(shape.desc(timing(bt))), target.num_sms, 1)?;
        bt *= alone_ns / t.max(1.0);
    }
    Ok(timing(bt))
}

/// Most operations a process may have in flight in the replay: any number
/// the daemon's clients queue (their `queued_ops` limit is 4096 by default).
const ASYNC_DEPTH: u32 = 1_000_000;

/// `r` as a workload, with `kernels` (from [`fit_kernels`]) timing its kernels.
/// Process names are the clients' (`NAME#2` for a second client of one name).
pub fn workload(
    r: &Recording,
    kernels: &BTreeMap<Shape, (SimTiming, Fitted)>,
    notes: &mut Vec<String>,
) -> Result<Workload> {
    let t0 = r.clients.iter().filter_map(|c| c.first_submitted()).min().unwrap_or(0);
    let mut seen: HashMap<&str, usize> = HashMap::new();
    let mut processes = Vec::new();
    let (mut left_out, mut streams_merged, mut dropped) = (BTreeMap::<&str, usize>::new(), Vec::new(), 0usize);
    for c in &r.clients {
        let k = seen.entry(c.name.as_str()).or_insert(0);
        *k += 1;
        let name = if *k == 1 { c.name.clone() } else { format!("{}#{k}", c.name) };
        if c.reprioritised {
            notes.push(format!(
                "client {}: its priority changed during the run; replayed at {}",
                gpumux_files::text::quote(&name),
                c.priority
            ));
        }
        dropped += c.ops.iter().filter(|o| !o.completed).count();
        if c.completed().map(|o| o.stream).collect::<std::collections::HashSet<_>>().len() > 1 {
            streams_merged.push(name.clone());
        }
        let ops: Vec<&OpLine> = c.completed().collect();
        let mut out = Vec::new();
        // When the host was last free to go on.
        let mut host_free = None;
        for (i, o) in ops.iter().enumerate() {
            if let Some(free) = host_free {
                let gap = o.submitted_ns.saturating_sub(free);
                if gap > 0 {
                    out.push(Op::Cpu { ns: gap });
                }
            }
            let waited = o.reply && ops.get(i + 1).is_none_or(|next| next.submitted_ns >= o.ended_ns);
            match &o.what {
                What::Kernel { .. } => {
                    let shape = Shape::of(&o.what).context("a kernel has a shape")?;
                    let (timing, _) = kernels.get(&shape).context("every kernel shape was fitted")?;
                    out.push(Op::Kernel(Arc::new(shape.desc(*timing))));
                }
                What::H2d { bytes } => out.push(Op::CopyToDevice { bytes: (*bytes).max(1) }),
                What::D2h { bytes } => out.push(Op::CopyToHost { bytes: (*bytes).max(1) }),
                What::Sync => {}
                What::D2d { .. } => *left_out.entry("device-to-device copies and memsets").or_default() += 1,
                What::Event | What::Wait | What::HostFunc => {
                    *left_out.entry("events, stream waits and host functions").or_default() += 1
                }
            }
            if waited {
                out.push(Op::Sync);
            }
            host_free = Some(if waited { o.ended_ns } else { o.submitted_ns });
        }
        if out.is_empty() {
            out.push(Op::Sync);
        }
        let first = c.first_submitted().unwrap_or(t0);
        processes.push(ProcessSpec {
            name,
            priority: c.priority,
            weight: c.weight,
            arrival_ns: first - t0,
            repetitions: 1,
            async_depth: ASYNC_DEPTH,
            ops: out,
        });
    }
    for (what, n) in left_out {
        notes.push(format!(
            "{n} {what} left out (the workload format has none): a memset's or device copy's time is counted in \
             the next operation's of its stream, the others' not at all"
        ));
    }
    if !streams_merged.is_empty() {
        notes.push(format!(
            "clients {} used several streams: replayed as one stream in submission order",
            streams_merged.join(", ")
        ));
    }
    if dropped > 0 {
        notes.push(format!("{dropped} operation(s) dropped when their client left: not replayed"));
    }
    let name = std::path::Path::new(&r.file)
        .file_stem()
        .map_or_else(|| "replay".to_string(), |s| s.to_string_lossy().into_owned());
    let name = if gpumux_files::text::check_name(&name).is_ok() { name } else { "replay".to_string() };
    Ok(Workload { name, processes, replay_min_runs: None })
}

/// A link's fitted figures, one direction: bytes per second and a fixed latency.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct LinkFit {
    pub bytes_per_s: f64,
    pub latency_ns: f64,
    pub copies: usize,
}

/// Each direction's copies of `recs` (from when each could start to its end)
/// fitted as `latency + bytes / bandwidth` by least squares: the copies the
/// clients saw, through their shared regions, which are what a replay must
/// reproduce (a copy engine's raw speed, as `calibrate` measures it, is
/// faster than a client's staged copy).
pub fn fit_link(recs: &[&Recording]) -> (Option<LinkFit>, Option<LinkFit>) {
    let (mut h2d, mut d2h) = (Vec::new(), Vec::new());
    for r in recs {
        for c in &r.clients {
            for (ready, o) in ready_times(c) {
                let t = (o.ended_ns - ready) as f64;
                match o.what {
                    What::H2d { bytes } => h2d.push((bytes as f64, t)),
                    What::D2h { bytes } => d2h.push((bytes as f64, t)),
                    _ => {}
                }
            }
        }
    }
    (line_fit(&h2d), line_fit(&d2h))
}

fn line_fit(xs: &[(f64, f64)]) -> Option<LinkFit> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let (mx, mt) = (xs.iter().map(|p| p.0).sum::<f64>() / n, xs.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = xs.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxt: f64 = xs.iter().map(|p| (p.0 - mx) * (p.1 - mt)).sum();
    // One size (or a fit with a negative latency or slope): the bandwidth through the origin.
    let through_origin = || (0.0, xs.iter().map(|p| p.1).sum::<f64>() / xs.iter().map(|p| p.0).sum::<f64>());
    let (latency, ns_per_byte) = if sxx > 0.0 {
        let b = sxt / sxx;
        let a = mt - b * mx;
        if a >= 0.0 && b > 0.0 {
            (a, b)
        } else {
            through_origin()
        }
    } else {
        through_origin()
    };
    (ns_per_byte > 0.0 && ns_per_byte.is_finite()).then(|| LinkFit {
        bytes_per_s: 1e9 / ns_per_byte,
        latency_ns: latency,
        copies: xs.len(),
    })
}

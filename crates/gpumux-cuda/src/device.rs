//! The engine's [`Device`] on a real NVIDIA GPU.
//!
//! Each engine launch runs the suite kernel named by `KernelDesc.suite` as
//! preemptible workers ([`WorkerLaunch`]) restricted to the launch's SM set
//! (`%smid` filtering) and block ranges. What the contract asks, and how it is
//! realised here:
//!
//! * `Launch`: one `WorkerLaunch` per contiguous range of not-yet-done suite
//!   blocks, queued on one stream of the launch's priority (engine priority
//!   `p` → CUDA stream priority `least - p`, clamped: higher is more urgent).
//! * Block indices: the engine's grid (`KernelDesc.blocks`, from the workload
//!   file) need not equal the suite kernel's grid. Engine block `i` of `N`
//!   stands for suite blocks `[⌊iM/N⌋, ⌊(i+1)M/N⌋)` of `M`. The device keeps,
//!   per kernel invocation, the exact set of suite blocks not yet run, so
//!   nothing is lost or run twice whatever the mapping; an engine block is
//!   reported remaining while any of its suite blocks is.
//! * Exhaustion: workers claim blocks on the GPU, so the host learns that a
//!   launch has nothing left to issue only when it ends: its SMs are released
//!   (`Exhausted`) together with `LaunchEnded` (no leftover overlap).
//! * `Retreat`, any mechanism: the retreat request is written into the
//!   control record by `cuStreamWriteValue32` on an idle control stream;
//!   workers stop at their next chunk boundary (a drain of at most one chunk
//!   per worker). `ContextSwitch` cannot be done in software (no register
//!   save) and `Flush` cannot drop running blocks: both are served as this
//!   chunk-boundary drain, the cheapest safe equivalent. A partial retreat is
//!   retreat + restart on the SMs that remain; the released SMs are announced
//!   (`Retreated`) when the old workers have all left.
//! * `Grow`: retreat + restart on the larger set.
//! * `Copy`: a real asynchronous copy of `bytes` between pinned host staging
//!   memory and a device scratch buffer, on one stream per direction.
//! * Time: nanoseconds of a monotonic host clock since the device was opened;
//!   `advance` polls CUDA events (busy-wait, sleeping only when nothing runs).
//!
//! Suite kernels: the single-kernel apps triad, transpose, spmv, sgemm,
//! nbody, histogram, bfs (one level step) are shared by every process (one
//! set of buffers per app and size). The multi-kernel apps stencil (`step`,
//! ping-pong), reduction (`partial`, `final`) and kmeans (`assign`,
//! `update`) run as *instances*: one per (process, app), with its own buffers;
//! a process's kernels of that app run on it one after the other
//! ([`suite::Sequence`] checks the order and picks the ping-pong side).
//!
//! Results are checked when the device is dropped: every single kernel's
//! outputs against a native (untransformed) launch on the same inputs
//! (bitwise; for histogram, native × number of completed invocations), and
//! the native launch against the CPU reference where that is cheap; every
//! instance's final outputs against a native run of the same kernel sequence
//! on fresh buffers (bitwise), and that against the CPU reference where cheap.
//! The outcome is printed on stderr (`gpumux-cuda verify ...`) and kept in
//! [`CudaDevice::verification`].

// Lists of block ranges with one element are meant (sets of ranges).
#![allow(clippy::single_range_in_vec_init)]

use crate::error::CudaError;
use crate::exec::Prepared;
use crate::preempt::{SmMask, WorkerLaunch};
use crate::runtime::{DeviceBuffer, Event as CuEvent, Gpu, HostMapped, Stream};
use crate::suite::{self, compare, App, HostData, Sequence, Tolerance};
use cudarc::driver::sys as cu;
use gpumux_engine::device::{
    Command, CopyDirection, Device, DeviceError, DeviceStats, Event, Message, ProtocolError, ReleaseCause, TraceSpan,
};
use gpumux_engine::ids::{CopyId, KernelId, LaunchId, ProcessId};
use gpumux_engine::kernel::{DeviceInfo, KernelDesc, SmLimits, SuiteKernelRef};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Suite apps the device runs (every app of the suite).
pub const SUPPORTED: [App; 10] = App::ALL;

/// What a `suite = { name, kernel, params }` entry names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuiteTarget {
    pub app: App,
    /// The app's main dimension (see [`resolve_suite`]).
    pub size: u64,
    /// kmeans clusters ([`suite::KMEANS_K`] for the other apps).
    pub k: u32,
    /// Which kernel: an index into [`App::kernel_names`].
    pub kernel: usize,
}

/// Largest sizes of the multi-kernel apps (buffers of a few GiB; 32-bit indices).
const MAX_STENCIL_SIDE: u64 = 1 << 15;
const MAX_REDUCTION_N: u64 = 1 << 31;
const MAX_KMEANS_N: u64 = 1 << 28;
const MAX_KMEANS_K: u64 = 4096;

/// Which suite app, kernel and size a `suite` entry names.
///
/// The name is `APP` or `APP.KERNEL` (a workload file's
/// `suite = { name = "kmeans", kernel = "assign" }` arrives as
/// `kmeans.assign`). Apps with one kernel need no kernel part (stencil's is
/// `step`); reduction (`partial`, `final`) and kmeans (`assign`, `update`)
/// need it.
///
/// Size parameters: `n` (or `size`) is the app's main dimension as in
/// [`App::default_size`], except histogram, whose `n` counts input *bytes*
/// (`words` counts 32-bit words). sgemm is square: `m`, `n`, `k` must agree.
/// kmeans: `n` points and `k` clusters (default 16, at most `n`).
pub fn resolve_suite(r: &SuiteKernelRef) -> Result<SuiteTarget, CudaError> {
    let (app_name, kernel_name) = match r.name.split_once('.') {
        Some((a, k)) => (a, Some(k)),
        None => (r.name.as_str(), None),
    };
    let app = App::from_name(app_name).ok_or_else(|| {
        CudaError::Invalid(format!(
            "unknown suite kernel `{}`; the CUDA device runs: {}",
            r.name,
            SUPPORTED.map(App::name).join(", ")
        ))
    })?;
    let names = app.kernel_names();
    let kernel = match kernel_name {
        Some(k) => app.kernel_index(k).ok_or_else(|| {
            CudaError::Invalid(format!(
                "suite app `{}` has no kernel `{k}`; its kernels: {}",
                app.name(),
                names.join(", ")
            ))
        })?,
        None if names.len() == 1 => 0,
        None => {
            return Err(CudaError::Invalid(format!(
                "suite app `{}` has {} kernels ({}): name one, e.g. \
                 `suite = {{ name = \"{}\", kernel = \"{}\", params = {{ .. }} }}`; they run {}",
                app.name(),
                names.len(),
                names.join(", "),
                app.name(),
                names[0],
                app.kernel_order()
            )))
        }
    };
    let get = |k: &str| -> Result<Option<u64>, CudaError> {
        match r.params.get(k) {
            None => Ok(None),
            Some(&v) if v >= 1.0 && v.fract() == 0.0 && v < (1u64 << 40) as f64 => Ok(Some(v as u64)),
            Some(v) => Err(CudaError::Invalid(format!(
                "suite kernel `{}`: parameter {k} = {v} is not a positive whole number",
                r.name
            ))),
        }
    };
    let size = match app {
        App::Histogram => match (get("words")?, get("n")?) {
            (Some(w), _) => Some(w),
            (None, Some(bytes)) => Some(bytes.div_ceil(4)),
            (None, None) => None,
        },
        App::Sgemm => {
            let (m, n, k) = (get("m")?, get("n")?.or(get("size")?), get("k")?);
            for (name, v) in [("m", m), ("k", k)] {
                if let (Some(v), Some(n)) = (v, n) {
                    if v != n {
                        return Err(CudaError::Invalid(format!(
                            "suite kernel sgemm is square: {name} = {v} differs from n = {n}"
                        )));
                    }
                }
            }
            n.or(m).or(k)
        }
        _ => get("n")?.or(get("size")?),
    };
    if app == App::Histogram {
        if let Some(b) = get("bins")? {
            if b != 256 {
                return Err(CudaError::Invalid(format!("suite kernel histogram has 256 bins, not {b}")));
            }
        }
    }
    let size =
        size.ok_or_else(|| CudaError::Invalid(format!("suite kernel `{}` needs a size parameter `n`", r.name)))?;
    let max = match app {
        App::Stencil => MAX_STENCIL_SIDE,
        App::Reduction => MAX_REDUCTION_N,
        App::Kmeans => MAX_KMEANS_N,
        _ => u64::MAX,
    };
    if size > max {
        return Err(CudaError::Invalid(format!(
            "suite kernel `{}`: n = {size} is above the {max} the device takes for {}",
            r.name,
            app.name()
        )));
    }
    let k = match app {
        App::Kmeans => match get("k")? {
            Some(k) if k > size.min(MAX_KMEANS_K) => {
                return Err(CudaError::Invalid(format!(
                    "suite kernel `{}`: k = {k} clusters, but at most {} (n = {size} points, at most {MAX_KMEANS_K})",
                    r.name,
                    size.min(MAX_KMEANS_K)
                )))
            }
            Some(k) => k as u32,
            None => (suite::KMEANS_K as u64).min(size) as u32,
        },
        _ => suite::KMEANS_K,
    };
    Ok(SuiteTarget { app, size, k, kernel })
}

/// Checks before a run what the device would refuse during it: every kernel
/// names a suite kernel with valid parameters, and each process's kernels of
/// a multi-kernel app agree on the parameters and come in an order the app
/// can run (the device checks the same again at each launch).
pub fn check_workload(w: &gpumux_engine::model::Workload) -> Result<(), CudaError> {
    for p in &w.processes {
        let mut instances: HashMap<App, (SuiteTarget, Sequence)> = HashMap::new();
        for op in &p.ops {
            let gpumux_engine::model::Op::Kernel(desc) = op else { continue };
            let at = |e: String| CudaError::Invalid(format!("process {:?}, kernel `{}`: {e}", p.name, desc.name));
            let r = desc.suite.as_ref().ok_or_else(|| {
                at("names no CUDA kernel: the real GPU runs only kernels with `suite = { name, params }`".into())
            })?;
            let t = resolve_suite(r).map_err(|e| at(e.to_string()))?;
            if !t.app.is_multi_kernel() {
                continue;
            }
            let (first, seq) = instances.entry(t.app).or_insert_with(|| (t, Sequence::new(t.app)));
            same_instance(first, &t).map_err(at)?;
            seq.begin(t.kernel).map_err(at)?;
            seq.complete().map_err(at)?;
        }
    }
    Ok(())
}

/// Err when `t` has other size parameters than the instance made for `first`.
fn same_instance(first: &SuiteTarget, t: &SuiteTarget) -> Result<(), String> {
    if (first.size, first.k) == (t.size, t.k) {
        return Ok(());
    }
    let describe = |x: &SuiteTarget| match x.app {
        App::Kmeans => format!("n = {}, k = {}", x.size, x.k),
        _ => format!("n = {}", x.size),
    };
    Err(format!(
        "{} `{}` has {}, but this process's {} instance was made with {}: the kernels of one \
         instance (one per process and app) must have the same params",
        t.app.name(),
        t.app.kernel_names().get(t.kernel).copied().unwrap_or("?"),
        describe(t),
        t.app.name(),
        describe(first)
    ))
}

/// Maps engine block indices (`n` blocks) onto suite block indices (`m`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMap {
    pub engine: u64,
    pub suite: u64,
}

impl BlockMap {
    /// First suite block of engine block `i` (`i` may be `engine`).
    pub fn start(&self, i: u64) -> u64 {
        ((i as u128 * self.suite as u128) / self.engine.max(1) as u128) as u64
    }
    /// Suite blocks of engine blocks `r`.
    pub fn to_suite(&self, r: &Range<u64>) -> Range<u64> {
        self.start(r.start)..self.start(r.end)
    }
    /// The engine block holding suite block `s`.
    pub fn engine_of(&self, s: u64) -> u64 {
        // Largest i with ⌊iM/N⌋ ≤ s: i = ⌈(s+1)N/M⌉ − 1.
        let num = (s as u128 + 1) * self.engine as u128;
        (num.div_ceil(self.suite.max(1) as u128) as u64).saturating_sub(1)
    }
}

/// `set ∩ r` for a sorted, disjoint list of ranges.
fn intersect(set: &[Range<u64>], r: &Range<u64>) -> Vec<Range<u64>> {
    set.iter()
        .filter_map(|x| {
            let (a, b) = (x.start.max(r.start), x.end.min(r.end));
            (a < b).then_some(a..b)
        })
        .collect()
}

/// `set − r`, keeping the list sorted and disjoint.
fn subtract(set: &mut Vec<Range<u64>>, r: &Range<u64>) {
    if r.start >= r.end {
        return;
    }
    let mut out = Vec::with_capacity(set.len() + 1);
    for x in set.drain(..) {
        if x.end <= r.start || x.start >= r.end {
            out.push(x);
            continue;
        }
        if x.start < r.start {
            out.push(x.start..r.start);
        }
        if r.end < x.end {
            out.push(r.end..x.end);
        }
    }
    *set = out;
}

/// Engine blocks of `requested` that still hold suite blocks of `left`.
fn engine_remaining(map: BlockMap, requested: &BlockRanges, left: &[Range<u64>]) -> BlockRanges {
    let mut out: Vec<Range<u64>> = Vec::new();
    for er in requested.ranges() {
        for s in intersect(left, &map.to_suite(er)) {
            let a = map.engine_of(s.start).max(er.start);
            let b = (map.engine_of(s.end - 1) + 1).min(er.end);
            match out.last_mut() {
                Some(last) if last.end >= a => last.end = last.end.max(b),
                _ => out.push(a..b),
            }
        }
    }
    let mut br = BlockRanges::new();
    for r in out {
        br.insert(r);
    }
    br
}

fn backend(e: CudaError) -> DeviceError {
    DeviceError::Backend(e.to_string())
}

/// One suite app ready to run: buffers, worker functions, what to check.
struct SuiteKernel {
    label: String,
    app: App,
    size: u64,
    k: u32,
    /// Its workload's launches are the templates (one for a single-kernel app).
    prepared: Prepared,
    /// Suite blocks per template.
    blocks: Vec<u64>,
    /// Idle workers (control records) per template, reused across launches.
    pools: Vec<Vec<WorkerLaunch>>,
    role: Role,
}

enum Role {
    /// A single-kernel app, shared by every process.
    Single {
        /// Outputs of one native launch on fresh inputs.
        native: Vec<HostData>,
        /// What the native launch was checked against on the CPU.
        cpu_check: String,
        /// Kernel invocations that ran all their blocks in this device run.
        completed: u64,
    },
    /// One process's instance of a multi-kernel app.
    Instance {
        seq: Sequence,
        /// The verification line for `seq.done().len()` kernels, once made.
        checked: Option<(usize, String)>,
    },
}

impl SuiteKernel {
    /// Name of a template's kernel (for traces).
    fn kernel_name(&self, t: usize) -> &'static str {
        let names = self.app.kernel_names();
        match self.app {
            App::Stencil => names[0],
            _ => names.get(t).copied().unwrap_or("?"),
        }
    }
}

/// What persists across device opens of one GPU: the context, compiled and
/// loaded kernels with their buffers, copy staging. One device at a time holds it.
struct Shared {
    gpu: Gpu,
    kernels: Vec<SuiteKernel>,
    by_key: HashMap<String, usize>,
    staging_host: HostMapped,
    staging_dev: DeviceBuffer,
    streams: HashMap<i32, Vec<Stream>>,
}

const STAGING_BYTES: usize = 64 << 20;

static SLOTS: Mutex<Vec<(u32, Option<Box<Shared>>)>> = Mutex::new(Vec::new());
static FREED: Condvar = Condvar::new();

/// Takes the GPU's shared state, waiting while another device holds it (runs
/// of `gpumux run` are then serialised on the GPU instead of interfering).
fn take_shared(ordinal: u32) -> Result<Box<Shared>, CudaError> {
    let mut slots = SLOTS.lock().map_err(|_| CudaError::Invalid("device registry poisoned".into()))?;
    loop {
        match slots.iter().position(|(o, _)| *o == ordinal) {
            None => {
                let s = Shared::open(ordinal)?;
                slots.push((ordinal, None));
                return Ok(Box::new(s));
            }
            Some(i) => {
                if let Some(s) = slots[i].1.take() {
                    return Ok(s);
                }
                slots = FREED.wait(slots).map_err(|_| CudaError::Invalid("device registry poisoned".into()))?;
            }
        }
    }
}

fn give_shared(ordinal: u32, s: Box<Shared>) {
    if let Ok(mut slots) = SLOTS.lock() {
        if let Some(slot) = slots.iter_mut().find(|(o, _)| *o == ordinal) {
            slot.1 = Some(s);
        }
        FREED.notify_all();
    }
}

impl Shared {
    fn open(ordinal: u32) -> Result<Shared, CudaError> {
        let gpu = Gpu::open(ordinal as i32)?;
        gpu.bind()?;
        Ok(Shared {
            staging_host: HostMapped::new(STAGING_BYTES)?,
            staging_dev: DeviceBuffer::new(STAGING_BYTES)?,
            gpu,
            kernels: Vec::new(),
            by_key: HashMap::new(),
            streams: HashMap::new(),
        })
    }

    fn stream(&mut self, priority: i32) -> Result<Stream, CudaError> {
        let (least, greatest) = self.gpu.priority_range;
        let p = least.saturating_sub(priority).clamp(greatest.min(least), greatest.max(least));
        match self.streams.get_mut(&p).and_then(Vec::pop) {
            Some(s) => Ok(s),
            None => Stream::new(&self.gpu, p),
        }
    }

    fn give_stream(&mut self, s: Stream) {
        self.streams.entry(s.priority).or_default().push(s);
    }

    /// The single-kernel app `t`, prepared on first use (compile, inputs, native run).
    fn single(&mut self, t: &SuiteTarget, seed: u64) -> Result<usize, CudaError> {
        let (app, size) = (t.app, t.size);
        let key = format!("{}:{size}", app.name());
        if let Some(&i) = self.by_key.get(&key) {
            return Ok(i);
        }
        let workload = suite::build_sized(app, size, 1, seed);
        let launch = workload
            .launches
            .first()
            .cloned()
            .ok_or_else(|| CudaError::Invalid(format!("suite app {} has no launch", app.name())))?;
        let prepared = Prepared::new(&self.gpu, workload)?;
        prepared.reset()?;
        let s = Stream::low(&self.gpu)?;
        prepared.enqueue_native(&s)?;
        s.sync()?;
        let native = prepared.outputs()?;
        let cpu_check = if cpu_reference_is_cheap(app, size) {
            let want = prepared.workload.reference();
            for ((got, want), o) in native.iter().zip(&want).zip(&prepared.workload.outputs) {
                compare(got, want, o.tolerance).map_err(|e| {
                    CudaError::Check(format!("native {} differs from the CPU reference: {e}", app.name()))
                })?;
            }
            "native = CPU reference".to_string()
        } else {
            "CPU reference skipped (too slow at this size)".to_string()
        };
        prepared.reset()?;
        self.kernels.push(SuiteKernel {
            label: format!("{}({size})", app.name()),
            app,
            size,
            k: t.k,
            blocks: vec![launch.blocks()],
            prepared,
            pools: vec![Vec::new()],
            role: Role::Single { native, cpu_check, completed: 0 },
        });
        let i = self.kernels.len() - 1;
        self.by_key.insert(key, i);
        Ok(i)
    }

    /// Process `process`'s instance of the multi-kernel app `t`, prepared on
    /// first use (compile, inputs); kept across device opens (reset at each).
    fn instance(&mut self, t: &SuiteTarget, process: ProcessId, seed: u64) -> Result<usize, CudaError> {
        let (app, size) = (t.app, t.size);
        let key = format!("{}:{size}:{}:process {process}", app.name(), t.k);
        if let Some(&i) = self.by_key.get(&key) {
            return Ok(i);
        }
        let workload = suite::build_with(app, size, 1, seed, t.k);
        let blocks: Vec<u64> = workload.launches.iter().map(|l| l.blocks()).collect();
        if blocks.len() < app.kernel_names().len() {
            return Err(CudaError::Invalid(format!("suite app {} lacks a kernel", app.name())));
        }
        let prepared = Prepared::new(&self.gpu, workload)?;
        prepared.reset()?;
        let label = match app {
            App::Kmeans => format!("{}({size}, k={}) of process {process}", app.name(), t.k),
            _ => format!("{}({size}) of process {process}", app.name()),
        };
        self.kernels.push(SuiteKernel {
            label,
            app,
            size,
            k: t.k,
            pools: blocks.iter().map(|_| Vec::new()).collect(),
            blocks,
            prepared,
            role: Role::Instance { seq: Sequence::new(app), checked: None },
        });
        let i = self.kernels.len() - 1;
        self.by_key.insert(key, i);
        Ok(i)
    }
}

/// Most element operations of a multi-kernel app's CPU reference.
const CPU_BUDGET: u64 = 1 << 28;

fn cpu_reference_is_cheap(app: App, size: u64) -> bool {
    match app {
        App::Sgemm => size <= 1024,
        App::Nbody => size <= 16384,
        _ => size <= 1 << 28,
    }
}

/// A single-kernel app's outputs against its native launch (× completed
/// invocations for histogram).
fn verify_single(k: &SuiteKernel) -> Result<String, CudaError> {
    let Role::Single { native, cpu_check, completed } = &k.role else {
        return Err(CudaError::Invalid(format!("{} is not a single kernel", k.label)));
    };
    let completed = *completed;
    if completed == 0 {
        return Ok(format!("{}: not run", k.label));
    }
    let got = k.prepared.outputs()?;
    let mut verdict = Ok(());
    for ((g, n), o) in got.iter().zip(native).zip(&k.prepared.workload.outputs) {
        let want = match (k.app, n) {
            (App::Histogram, HostData::U32(v)) => {
                HostData::U32(v.iter().map(|x| x.wrapping_mul(completed as u32)).collect())
            }
            _ => n.clone(),
        };
        let tol = if k.prepared.workload.nondeterministic.is_some() { o.tolerance } else { Tolerance::Exact };
        if let Err(e) = compare(g, &want, tol) {
            verdict = Err(e);
            break;
        }
    }
    Ok(match verdict {
        Ok(()) => format!(
            "{}: OK after {} invocations: outputs equal native ({}); {}",
            k.label,
            completed,
            if k.app == App::Histogram { "x invocations" } else { "bitwise" },
            cpu_check
        ),
        Err(e) => format!("{}: MISMATCH after {} invocations: {e}", k.label, completed),
    })
}

/// An instance's final outputs against a native run of the kernel sequence
/// it completed, on fresh buffers (bitwise), and that against the CPU
/// reference where cheap. The instance's own buffers are only read.
fn verify_instance(gpu: &Gpu, k: &SuiteKernel) -> Result<String, CudaError> {
    let Role::Instance { seq, .. } = &k.role else {
        return Err(CudaError::Invalid(format!("{} is not an instance", k.label)));
    };
    if let Some(r) = seq.running() {
        return Ok(format!(
            "{}: NOT CHECKED: kernel `{}` ran only in part (after {})",
            k.label,
            k.app.kernel_names().get(r).copied().unwrap_or("?"),
            seq.describe()
        ));
    }
    let done = seq.done();
    if done.is_empty() {
        return Ok(format!("{}: not run", k.label));
    }
    let w = &k.prepared.workload;
    let outputs = suite::sequence_outputs(k.app, done);
    let read = |p: &Prepared| -> Result<Vec<Vec<u8>>, CudaError> {
        outputs
            .iter()
            .map(|o| {
                p.buffers
                    .get(o.buffer)
                    .ok_or_else(|| CudaError::Invalid(format!("{}: no buffer {}", k.label, o.buffer)))?
                    .download()
            })
            .collect()
    };
    let got = suite::outputs_from_bytes(w, &outputs, &read(&k.prepared)?);
    // The same sequence natively on a twin of the instance (fresh inputs, poisoned outputs).
    let mut twin = Prepared::new(gpu, w.clone())?;
    twin.reset()?;
    let stream = Stream::low(gpu)?;
    for chunk in done.chunks(1024) {
        twin.workload.launches = chunk.iter().filter_map(|&t| w.launches.get(t as usize).cloned()).collect();
        twin.enqueue_native(&stream)?;
    }
    stream.sync()?;
    let native = suite::outputs_from_bytes(w, &outputs, &read(&twin)?);
    drop(twin);
    let name = |o: &suite::OutputSpec| w.buffers.get(o.buffer).map(|b| b.name).unwrap_or("?");
    let mut verdict: Result<(), String> = got
        .iter()
        .zip(&native)
        .zip(&outputs)
        .try_for_each(|((g, n), o)| compare(g, n, Tolerance::Exact).map_err(|e| format!("{}: {e}", name(o))));
    let cpu = if suite::cpu_cost(k.app, k.size, k.k, done) <= CPU_BUDGET {
        let want = suite::sequence_workload(w, done).reference();
        if verdict.is_ok() {
            verdict = native.iter().zip(&want).zip(&outputs).try_for_each(|((n, r), o)| {
                compare(n, r, o.tolerance)
                    .map_err(|e| format!("the native run differs from the CPU reference: {}: {e}", name(o)))
            });
        }
        "native = CPU reference"
    } else {
        "CPU reference skipped (too slow at this size)"
    };
    let outs: Vec<&str> = outputs.iter().map(name).collect();
    Ok(match verdict {
        Ok(()) => format!(
            "{}: OK after {} kernels ({}): outputs ({}) equal a native run of the same sequence (bitwise); {cpu}",
            k.label,
            done.len(),
            seq.describe(),
            outs.join(", ")
        ),
        Err(e) => format!("{}: MISMATCH after {} kernels ({}): {e}", k.label, done.len(), seq.describe()),
    })
}

/// What a trace span of template `t` of `k` is called.
fn span_label(k: &SuiteKernel, t: usize) -> String {
    match k.role {
        Role::Single { .. } => k.label.clone(),
        Role::Instance { .. } => format!("{} {}", k.label, k.kernel_name(t)),
    }
}

/// One engine launch in flight.
struct Live {
    kernel: KernelId,
    k: usize,
    /// Template of `k` this invocation runs.
    t: usize,
    map: BlockMap,
    requested: BlockRanges,
    /// SMs the launch holds (its workers' mask after the next restart).
    sms: SmSet,
    /// SMs to announce as released once the current workers have left.
    releasing: SmSet,
    stream: Stream,
    /// Workers queued or running on `stream`, in order.
    segs: Vec<WorkerLaunch>,
    /// Workers have been asked to retreat (for a retreat or a grow).
    stopping: bool,
    mask: SmSet,
    started: Nanos,
}

struct CopyInFlight {
    copy: CopyId,
    done: CuEvent,
}

/// A real GPU behind the engine's device contract.
pub struct CudaDevice {
    ordinal: u32,
    shared: Option<Box<Shared>>,
    info: DeviceInfo,
    seed: u64,
    start: Instant,
    /// Host time spent preparing kernels (compile, inputs, native run): the
    /// device clock stops meanwhile, so a run's first use of a kernel costs nothing.
    paused: Duration,
    chunk: crate::launch_plan::Chunk,
    ctl: Stream,
    copy_streams: [Stream; 2],
    copies: [VecDeque<CopyInFlight>; 2],
    /// Suite blocks not yet run, per kernel invocation.
    left: HashMap<KernelId, Vec<Range<u64>>>,
    /// Suite app and template of each kernel invocation not yet completed.
    bound: HashMap<KernelId, (usize, usize)>,
    /// The instance of each (process, multi-kernel app) in this run.
    instances: HashMap<(ProcessId, App), usize>,
    launches: HashMap<LaunchId, Live>,
    out: Vec<Event>,
    stats: DeviceStats,
    trace: Option<Vec<TraceSpan>>,
    verification: Vec<String>,
}

/// Opens GPU `ordinal` for one engine run. Waits while another device on the
/// same GPU is open in this process.
pub fn open_device(ordinal: u32, seed: u64) -> Result<Box<dyn Device + Send>, CudaError> {
    Ok(Box::new(CudaDevice::open(ordinal, seed)?))
}

static INFOS: Mutex<Vec<(u32, DeviceInfo)>> = Mutex::new(Vec::new());

/// What the engine needs to know about GPU `ordinal` (opens it on first use).
pub fn device_info(ordinal: u32) -> Result<DeviceInfo, CudaError> {
    let cached = INFOS.lock().ok().and_then(|v| v.iter().find(|(o, _)| *o == ordinal).map(|(_, i)| i.clone()));
    if let Some(i) = cached {
        return Ok(i);
    }
    let s = take_shared(ordinal)?;
    let info = info_of(&s.gpu);
    give_shared(ordinal, s);
    let info = info?;
    if let Ok(mut v) = INFOS.lock() {
        v.push((ordinal, info.clone()));
    }
    Ok(info)
}

fn info_of(gpu: &Gpu) -> Result<DeviceInfo, CudaError> {
    use cu::CUdevice_attribute as A;
    let sum = &gpu.summary;
    // Peak memory bandwidth from clock and bus width (DDR: two transfers a clock).
    let bw = match (
        gpu.attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
        gpu.attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
    ) {
        (Ok(khz), Ok(bits)) if khz > 0 && bits > 0 => 2.0 * khz as f64 * 1e3 * bits as f64 / 8.0,
        _ => 3.35e12,
    };
    Ok(DeviceInfo {
        name: format!("cuda:{} {}", gpu.ordinal, sum.name),
        num_sms: u16::try_from(sum.sm_count)
            .ok()
            .filter(|&n| n as usize <= gpumux_engine::smset::MAX_SMS)
            .ok_or_else(|| CudaError::Invalid(format!("{} SMs: more than gpumux handles", sum.sm_count)))?,
        sm: SmLimits {
            max_threads: gpu.attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32,
            max_blocks: gpu.attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)? as u32,
            registers: gpu.attr(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)? as u32,
            smem_bytes: gpu.attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as u32,
        },
        mem_bandwidth: bw,
        // Not queryable: PCIe 5 x16 as measured by pinned copies, order of magnitude.
        pcie_bandwidth: 50e9,
        pcie_latency_ns: 10_000,
        mem_bytes: sum.memory_bytes,
    })
}

impl CudaDevice {
    pub fn open(ordinal: u32, seed: u64) -> Result<CudaDevice, CudaError> {
        let mut shared = take_shared(ordinal)?;
        let r = Self::setup(&mut shared);
        match r {
            Ok((info, ctl, copy_streams)) => {
                // Blocks per claim: chosen per launch from the kernel's measured
                // block time (launch_plan.rs) unless GPUMUX_CUDA_CHUNK fixes it.
                let chunk = std::env::var("GPUMUX_CUDA_CHUNK").ok().and_then(|v| v.parse().ok()).unwrap_or_default();
                Ok(CudaDevice {
                    ordinal,
                    shared: Some(shared),
                    info,
                    seed,
                    start: Instant::now(),
                    paused: Duration::ZERO,
                    chunk,
                    ctl,
                    copy_streams,
                    copies: [VecDeque::new(), VecDeque::new()],
                    left: HashMap::new(),
                    bound: HashMap::new(),
                    instances: HashMap::new(),
                    launches: HashMap::new(),
                    out: Vec::new(),
                    stats: DeviceStats::default(),
                    trace: None,
                    verification: Vec::new(),
                })
            }
            Err(e) => {
                give_shared(ordinal, shared);
                Err(e)
            }
        }
    }

    fn setup(s: &mut Shared) -> Result<(DeviceInfo, Stream, [Stream; 2]), CudaError> {
        s.gpu.bind()?;
        // Inputs back to their initial state, outputs poisoned, counters zero.
        for k in &mut s.kernels {
            k.prepared.reset()?;
            match &mut k.role {
                Role::Single { completed, .. } => *completed = 0,
                Role::Instance { seq, checked, .. } => {
                    seq.reset();
                    *checked = None;
                }
            }
        }
        let info = info_of(&s.gpu)?;
        let ctl = Stream::high(&s.gpu)?;
        let copy_streams = [Stream::low(&s.gpu)?, Stream::low(&s.gpu)?];
        Ok((info, ctl, copy_streams))
    }

    fn now(&self) -> Nanos {
        self.start.elapsed().saturating_sub(self.paused).as_nanos() as Nanos
    }

    fn shared(&mut self) -> Result<&mut Shared, DeviceError> {
        self.shared.as_deref_mut().ok_or_else(|| DeviceError::Backend("the device was closed".into()))
    }

    /// One line per suite kernel: its outputs checked (see the module doc).
    pub fn verification(&self) -> &[String] {
        &self.verification
    }

    /// Checks every kernel's outputs now (also done on drop).
    pub fn verify(&mut self) -> Result<Vec<String>, CudaError> {
        let Some(s) = self.shared.as_deref_mut() else {
            return Ok(Vec::new());
        };
        s.gpu.bind()?;
        let mut lines = Vec::new();
        for k in s.kernels.iter_mut() {
            let line = match &k.role {
                Role::Single { .. } => verify_single(k)?,
                Role::Instance { seq, checked, .. } => match checked {
                    Some((n, line)) if *n == seq.done().len() && seq.running().is_none() => line.clone(),
                    _ => {
                        let n = seq.done().len();
                        // A failure here (say, no memory for the twin) is this instance's line.
                        let line = verify_instance(&s.gpu, k).unwrap_or_else(|e| {
                            format!("{}: NOT CHECKED: could not run its native twin: {e}", k.label)
                        });
                        if let Role::Instance { checked, .. } = &mut k.role {
                            *checked = Some((n, line.clone()));
                        }
                        line
                    }
                },
            };
            lines.push(line);
        }
        Ok(lines)
    }

    fn span(&mut self, sms: SmSet, name: &str, start: Nanos, end: Nanos) {
        if let Some(t) = self.trace.as_mut() {
            for sm in sms.iter() {
                t.push(TraceSpan {
                    lane: sm.0 as u32,
                    name: name.to_string(),
                    category: "kernel".into(),
                    start_ns: start,
                    end_ns: end,
                    process: None,
                });
            }
        }
    }

    /// Binds a kernel invocation, at its first launch, to its suite app (and
    /// for a multi-kernel app to the process's instance and the template that
    /// the instance runs next). Preparing an app the first time stops the clock.
    fn bind(&mut self, kernel: KernelId, process: ProcessId, desc: &KernelDesc) -> Result<(usize, usize), DeviceError> {
        let Some(r) = desc.suite.as_ref() else {
            return Err(DeviceError::Backend(format!(
                "kernel `{}` names no CUDA kernel: the real GPU runs only kernels with \
                 `suite = {{ name, params }}` (one of {}); use a sim: device for the others",
                desc.name,
                SUPPORTED.map(App::name).join(", ")
            )));
        };
        let fail = |e: String| DeviceError::Backend(format!("kernel `{}` of process {process}: {e}", desc.name));
        let target = resolve_suite(r).map_err(|e| fail(e.to_string()))?;
        let seed = self.seed;
        let t0 = Instant::now();
        let s = self.shared.as_deref_mut().ok_or_else(|| DeviceError::Backend("the device was closed".into()))?;
        let before = s.kernels.len();
        let bound = if target.app.is_multi_kernel() {
            let k = match self.instances.get(&(process, target.app)) {
                Some(&k) => k,
                None => s.instance(&target, process, seed).map_err(|e| fail(e.to_string()))?,
            };
            let sk = &mut s.kernels[k];
            let first = SuiteTarget { app: sk.app, size: sk.size, k: sk.k, kernel: target.kernel };
            same_instance(&first, &target).map_err(fail)?;
            let Role::Instance { seq, .. } = &mut sk.role else {
                return Err(fail(format!("{} is not an instance", sk.label)));
            };
            let t = seq.begin(target.kernel).map_err(fail)?;
            self.instances.insert((process, target.app), k);
            (k, t)
        } else {
            (s.single(&target, seed).map_err(|e| fail(e.to_string()))?, 0)
        };
        if s.kernels.len() > before {
            self.paused += t0.elapsed();
        }
        self.bound.insert(kernel, bound);
        Ok(bound)
    }

    /// Starts workers for the launch's suite blocks still to run, on its SMs.
    fn start_workers(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        let chunk = self.chunk;
        let now = self.now();
        let Some(mut live) = self.launches.remove(&lid) else {
            return Err(ProtocolError::UnknownLaunch { launch: lid, by: Message::Launch }.into());
        };
        let left = self.left.get(&live.kernel).cloned().unwrap_or_default();
        let mut mask = SmMask::empty();
        for sm in live.sms.iter() {
            mask.insert(sm.0 as u32);
        }
        let r = (|| -> Result<(), CudaError> {
            let s = self.shared.as_deref_mut().ok_or_else(|| CudaError::Invalid("device closed".into()))?;
            for er in live.requested.ranges() {
                for sr in intersect(&left, &live.map.to_suite(er)) {
                    let k = s
                        .kernels
                        .get_mut(live.k)
                        .ok_or_else(|| CudaError::Invalid(format!("no suite kernel {}", live.k)))?;
                    let mut w = match k.pools.get_mut(live.t).and_then(Vec::pop) {
                        Some(w) => w,
                        None => {
                            // One worker launch per template: keep the others for later.
                            let mut mine = None;
                            for (i, w) in k.prepared.worker_launches(&s.gpu, chunk)?.into_iter().enumerate() {
                                match (i == live.t, k.pools.get_mut(i)) {
                                    (true, _) => mine = Some(w),
                                    (false, Some(pool)) => pool.push(w),
                                    (false, None) => {}
                                }
                            }
                            mine.ok_or_else(|| CudaError::Invalid("no worker launch".into()))?
                        }
                    };
                    w.next = sr.start as u32;
                    w.end = sr.end as u32;
                    let started = w.start(&live.stream, mask);
                    live.segs.push(w);
                    started?;
                }
            }
            Ok(())
        })();
        live.mask = live.sms;
        live.stopping = false;
        live.started = now;
        self.launches.insert(lid, live);
        r.map_err(backend)
    }

    /// Ends a launch: SMs released, remaining work handed back.
    fn end_launch(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        let Some(live) = self.launches.remove(&lid) else { return Ok(()) };
        let left = self.left.get(&live.kernel).cloned().unwrap_or_default();
        let remaining = engine_remaining(live.map, &live.requested, &left);
        for sm in live.releasing.iter() {
            self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Retreated });
        }
        for sm in live.sms.difference(&live.releasing).iter() {
            self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Exhausted });
        }
        let completed = live.requested.len().saturating_sub(remaining.len());
        self.stats.blocks_completed += completed;
        self.out.push(Event::LaunchEnded { launch: lid, remaining, saved: Vec::new(), completed });
        let mut done = Ok(());
        if left.is_empty() && self.left.remove(&live.kernel).is_some() {
            // The invocation ran all its blocks: the engine launches it no more.
            self.bound.remove(&live.kernel);
            if let Some(s) = self.shared.as_deref_mut() {
                match &mut s.kernels[live.k].role {
                    Role::Single { completed, .. } => *completed += 1,
                    Role::Instance { seq, .. } => done = seq.complete().map(|_| ()),
                }
            }
        }
        let s = self.shared()?;
        s.kernels[live.k].pools[live.t].extend(live.segs);
        s.give_stream(live.stream);
        done.map_err(DeviceError::Backend)
    }

    /// Handles launches whose workers have all left.
    fn poll_launches(&mut self) -> Result<(), DeviceError> {
        let mut ended: Vec<LaunchId> = Vec::new();
        for (&lid, live) in self.launches.iter() {
            let mut all = true;
            for w in &live.segs {
                if w.running() && !w.poll().map_err(backend)? {
                    all = false;
                    break;
                }
            }
            if all {
                ended.push(lid);
            }
        }
        ended.sort();
        let now = self.now();
        for lid in ended {
            let Some(mut live) = self.launches.remove(&lid) else { continue };
            let mut done: Vec<Range<u64>> = Vec::new();
            for w in live.segs.iter_mut() {
                let from = w.next as u64;
                let o = w.finish().map_err(backend)?;
                done.push(from..o.next as u64);
            }
            let left = self.left.entry(live.kernel).or_default();
            for d in &done {
                subtract(left, d);
            }
            let left = left.clone();
            let dur = now.saturating_sub(live.started);
            self.stats.sm_busy_ns += dur as u128 * live.mask.len() as u128;
            let label = self.shared.as_deref().map(|s| span_label(&s.kernels[live.k], live.t)).unwrap_or_default();
            self.span(live.mask, &label, live.started, now);
            let work_left =
                live.requested.ranges().iter().any(|er| !intersect(&left, &live.map.to_suite(er)).is_empty());
            if work_left && !live.stopping {
                return Err(DeviceError::Backend(format!(
                    "launch {lid} stopped with work left though no retreat was asked"
                )));
            }
            // Idle workers back to the pool; the launch keeps its stream.
            let segs = std::mem::take(&mut live.segs);
            if let Some(s) = self.shared.as_deref_mut() {
                s.kernels[live.k].pools[live.t].extend(segs);
            }
            if work_left && !live.sms.is_empty() {
                for sm in live.releasing.iter() {
                    self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Retreated });
                }
                live.releasing = SmSet::EMPTY;
                self.launches.insert(lid, live);
                self.start_workers(lid)?;
            } else {
                self.launches.insert(lid, live);
                self.end_launch(lid)?;
            }
        }
        Ok(())
    }

    fn poll_copies(&mut self) -> Result<(), DeviceError> {
        for q in self.copies.iter_mut() {
            while let Some(c) = q.front() {
                if !c.done.done().map_err(backend)? {
                    break;
                }
                self.out.push(Event::CopyDone { copy: c.copy });
                q.pop_front();
            }
        }
        Ok(())
    }

    fn busy(&self) -> bool {
        self.launches.values().any(|l| !l.segs.is_empty()) || self.copies.iter().any(|q| !q.is_empty())
    }

    fn retreat_workers(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        let Some(live) = self.launches.get_mut(&lid) else { return Ok(()) };
        if live.stopping {
            return Ok(());
        }
        live.stopping = true;
        for w in &live.segs {
            w.retreat(&self.ctl).map_err(backend)?;
        }
        Ok(())
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        // Let queued work finish before the shared state is handed on.
        if let Some(s) = self.shared.as_deref() {
            let _ = s.gpu.bind();
        }
        for live in self.launches.values_mut() {
            for w in live.segs.iter_mut() {
                let _ = w.retreat(&self.ctl);
                let _ = w.finish();
            }
            let _ = live.stream.sync();
        }
        for s in &self.copy_streams {
            let _ = s.sync();
        }
        match self.verify() {
            Ok(lines) => {
                for l in &lines {
                    eprintln!("gpumux-cuda verify cuda:{} seed {}: {l}", self.ordinal, self.seed);
                }
                self.verification = lines;
            }
            Err(e) => eprintln!("gpumux-cuda verify cuda:{}: could not read outputs back: {e}", self.ordinal),
        }
        let lids: Vec<LaunchId> = self.launches.keys().copied().collect();
        for lid in lids {
            if let Some(live) = self.launches.remove(&lid) {
                if let Some(s) = self.shared.as_deref_mut() {
                    s.kernels[live.k].pools[live.t].extend(live.segs);
                    s.give_stream(live.stream);
                }
            }
        }
        if let Some(s) = self.shared.take() {
            give_shared(self.ordinal, s);
        }
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, _now: Nanos, command: Command) -> Result<(), DeviceError> {
        self.shared()?.gpu.bind().map_err(backend)?;
        match command {
            Command::Launch { launch, kernel, process, priority, desc, blocks, restore, sms, .. } => {
                if !restore.is_empty() {
                    return Err(ProtocolError::CannotRestore { launch, blocks: restore.len() }.into());
                }
                if self.launches.contains_key(&launch) {
                    return Err(ProtocolError::LaunchedTwice { launch }.into());
                }
                if let Some(sm) = sms.iter().find(|s| s.0 >= self.info.num_sms) {
                    let (device, sms) = (self.info.name.clone(), self.info.num_sms as usize);
                    return Err(ProtocolError::NoSuchSm { sm, device, sms }.into());
                }
                let (k, t) = match self.bound.get(&kernel) {
                    Some(&b) => b,
                    None => self.bind(kernel, process, &desc)?,
                };
                let s = self.shared()?;
                let m = s.kernels[k].blocks[t];
                let stream = s.stream(priority).map_err(backend)?;
                let map = BlockMap { engine: desc.shape.blocks.max(1), suite: m };
                self.left.entry(kernel).or_insert_with(|| if m > 0 { vec![0..m] } else { Vec::new() });
                let now = self.now();
                self.launches.insert(
                    launch,
                    Live {
                        kernel,
                        k,
                        t,
                        map,
                        requested: blocks,
                        sms,
                        releasing: SmSet::EMPTY,
                        stream,
                        segs: Vec::new(),
                        stopping: false,
                        mask: sms,
                        started: now,
                    },
                );
                if sms.is_empty() {
                    // Nothing to run on: it ends at once with all its work.
                    return self.end_launch(launch);
                }
                self.start_workers(launch)?;
                // Nothing to do (all its suite blocks already ran): end at the next advance.
                if self.launches.get(&launch).is_some_and(|l| l.segs.is_empty()) {
                    self.end_launch(launch)?;
                }
            }
            Command::Grow { launch, sms } => {
                let Some(live) = self.launches.get_mut(&launch) else {
                    return Err(ProtocolError::UnknownLaunch { launch, by: Message::Grow }.into());
                };
                let add = sms.difference(&live.sms);
                if add.is_empty() {
                    return Ok(());
                }
                live.sms = live.sms.union(&add);
                self.retreat_workers(launch)?;
            }
            Command::Retreat { launch, sms, mechanism: _ } => {
                let Some(live) = self.launches.get_mut(&launch) else {
                    return Err(ProtocolError::UnknownLaunch { launch, by: Message::Retreat }.into());
                };
                let gone = sms.intersection(&live.sms);
                if gone.is_empty() {
                    return Ok(());
                }
                live.sms = live.sms.difference(&gone);
                live.releasing = live.releasing.union(&gone);
                // Every mechanism is a drain at the next chunk boundary (module doc).
                self.retreat_workers(launch)?;
            }
            Command::Copy { copy, direction, bytes, .. } => {
                let d = match direction {
                    CopyDirection::HostToDevice => 0,
                    CopyDirection::DeviceToHost => 1,
                };
                let s = self.shared.as_deref().ok_or_else(|| DeviceError::Backend("device closed".into()))?;
                let stream = &self.copy_streams[d];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(STAGING_BYTES as u64) as usize;
                    // SAFETY: both staging buffers hold STAGING_BYTES and live as long as the
                    // shared state, which outlives every stream operation (synchronised on drop).
                    unsafe {
                        match direction {
                            CopyDirection::HostToDevice => stream
                                .copy_to_device_async(s.staging_dev.ptr, s.staging_host.host_ptr(), n)
                                .map_err(backend)?,
                            CopyDirection::DeviceToHost => stream
                                .copy_to_host_async(s.staging_host.host_mut_ptr(), s.staging_dev.ptr, n)
                                .map_err(backend)?,
                        }
                    }
                    left -= n as u64;
                }
                let done = CuEvent::new_sync_only().map_err(backend)?;
                done.record(stream).map_err(backend)?;
                self.stats.bytes_copied += bytes;
                self.copies[d].push_back(CopyInFlight { copy, done });
            }
        }
        Ok(())
    }

    fn advance(&mut self, until: Option<Nanos>, events: &mut Vec<Event>) -> Result<Nanos, DeviceError> {
        self.shared()?.gpu.bind().map_err(backend)?;
        loop {
            if self.out.is_empty() {
                self.poll_launches()?;
                self.poll_copies()?;
            }
            let now = self.now();
            if !self.out.is_empty() {
                self.stats.events += self.out.len() as u64;
                events.append(&mut self.out);
                return Ok(now);
            }
            if let Some(u) = until {
                if now >= u {
                    return Ok(now);
                }
            }
            if !self.busy() {
                match until {
                    None => return Err(DeviceError::Stalled { now }),
                    Some(u) => {
                        // Nothing can finish before `u`: sleep most of the way.
                        let wait = u - now;
                        if wait > 200_000 {
                            std::thread::sleep(Duration::from_nanos(wait - 100_000));
                        }
                    }
                }
            }
            std::hint::spin_loop();
        }
    }

    fn stats(&self) -> DeviceStats {
        self.stats.clone()
    }

    fn enable_trace(&mut self) {
        self.trace = Some(Vec::new());
    }

    fn take_trace(&mut self) -> Vec<TraceSpan> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_engine::kernel::KernelShape;
    use gpumux_engine::model::{Op, ProcessSpec, Workload};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn r(name: &str, params: &[(&str, f64)]) -> SuiteKernelRef {
        SuiteKernelRef {
            name: name.into(),
            params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
        }
    }

    fn app_size(r: &SuiteKernelRef) -> Option<(App, u64)> {
        resolve_suite(r).ok().map(|t| (t.app, t.size))
    }

    fn err(r: &SuiteKernelRef) -> String {
        resolve_suite(r).err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn suite_names_resolve_to_apps_and_sizes() {
        assert_eq!(app_size(&r("triad", &[("n", 1024.0)])), Some((App::Triad, 1024)));
        assert_eq!(app_size(&r("sgemm", &[("m", 4096.0), ("n", 4096.0), ("k", 4096.0)])), Some((App::Sgemm, 4096)));
        assert_eq!(app_size(&r("histogram", &[("n", 1024.0), ("bins", 256.0)])), Some((App::Histogram, 256)));
        let e = err(&r("kmeans", &[("n", 10.0)]));
        assert!(e.contains("has 2 kernels (assign, update): name one"), "{e}");
        assert!(resolve_suite(&r("sgemm", &[("m", 64.0), ("n", 128.0)])).is_err());
        assert!(resolve_suite(&r("triad", &[])).is_err());
        assert!(resolve_suite(&r("triad", &[("n", 1.5)])).is_err());
        assert!(resolve_suite(&r("histogram", &[("n", 64.0), ("bins", 64.0)])).is_err());
        assert!(resolve_suite(&r("nope", &[("n", 1.0)])).is_err());
    }

    #[test]
    fn multi_kernel_apps_resolve_with_their_kernels() {
        let t = resolve_suite(&r("kmeans.update", &[("n", 4096.0), ("k", 8.0)])).ok();
        assert_eq!(t, Some(SuiteTarget { app: App::Kmeans, size: 4096, k: 8, kernel: 1 }));
        // kmeans: 16 clusters by default, at most n.
        assert_eq!(resolve_suite(&r("kmeans.assign", &[("n", 4096.0)])).ok().map(|t| t.k), Some(16));
        assert_eq!(resolve_suite(&r("kmeans.assign", &[("n", 5.0)])).ok().map(|t| t.k), Some(5));
        assert!(err(&r("kmeans.assign", &[("n", 5.0), ("k", 6.0)])).contains("k = 6 clusters, but at most 5"));
        assert!(err(&r("kmeans.assign", &[("n", 1e6), ("k", 5000.0)])).contains("at most 4096"));
        assert_eq!(resolve_suite(&r("reduction.final", &[("n", 1e6)])).ok().map(|t| t.kernel), Some(1));
        // Stencil has one kernel: `step` may be left out.
        assert_eq!(resolve_suite(&r("stencil", &[("n", 512.0)])).ok().map(|t| t.kernel), Some(0));
        assert_eq!(resolve_suite(&r("stencil.step", &[("n", 512.0)])).ok().map(|t| t.kernel), Some(0));
        assert!(err(&r("stencil", &[("n", 1e6)])).contains("above the 32768"));
        let e = err(&r("kmeans.assing", &[("n", 10.0)]));
        assert!(e.contains("suite app `kmeans` has no kernel `assing`; its kernels: assign, update"), "{e}");
        let e = err(&r("reduction", &[("n", 10.0)]));
        assert!(e.contains("kernel = \"partial\""), "{e}");
        assert!(err(&r("kmeans.update", &[])).contains("needs a size parameter"));
        // Single-kernel apps may name their one kernel.
        assert_eq!(app_size(&r("triad.triad", &[("n", 8.0)])), Some((App::Triad, 8)));
        assert!(err(&r("triad.step", &[("n", 8.0)])).contains("no kernel `step`"));
    }

    fn kdesc(name: &str, suite: &str, params: &[(&str, f64)]) -> Arc<KernelDesc> {
        Arc::new(KernelDesc::new(name, KernelShape::new(16, 256, 32)).with_suite(r(suite, params)))
    }

    fn workload(procs: Vec<Vec<Arc<KernelDesc>>>) -> Workload {
        Workload {
            name: "w".into(),
            processes: procs
                .into_iter()
                .enumerate()
                .map(|(i, ks)| ProcessSpec {
                    name: format!("p{i}"),
                    priority: 0,
                    weight: 1.0,
                    arrival_ns: 0,
                    repetitions: 2,
                    async_depth: 0,
                    ops: ks.into_iter().map(Op::Kernel).collect(),
                })
                .collect(),
            replay_min_runs: None,
        }
    }

    #[test]
    fn workloads_are_checked_before_a_run() {
        let n = [("n", 4096.0)];
        let assign = kdesc("as", "kmeans.assign", &n);
        let update = kdesc("up", "kmeans.update", &n);
        let ok = workload(vec![
            vec![assign.clone(), update.clone(), kdesc("t", "triad", &n)],
            vec![kdesc("s", "stencil", &[("n", 64.0)]), kdesc("s", "stencil.step", &[("n", 64.0)])],
            vec![kdesc("p", "reduction.partial", &n), kdesc("f", "reduction.final", &n)],
        ]);
        assert!(check_workload(&ok).is_ok(), "{:?}", check_workload(&ok).err());
        // Two processes each get their own instance: different sizes are fine.
        let two = workload(vec![vec![assign.clone()], vec![kdesc("as", "kmeans.assign", &[("n", 100.0)])]]);
        assert!(check_workload(&two).is_ok());
        let e = |w: &Workload| check_workload(w).err().map(|e| e.to_string()).unwrap_or_default();
        let m = e(&workload(vec![vec![update.clone(), assign.clone()]]));
        assert!(m.contains("process \"p0\", kernel `up`: kmeans `update` cannot run before any `assign`"), "{m}");
        let m = e(&workload(vec![vec![assign.clone(), kdesc("up", "kmeans.update", &[("n", 2048.0)])]]));
        assert!(m.contains("kmeans `update` has n = 2048, k = 16, but this process's kmeans instance was made with n = 4096, k = 16"), "{m}");
        let m = e(&workload(vec![vec![kdesc("x", "kmeans.move", &n)]]));
        assert!(m.contains("has no kernel `move`"), "{m}");
        let mut plain = (*assign).clone();
        plain.suite = None;
        let m = e(&workload(vec![vec![Arc::new(plain)]]));
        assert!(m.contains("names no CUDA kernel"), "{m}");
    }

    #[test]
    fn instances_differ_in_params_only_by_error() {
        let a = SuiteTarget { app: App::Stencil, size: 64, k: 16, kernel: 0 };
        assert!(same_instance(&a, &a).is_ok());
        let b = SuiteTarget { size: 128, ..a };
        let e = same_instance(&a, &b).err().unwrap_or_default();
        assert!(
            e.contains("stencil `step` has n = 128, but this process's stencil instance was made with n = 64"),
            "{e}"
        );
    }

    #[test]
    fn block_map_partitions_suite_blocks() {
        for (n, m) in [(1024u64, 4096u64), (4096, 65536), (7, 3), (10, 10), (3, 1000), (1000, 7)] {
            let map = BlockMap { engine: n, suite: m };
            assert_eq!(map.start(0), 0);
            assert_eq!(map.start(n), m);
            for i in 0..n {
                assert!(map.start(i) <= map.start(i + 1));
            }
            for s in 0..m {
                let i = map.engine_of(s);
                assert!(map.to_suite(&(i..i + 1)).contains(&s), "n={n} m={m} s={s} i={i}");
            }
        }
    }

    #[test]
    fn ranges_subtract_and_intersect() {
        let mut set = vec![0..10, 20..30];
        subtract(&mut set, &(5..25));
        assert_eq!(set, vec![0..5, 25..30]);
        assert_eq!(intersect(&set, &(3..27)), vec![3..5, 25..27]);
        subtract(&mut set, &(0..100));
        assert!(set.is_empty());
    }

    #[test]
    fn remaining_engine_blocks_cover_every_suite_block_left() {
        let map = BlockMap { engine: 10, suite: 40 };
        let requested = BlockRanges::full(10);
        // Suite blocks 0..13 done: engine block 3 (12..16) is still partly left.
        let rem = engine_remaining(map, &requested, &[13..40]);
        assert_eq!(rem.ranges(), &[3..10]);
        let rem = engine_remaining(map, &requested, &[]);
        assert!(rem.is_empty());
        let mut part = BlockRanges::new();
        part.insert(0..2);
        part.insert(5..7);
        let rem = engine_remaining(map, &part, &[0..40]);
        assert_eq!(rem.ranges(), &[0..2, 5..7]);
    }

    #[test]
    fn a_device_without_gpu_is_an_error() {
        match open_device(0, 1) {
            Ok(d) => assert!(d.info().num_sms > 0),
            Err(e) => {
                eprintln!("SKIPPED GPU part of a_device_without_gpu_is_an_error: {e}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

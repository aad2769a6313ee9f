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
//! Supported suite kernels (single-kernel apps): triad, transpose, spmv,
//! sgemm, nbody, histogram, bfs (one level step). Not supported: stencil
//! (a ping-pong pair), reduction and kmeans (two kernels each).
//!
//! Results are checked when the device is dropped: every kernel's outputs
//! against a native (untransformed) launch on the same inputs (bitwise; for
//! histogram, native × number of completed invocations), and the native
//! launch against the CPU reference where that is cheap. The outcome is
//! printed on stderr (`gpumux-cuda verify ...`) and kept in
//! [`CudaDevice::verification`].

// Lists of block ranges with one element are meant (sets of ranges).
#![allow(clippy::single_range_in_vec_init)]

use crate::error::CudaError;
use crate::exec::Prepared;
use crate::preempt::{SmMask, WorkerLaunch};
use crate::runtime::{DeviceBuffer, Event as CuEvent, Gpu, HostMapped, Stream};
use crate::suite::{self, compare, App, HostData, Tolerance};
use cudarc::driver::sys as cu;
use gpumux_engine::device::{
    Command, CopyDirection, Device, DeviceError, DeviceStats, Event, ReleaseCause, TraceSpan,
};
use gpumux_engine::ids::{CopyId, KernelId, LaunchId};
use gpumux_engine::kernel::{DeviceInfo, SmLimits, SuiteKernelRef};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Suite apps the device can run as one kernel.
pub const SUPPORTED: [App; 7] = [
    App::Triad,
    App::Transpose,
    App::Spmv,
    App::Sgemm,
    App::Nbody,
    App::Histogram,
    App::Bfs,
];

/// Which suite app and size a `suite = { name, params }` entry names.
///
/// Size parameters: `n` (or `size`) is the app's main dimension as in
/// [`App::default_size`], except histogram, whose `n` counts input *bytes*
/// (`words` counts 32-bit words). sgemm is square: `m`, `n`, `k` must agree.
pub fn resolve_suite(r: &SuiteKernelRef) -> Result<(App, u64), CudaError> {
    let app = App::from_name(&r.name).ok_or_else(|| {
        CudaError::Invalid(format!(
            "unknown suite kernel `{}`; the CUDA device runs: {}",
            r.name,
            SUPPORTED.map(App::name).join(", ")
        ))
    })?;
    if !SUPPORTED.contains(&app) {
        return Err(CudaError::Invalid(format!(
            "suite app `{}` has more than one kernel (or a ping-pong pair) and cannot be one engine kernel; \
             the CUDA device runs: {}",
            r.name,
            SUPPORTED.map(App::name).join(", ")
        )));
    }
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
                return Err(CudaError::Invalid(format!(
                    "suite kernel histogram has 256 bins, not {b}"
                )));
            }
        }
    }
    let size = size.ok_or_else(|| {
        CudaError::Invalid(format!(
            "suite kernel `{}` needs a size parameter `n`",
            r.name
        ))
    })?;
    Ok((app, size))
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

/// One suite kernel ready to run: buffers, worker function, native result.
struct SuiteKernel {
    label: String,
    app: App,
    prepared: Prepared,
    blocks: u64,
    /// Idle workers (control records), reused across launches.
    pool: Vec<WorkerLaunch>,
    /// Outputs of one native launch on fresh inputs.
    native: Vec<HostData>,
    /// What the native launch was checked against on the CPU.
    cpu_check: String,
    /// Kernel invocations that ran all their blocks in this device run.
    completed: u64,
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
    let mut slots = SLOTS
        .lock()
        .map_err(|_| CudaError::Invalid("device registry poisoned".into()))?;
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
                slots = FREED
                    .wait(slots)
                    .map_err(|_| CudaError::Invalid("device registry poisoned".into()))?;
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
        let p = least
            .saturating_sub(priority)
            .clamp(greatest.min(least), greatest.max(least));
        match self.streams.get_mut(&p).and_then(Vec::pop) {
            Some(s) => Ok(s),
            None => Stream::new(&self.gpu, p),
        }
    }

    fn give_stream(&mut self, s: Stream) {
        self.streams.entry(s.priority).or_default().push(s);
    }

    /// The kernel for `r`, prepared on first use (compile, inputs, native run).
    fn kernel(&mut self, r: &SuiteKernelRef, seed: u64) -> Result<usize, CudaError> {
        let (app, size) = resolve_suite(r)?;
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
            blocks: launch.blocks(),
            prepared,
            pool: Vec::new(),
            native,
            cpu_check,
            completed: 0,
        });
        let i = self.kernels.len() - 1;
        self.by_key.insert(key, i);
        Ok(i)
    }
}

fn cpu_reference_is_cheap(app: App, size: u64) -> bool {
    match app {
        App::Sgemm => size <= 1024,
        App::Nbody => size <= 16384,
        _ => size <= 1 << 28,
    }
}

/// One engine launch in flight.
struct Live {
    kernel: KernelId,
    k: usize,
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
    chunk: u32,
    ctl: Stream,
    copy_streams: [Stream; 2],
    copies: [VecDeque<CopyInFlight>; 2],
    /// Suite blocks not yet run, per kernel invocation.
    left: HashMap<KernelId, Vec<Range<u64>>>,
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
    let cached = INFOS
        .lock()
        .ok()
        .and_then(|v| v.iter().find(|(o, _)| *o == ordinal).map(|(_, i)| i.clone()));
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
                let chunk = std::env::var("GPUMUX_CUDA_CHUNK")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(4u32)
                    .max(1);
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
            k.completed = 0;
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
        self.shared
            .as_deref_mut()
            .ok_or_else(|| DeviceError::Backend("the device was closed".into()))
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
        for k in &s.kernels {
            if k.completed == 0 {
                lines.push(format!("{}: not run", k.label));
                continue;
            }
            let got = k.prepared.outputs()?;
            let mut verdict = Ok(());
            for ((g, n), o) in got.iter().zip(&k.native).zip(&k.prepared.workload.outputs) {
                let want = match (k.app, n) {
                    (App::Histogram, HostData::U32(v)) => HostData::U32(
                        v.iter().map(|x| x.wrapping_mul(k.completed as u32)).collect(),
                    ),
                    _ => n.clone(),
                };
                let tol = if k.prepared.workload.nondeterministic.is_some() {
                    o.tolerance
                } else {
                    Tolerance::Exact
                };
                if let Err(e) = compare(g, &want, tol) {
                    verdict = Err(e);
                    break;
                }
            }
            lines.push(match verdict {
                Ok(()) => format!(
                    "{}: OK after {} invocations: outputs equal native ({}); {}",
                    k.label,
                    k.completed,
                    if k.app == App::Histogram { "x invocations" } else { "bitwise" },
                    k.cpu_check
                ),
                Err(e) => format!("{}: MISMATCH after {} invocations: {e}", k.label, k.completed),
            });
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

    /// Starts workers for the launch's suite blocks still to run, on its SMs.
    fn start_workers(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        let chunk = self.chunk;
        let now = self.now();
        let Some(mut live) = self.launches.remove(&lid) else {
            return Err(DeviceError::Protocol(format!("start of unknown launch {lid}")));
        };
        let left = self.left.get(&live.kernel).cloned().unwrap_or_default();
        let mut mask = SmMask::empty();
        for sm in live.sms.iter() {
            mask.insert(sm.0 as u32);
        }
        let r = (|| -> Result<(), CudaError> {
            let s = self
                .shared
                .as_deref_mut()
                .ok_or_else(|| CudaError::Invalid("device closed".into()))?;
            for er in live.requested.ranges() {
                for sr in intersect(&left, &live.map.to_suite(er)) {
                    let k = &mut s.kernels[live.k];
                    let mut w = match k.pool.pop() {
                        Some(w) => w,
                        None => {
                            let mut ws = k.prepared.worker_launches(&s.gpu, chunk)?;
                            ws.pop().ok_or_else(|| CudaError::Invalid("no worker launch".into()))?
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
        if left.is_empty() && self.left.remove(&live.kernel).is_some() {
            if let Some(s) = self.shared.as_deref_mut() {
                s.kernels[live.k].completed += 1;
            }
        }
        let s = self.shared()?;
        s.kernels[live.k].pool.extend(live.segs);
        s.give_stream(live.stream);
        Ok(())
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
            let label = self
                .shared
                .as_deref()
                .map(|s| s.kernels[live.k].label.clone())
                .unwrap_or_default();
            self.span(live.mask, &label, live.started, now);
            let work_left = live
                .requested
                .ranges()
                .iter()
                .any(|er| !intersect(&left, &live.map.to_suite(er)).is_empty());
            if work_left && !live.stopping {
                return Err(DeviceError::Backend(format!(
                    "launch {lid} stopped with work left though no retreat was asked"
                )));
            }
            // Idle workers back to the pool; the launch keeps its stream.
            let segs = std::mem::take(&mut live.segs);
            let k = live.k;
            if let Some(s) = self.shared.as_deref_mut() {
                s.kernels[k].pool.extend(segs);
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
                    s.kernels[live.k].pool.extend(live.segs);
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
            Command::Launch { launch, kernel, priority, desc, blocks, restore, sms, .. } => {
                if !restore.is_empty() {
                    return Err(DeviceError::Protocol(format!(
                        "launch {launch}: the CUDA device never saves contexts, yet {} are to be restored",
                        restore.len()
                    )));
                }
                if self.launches.contains_key(&launch) {
                    return Err(DeviceError::Protocol(format!("launch {launch} started twice")));
                }
                if let Some(sm) = sms.iter().find(|s| s.0 >= self.info.num_sms) {
                    return Err(DeviceError::Protocol(format!("launch {launch} on SM {sm}, beyond the device")));
                }
                let Some(r) = desc.suite.as_ref() else {
                    return Err(DeviceError::Backend(format!(
                        "kernel `{}` names no CUDA kernel: the real GPU runs only kernels with \
                         `suite = {{ name, params }}` (one of {}); use a sim: device for the others",
                        desc.name,
                        SUPPORTED.map(App::name).join(", ")
                    )));
                };
                let seed = self.seed;
                let t0 = Instant::now();
                let s = self.shared()?;
                let before = s.kernels.len();
                let k = s
                    .kernel(r, seed)
                    .map_err(|e| DeviceError::Backend(format!("kernel `{}`: {e}", desc.name)))?;
                let prepared_now = s.kernels.len() > before;
                let m = s.kernels[k].blocks;
                let stream = s.stream(priority).map_err(backend)?;
                if prepared_now {
                    self.paused += t0.elapsed();
                }
                let map = BlockMap { engine: desc.blocks.max(1), suite: m };
                self.left.entry(kernel).or_insert_with(|| if m > 0 { vec![0..m] } else { Vec::new() });
                let now = self.now();
                self.launches.insert(
                    launch,
                    Live {
                        kernel,
                        k,
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
                    return Err(DeviceError::Protocol(format!("grow of unknown launch {launch}")));
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
                    return Err(DeviceError::Protocol(format!("retreat of unknown launch {launch}")));
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
    use std::collections::BTreeMap;

    fn r(name: &str, params: &[(&str, f64)]) -> SuiteKernelRef {
        SuiteKernelRef {
            name: name.into(),
            params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn suite_names_resolve_to_apps_and_sizes() {
        assert_eq!(resolve_suite(&r("triad", &[("n", 1024.0)])).ok(), Some((App::Triad, 1024)));
        assert_eq!(
            resolve_suite(&r("sgemm", &[("m", 4096.0), ("n", 4096.0), ("k", 4096.0)])).ok(),
            Some((App::Sgemm, 4096))
        );
        assert_eq!(
            resolve_suite(&r("histogram", &[("n", 1024.0), ("bins", 256.0)])).ok(),
            Some((App::Histogram, 256))
        );
        let e = resolve_suite(&r("kmeans", &[("n", 10.0)])).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("more than one kernel"), "{e}");
        assert!(resolve_suite(&r("sgemm", &[("m", 64.0), ("n", 128.0)])).is_err());
        assert!(resolve_suite(&r("triad", &[])).is_err());
        assert!(resolve_suite(&r("triad", &[("n", 1.5)])).is_err());
        assert!(resolve_suite(&r("histogram", &[("n", 64.0), ("bins", 64.0)])).is_err());
        assert!(resolve_suite(&r("nope", &[("n", 1.0)])).is_err());
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

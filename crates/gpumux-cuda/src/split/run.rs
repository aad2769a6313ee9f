//! The GPUs of a split: one context per GPU, peer access between the home
//! GPU and each other, buffers with a copy on every GPU, and a launch that
//! runs one block range per GPU, replicates before it and merges after it.
//!
//! **Copies between GPUs** are `cuMemcpyPeerAsync` in every case. Where
//! `cuDeviceCanAccessPeer` says both directions work, peer access is enabled
//! (`cuCtxEnablePeerAccess`) and the driver copies directly over the link
//! (NVLink on the lent H200s): [`LinkKind::Peer`]. Elsewhere the same call
//! makes the driver stage the copy through host memory: [`LinkKind::Host`],
//! slower but correct. Never NVLink multicast (`cuMulticastCreate`): it can
//! take a shared host's GPUs out of service.
//!
//! **Order.** Everything is queued on one stream per GPU: on GPU g, after an
//! event of the home stream (the home copies are ready), its replication, its
//! worker launch, and the copies of what it wrote back to the home GPU; the
//! home stream takes a snapshot of the outputs it will shadow-merge, runs its
//! own range, waits for every other GPU's copies back, and runs the merge
//! kernels. The host waits for the home stream alone.

use super::analysis::{analyse, WriteAnalysis};
use super::merge::{self, BufferUse, Merge, Role, SplitPlan, COUNT_OUTSIDE, MERGE_SOURCE, SHADOW_MERGE};
use super::{partition, SplitError, Splittable};
use crate::error::CudaError;
use crate::launch_plan::Chunk;
use crate::preempt::{SmMask, WorkerLaunch};
use crate::runtime::{check, DeviceBuffer, Event, Function, Gpu, Params, Stream};
use cudarc::driver::sys as cu;
use std::ops::Range;

type Result<T> = std::result::Result<T, SplitError>;

/// How the home GPU and another GPU of the split reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum LinkKind {
    /// The same GPU (the home GPU's own entry).
    Itself,
    /// Peer access enabled both ways: copies go directly over NVLink or PCIe.
    Peer,
    /// No peer access: the driver stages peer copies through host memory.
    Host,
}

/// One GPU of the split and its stream.
struct Side {
    gpu: Gpu,
    stream: Stream,
}

impl Drop for Side {
    /// Makes the GPU's context current, so that its stream and its cached
    /// modules (dropped right after) are released in their own context.
    fn drop(&mut self) {
        let _ = self.gpu.bind();
    }
}

/// The GPUs a launch may be split over; index 0 is the home GPU, where the
/// buffers' authoritative copies live and the merge runs.
pub struct SplitGpus {
    sides: Vec<Side>,
    links: Vec<LinkKind>,
    merge: Function,
    count: Function,
}

/// `cuCtxEnablePeerAccess` from `from`'s context to `to`'s; already enabled is fine.
fn enable_peer(from: &Gpu, to: &Gpu) -> Result<()> {
    from.bind()?;
    // SAFETY: both contexts are retained primary contexts.
    let r = unsafe { cu::cuCtxEnablePeerAccess(to.raw_context(), 0) };
    if r == cu::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    Ok(check("cuCtxEnablePeerAccess", r)?)
}

fn can_access(a: &Gpu, b: &Gpu) -> Result<bool> {
    let mut can = 0;
    // SAFETY: out-pointer to a local; valid device handles.
    check("cuDeviceCanAccessPeer", unsafe { cu::cuDeviceCanAccessPeer(&mut can, a.raw_device(), b.raw_device()) })?;
    Ok(can == 1)
}

impl SplitGpus {
    /// Opens the GPUs `ordinals` (the first is home), enables peer access
    /// where the driver offers it, and loads the merge kernels on the home GPU.
    pub fn open(ordinals: &[i32]) -> Result<SplitGpus> {
        if ordinals.is_empty() {
            return Err(SplitError::Invalid("a split over no GPU".into()));
        }
        for (i, o) in ordinals.iter().enumerate() {
            if ordinals[..i].contains(o) {
                return Err(SplitError::Invalid(format!("GPU {o} named twice in the split")));
            }
        }
        let mut sides = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            let gpu = Gpu::open(o)?;
            gpu.bind()?;
            let stream = Stream::low(&gpu)?;
            sides.push(Side { gpu, stream });
        }
        let mut links = vec![LinkKind::Itself];
        for side in &sides[1..] {
            let (home, g) = (&sides[0].gpu, &side.gpu);
            let mut peer = can_access(home, g)? && can_access(g, home)?;
            if peer {
                // A driver that offers peer access and then refuses it (some
                // virtualised GPUs) leaves the copies to go through the host.
                if let Err(e) = enable_peer(home, g).and_then(|_| enable_peer(g, home)) {
                    tracing::warn!(
                        "GPUs {} and {}: peer access offered but not enabled ({e}); peer copies go through host memory",
                        home.ordinal,
                        g.ordinal
                    );
                    peer = false;
                }
            }
            links.push(if peer { LinkKind::Peer } else { LinkKind::Host });
        }
        let home = &sides[0].gpu;
        home.bind()?;
        let m = home.module("gmx_split_merge", MERGE_SOURCE)?;
        let merge = m.function(SHADOW_MERGE)?;
        let count = m.function(COUNT_OUTSIDE)?;
        Ok(SplitGpus { sides, links, merge, count })
    }

    /// GPUs in the split.
    pub fn len(&self) -> usize {
        self.sides.len()
    }

    /// Never true: a split has its home GPU at least.
    pub fn is_empty(&self) -> bool {
        self.sides.is_empty()
    }

    /// The driver's ordinals, home first.
    pub fn ordinals(&self) -> Vec<i32> {
        self.sides.iter().map(|s| s.gpu.ordinal).collect()
    }

    /// GPU `i` of the split.
    pub fn gpu(&self, i: usize) -> Option<&Gpu> {
        self.sides.get(i).map(|s| &s.gpu)
    }

    /// How the home GPU reaches each GPU (index 0: itself).
    pub fn links(&self) -> &[LinkKind] {
        &self.links
    }

    /// Makes the home GPU's context current on this thread (for the buffers'
    /// `upload`, `fill` and `download` of the home copies).
    pub fn bind_home(&self) -> Result<()> {
        Ok(self.sides[0].gpu.bind()?)
    }

    /// A buffer of `bytes` with a copy on every GPU (contents undefined).
    pub fn buffer(&self, bytes: usize) -> Result<SplitBuffer> {
        let mut copies = Vec::with_capacity(self.sides.len());
        for s in &self.sides {
            s.gpu.bind()?;
            copies.push(Some(DeviceBuffer::new(bytes)?));
        }
        self.bind_home()?;
        Ok(SplitBuffer {
            ctxs: self.sides.iter().map(|s| s.gpu.raw_context()).collect(),
            copies,
            snapshot: std::cell::RefCell::new(None),
            shadows: std::cell::RefCell::new(Vec::new()),
            bytes,
        })
    }

    /// Prepares kernel `kernel` of `src` for splitting: the source analysis
    /// ([`analyse`]), refused per `mode`; the transformed source loaded on
    /// every GPU, the native one on the home GPU.
    pub fn kernel(&self, src: &str, kernel: &str, mode: Splittable) -> Result<SplitKernel> {
        let analysis = analyse(src, kernel).ok_or_else(|| SplitError::NoKernel(kernel.to_string()))?;
        if mode == Splittable::IfChecked && !analysis.splittable() {
            return Err(SplitError::Refused { kernel: kernel.to_string(), reasons: analysis.refusals.clone() });
        }
        let t = crate::transform::transform(src)?;
        let info = t.kernel(kernel).ok_or_else(|| SplitError::NoKernel(kernel.to_string()))?;
        if !info.extern_c || info.template {
            return Err(SplitError::Invalid(format!(
                "kernel `{kernel}` must be a non-template extern \"C\" kernel to be launched by name"
            )));
        }
        let module = format!("split_{kernel}");
        let mut workers = Vec::with_capacity(self.sides.len());
        for s in &self.sides {
            s.gpu.bind()?;
            workers.push(s.gpu.module(&format!("{module}_gmx"), &t.source)?.function(kernel)?);
        }
        self.bind_home()?;
        let native = self.sides[0].gpu.module(&module, src)?.function(kernel)?;
        let ctxs = self.sides.iter().map(|s| s.gpu.raw_context()).collect();
        Ok(SplitKernel { name: kernel.to_string(), analysis, mode, ctxs, workers, native })
    }

    /// The kernel's native build on the home GPU with `args` (home copies),
    /// timed with events: the one-GPU reference. Milliseconds.
    pub fn run_native(
        &self,
        k: &SplitKernel,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        args: &[SplitArg<'_>],
    ) -> Result<f64> {
        check_args(k, args, true)?;
        let home = &self.sides[0];
        home.gpu.bind()?;
        let mut p = Params::default();
        for a in args {
            match a {
                SplitArg::Buffer { buf, .. } => p.ptr(buf.copy(0)?.ptr),
                SplitArg::Value(v) => p.push_bytes(v),
            };
        }
        let (t0, t1) = (Event::new()?, Event::new()?);
        t0.record(&home.stream)?;
        // SAFETY: check_args matched the arguments to the kernel's parameters.
        unsafe { k.native.launch(grid, block, smem, &home.stream, &mut p)? };
        t1.record(&home.stream)?;
        home.stream.sync()?;
        Ok(t0.elapsed_ms(&t1)? as f64)
    }

    /// Plans a launch of `k` over the first `gpus` GPUs and makes its worker
    /// launches (one per GPU that gets blocks). `gpus = 1` is the one-GPU run
    /// of the same workers, with nothing replicated or merged.
    pub fn prepare<'a>(
        &'a self,
        k: &'a SplitKernel,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        args: Vec<SplitArg<'a>>,
        gpus: usize,
    ) -> Result<Prepared<'a>> {
        if gpus == 0 || gpus > self.sides.len() {
            return Err(SplitError::Invalid(format!("a split over {gpus} GPUs of {}", self.sides.len())));
        }
        check_args(k, &args, k.mode == Splittable::Declared)?;
        let total: u64 = grid.iter().map(|&g| g as u64).product();
        if total >= (u32::MAX / 2) as u64 {
            return Err(SplitError::Invalid(format!("a grid of {total} blocks is too large to split")));
        }
        let uses: Vec<BufferUse> = args
            .iter()
            .filter_map(|a| match a {
                SplitArg::Buffer { buf, role, merge } => {
                    Some(BufferUse { bytes: buf.bytes as u64, role: *role, merge: *merge })
                }
                SplitArg::Value(_) => None,
            })
            .collect();
        let sms: Vec<u32> = self.sides[..gpus].iter().map(|s| s.gpu.sm_count()).collect();
        let ranges = partition(total as u32, &sms, merge::granule(&uses)?)?;
        let plan = merge::plan(ranges, &uses)?;
        let mut launches = Vec::with_capacity(gpus);
        let mut events = Vec::with_capacity(gpus);
        for (g, side) in self.sides[..gpus].iter().enumerate() {
            side.gpu.bind()?;
            events.push([Event::new()?, Event::new()?, Event::new()?, Event::new()?]);
            let r = plan.ranges[g].clone();
            if r.is_empty() {
                launches.push(None);
                continue;
            }
            let bytes: Vec<Vec<u8>> = args
                .iter()
                .map(|a| match a {
                    SplitArg::Buffer { buf, .. } => buf.copy(g).map(|b| b.ptr.to_le_bytes().to_vec()),
                    SplitArg::Value(v) => Ok(v.clone()),
                })
                .collect::<Result<_>>()?;
            let mut l =
                WorkerLaunch::new(k.workers[g].clone(), bytes, grid, block, smem, Chunk::Auto, side.gpu.sm_count())?;
            l.next = r.start;
            l.end = r.end;
            launches.push(Some(l));
        }
        self.bind_home()?;
        // Scratch on the home GPU: snapshots, and one shadow per other GPU.
        for ((buf, _, _), p) in buffers(&args).zip(&plan.buffers) {
            if p.snapshot {
                buf.ensure_scratch(gpus)?;
            }
        }
        let counters = DeviceBuffer::new(8 * uses.len().max(1) * gpus)?;
        let merge_events = [Event::new()?, Event::new()?];
        Ok(Prepared {
            gpus: self,
            kernel: k,
            args,
            plan,
            launches,
            events,
            merge_events,
            counters,
            inputs_resident: false,
            n: gpus,
        })
    }
}

/// The arguments' buffers, in order, with their roles and merges.
fn buffers<'s, 'a>(args: &'s [SplitArg<'a>]) -> impl Iterator<Item = (&'a SplitBuffer, Role, Merge)> + 's {
    args.iter().filter_map(|a| match a {
        SplitArg::Buffer { buf, role, merge } => Some((*buf, *role, *merge)),
        SplitArg::Value(_) => None,
    })
}

/// The arguments must match the kernel's parameters: as many, buffers at
/// pointer parameters, a buffer the kernel writes not passed as an input,
/// and (unless `declared`) no shadow merge of elements narrower than its words.
fn check_args(k: &SplitKernel, args: &[SplitArg<'_>], declared: bool) -> Result<()> {
    let params = &k.analysis.params;
    if args.len() != params.len() {
        return Err(SplitError::Invalid(format!(
            "kernel `{}` takes {} parameters, {} arguments given",
            k.name,
            params.len(),
            args.len()
        )));
    }
    for (i, (a, p)) in args.iter().zip(params).enumerate() {
        let SplitArg::Buffer { role, merge, .. } = a else { continue };
        if !p.pointer {
            return Err(SplitError::Invalid(format!(
                "argument {i} is a buffer, but parameter `{}` is no pointer",
                p.name
            )));
        }
        if *role == Role::In && p.written {
            return Err(SplitError::Invalid(format!(
                "argument {i} is passed as an input, but the kernel stores into `{}`: pass it as an output",
                p.name
            )));
        }
        if *role != Role::In && *merge == Merge::Shadow && !declared && p.element_bytes.is_some_and(|b| b < 4) {
            return Err(SplitError::Invalid(format!(
                "`{}` has {}-byte elements: the shadow merge compares whole 4-byte words, so blocks on two GPUs writing \
                 neighbouring elements of one word would clobber each other; declare its slices instead",
                p.name,
                p.element_bytes.unwrap_or(0)
            )));
        }
    }
    Ok(())
}

/// A kernel ready to split.
pub struct SplitKernel {
    /// Its name.
    pub name: String,
    /// What the source analysis found ([`analyse`]).
    pub analysis: WriteAnalysis,
    /// As asked for: [`Splittable::Declared`] kernels may have refusals.
    pub mode: Splittable,
    /// Each GPU's context, for releasing its worker function there.
    ctxs: Vec<cu::CUcontext>,
    workers: Vec<Function>,
    native: Function,
}

impl Drop for SplitKernel {
    /// Releases each GPU's worker function (and maybe its module) with that
    /// GPU's context current; the native one with the home GPU's.
    fn drop(&mut self) {
        for (ctx, f) in self.ctxs.iter().zip(std::mem::take(&mut self.workers)) {
            crate::client::forget_current();
            // SAFETY: a retained primary context.
            unsafe {
                cu::cuCtxSetCurrent(*ctx);
            }
            drop(f);
        }
        if let Some(home) = self.ctxs.first() {
            crate::client::forget_current();
            // SAFETY: as above.
            unsafe {
                cu::cuCtxSetCurrent(*home);
            }
        }
    }
}

/// A kernel argument of a split launch.
pub enum SplitArg<'a> {
    /// A buffer; its copy on each GPU is what that GPU's blocks see.
    Buffer {
        /// The buffer.
        buf: &'a SplitBuffer,
        /// What the kernel does with it.
        role: Role,
        /// How an output is merged (ignored for inputs).
        merge: Merge,
    },
    /// A value passed as it is (its bytes, little-endian).
    Value(Vec<u8>),
}

impl<'a> SplitArg<'a> {
    /// A buffer the kernel only reads.
    pub fn input(buf: &'a SplitBuffer) -> Self {
        SplitArg::Buffer { buf, role: Role::In, merge: Merge::Shadow }
    }
    /// A buffer the kernel writes, merged by `merge`.
    pub fn output(buf: &'a SplitBuffer, merge: Merge) -> Self {
        SplitArg::Buffer { buf, role: Role::Out, merge }
    }
    /// A 32-bit unsigned value.
    pub fn u32(v: u32) -> Self {
        SplitArg::Value(v.to_le_bytes().to_vec())
    }
    /// A 32-bit float.
    pub fn f32(v: f32) -> Self {
        SplitArg::Value(v.to_le_bytes().to_vec())
    }
}

/// A buffer with one copy per GPU of the split; the home copy (index 0) is
/// the buffer's contents between launches.
pub struct SplitBuffer {
    ctxs: Vec<cu::CUcontext>,
    copies: Vec<Option<DeviceBuffer>>,
    /// The home copy before a launch (shadow merge, declaration check).
    snapshot: std::cell::RefCell<Option<DeviceBuffer>>,
    /// Per other GPU, its copy brought to the home GPU (index 0 unused).
    shadows: std::cell::RefCell<Vec<Option<DeviceBuffer>>>,
    /// Bytes.
    pub bytes: usize,
}

// SAFETY: the contexts are retained primary contexts, usable from any thread.
unsafe impl Send for SplitBuffer {}

impl SplitBuffer {
    /// The copy on GPU `g`.
    fn copy(&self, g: usize) -> Result<&DeviceBuffer> {
        self.copies
            .get(g)
            .and_then(Option::as_ref)
            .ok_or_else(|| SplitError::Invalid(format!("the buffer has no copy on GPU {g} of the split")))
    }
    /// The home copy (upload, fill and download it with the home GPU bound: [`SplitGpus::bind_home`]).
    pub fn home(&self) -> Result<&DeviceBuffer> {
        self.copy(0)
    }
    /// The snapshot and one shadow per other GPU, on the home GPU (the home context bound).
    fn ensure_scratch(&self, gpus: usize) -> Result<()> {
        let mut snap = self.snapshot.borrow_mut();
        if snap.is_none() {
            *snap = Some(DeviceBuffer::new(self.bytes)?);
        }
        let mut sh = self.shadows.borrow_mut();
        while sh.len() < gpus {
            let b = if sh.is_empty() { None } else { Some(DeviceBuffer::new(self.bytes)?) };
            sh.push(b);
        }
        Ok(())
    }
}

impl Drop for SplitBuffer {
    /// Frees each copy with its own GPU's context current.
    fn drop(&mut self) {
        for (ctx, c) in self.ctxs.iter().zip(self.copies.iter_mut()) {
            crate::client::forget_current();
            // SAFETY: a retained primary context; errors at teardown have no one to go to.
            unsafe {
                cu::cuCtxSetCurrent(*ctx);
            }
            drop(c.take());
        }
        if let Some(home) = self.ctxs.first() {
            crate::client::forget_current();
            // SAFETY: as above; the scratch lives on the home GPU.
            unsafe {
                cu::cuCtxSetCurrent(*home);
            }
        }
        self.snapshot.get_mut().take();
        self.shadows.get_mut().clear();
    }
}

/// How long a split launch took.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SplitTiming {
    /// Host time from the first call to the end of the merge, ms.
    pub wall_ms: f64,
    /// Per GPU: its worker launch, ms (0 for a GPU without blocks).
    pub kernel_ms: Vec<f64>,
    /// Per GPU: its replication before the launch, ms.
    pub replicate_ms: Vec<f64>,
    /// Per GPU: its copies back to the home GPU, ms.
    pub copy_back_ms: Vec<f64>,
    /// The merge kernels on the home GPU, ms.
    pub merge_ms: f64,
    /// Blocks per GPU.
    pub ranges: Vec<Range<u32>>,
    /// Bytes that crossed between GPUs.
    pub link_bytes: u64,
}

impl SplitTiming {
    /// The longest GPU's kernel, ms: the kernel-only part.
    pub fn kernel_max_ms(&self) -> f64 {
        self.kernel_ms.iter().copied().fold(0.0, f64::max)
    }
}

impl Drop for Prepared<'_> {
    /// Releases each GPU's worker launch and events with its context current.
    fn drop(&mut self) {
        let launches = std::mem::take(&mut self.launches);
        let events = std::mem::take(&mut self.events);
        for (g, (l, e)) in launches.into_iter().zip(events).enumerate() {
            if let Some(side) = self.gpus.sides.get(g) {
                let _ = side.gpu.bind();
            }
            drop(l);
            drop(e);
        }
        let _ = self.gpus.bind_home();
    }
}

/// A planned split launch that can be run again and again.
pub struct Prepared<'a> {
    gpus: &'a SplitGpus,
    kernel: &'a SplitKernel,
    args: Vec<SplitArg<'a>>,
    plan: SplitPlan,
    launches: Vec<Option<WorkerLaunch>>,
    /// Per GPU: replication start, kernel start, kernel end, copies back end.
    events: Vec<[Event; 4]>,
    merge_events: [Event; 2],
    /// The declaration checks' counts, one u64 per (buffer, GPU).
    counters: DeviceBuffer,
    inputs_resident: bool,
    n: usize,
}

impl Prepared<'_> {
    /// The plan: blocks per GPU and what happens to each buffer.
    pub fn plan(&self) -> &SplitPlan {
        &self.plan
    }

    /// Copies the inputs ([`Role::In`]) to every GPU now and leaves them out
    /// of later runs' replication: for a kernel run again on the same inputs
    /// (their replication paid once). A caller that changes an input must
    /// call it again.
    pub fn replicate_inputs_once(&mut self) -> Result<()> {
        for (buf, role, _) in buffers(&self.args) {
            if role == Role::In {
                for g in 1..self.n {
                    if self.plan.ranges[g].is_empty() {
                        continue;
                    }
                    let s = &self.gpus.sides[g];
                    s.gpu.bind()?;
                    peer_copy(buf.copy(g)?, buf.ctxs[g], buf.copy(0)?, buf.ctxs[0], 0..buf.bytes as u64, &s.stream)?;
                    s.stream.sync()?;
                }
            }
        }
        self.gpus.bind_home()?;
        self.inputs_resident = true;
        Ok(())
    }

    /// Runs the launch: replication, the block ranges on their GPUs, the
    /// merge; returns when the home copies hold the merged outputs.
    // `g` indexes the sides, launches, events and plan ranges together.
    #[allow(clippy::needless_range_loop)]
    pub fn run(&mut self) -> Result<SplitTiming> {
        let sides = &self.gpus.sides[..self.n];
        let home = &sides[0];
        let verify = self.plan.buffers.iter().any(|p| p.verify.iter().any(|&v| v));
        let t0 = std::time::Instant::now();
        home.gpu.bind()?;
        if verify {
            // SAFETY: the counters are this launch's own device memory.
            unsafe { home.stream.memset_async(self.counters.ptr, 0, self.counters.bytes)? };
        }
        for ((buf, _, _), p) in buffers(&self.args).zip(&self.plan.buffers) {
            if p.snapshot {
                let snap = buf.snapshot.borrow();
                let s = snap.as_ref().ok_or_else(|| SplitError::Invalid("no snapshot buffer".into()))?;
                // SAFETY: both are buf.bytes of device memory on the home GPU.
                unsafe { home.stream.copy_on_device_async(s.ptr, buf.copy(0)?.ptr, buf.bytes)? };
            }
        }
        // The other GPUs start from here. The home GPU's kernel is not held
        // back until they have replicated (but for a declaration's check,
        // below): it writes none of the inputs, and a word of an output it
        // writes that reaches another GPU's copy before that copy is taken
        // only makes the shadow merge write the home GPU's own value back.
        let ready = Event::new_sync_only()?;
        ready.record(&home.stream)?;

        // The other GPUs: replicate, run, copy back.
        for g in 1..self.n {
            let Some(l) = self.launches[g].as_mut() else { continue };
            let s = &sides[g];
            s.gpu.bind()?;
            s.stream.wait(&ready)?;
            let ev = &self.events[g];
            ev[0].record(&s.stream)?;
            for ((buf, role, _), p) in buffers(&self.args).zip(&self.plan.buffers) {
                if p.replicate && !(role == Role::In && self.inputs_resident) {
                    peer_copy(buf.copy(g)?, buf.ctxs[g], buf.copy(0)?, buf.ctxs[0], 0..buf.bytes as u64, &s.stream)?;
                }
            }
            ev[1].record(&s.stream)?;
            let r = self.plan.ranges[g].clone();
            l.next = r.start;
            l.end = r.end;
            l.start(&s.stream, SmMask::range(0, s.gpu.sm_count()))?;
            ev[2].record(&s.stream)?;
            if !verify {
                for ((buf, _, _), p) in buffers(&self.args).zip(&self.plan.buffers) {
                    for bytes in &p.copy_back[g] {
                        peer_copy(buf.copy(0)?, buf.ctxs[0], buf.copy(g)?, buf.ctxs[g], bytes.clone(), &s.stream)?;
                    }
                    if p.shadow_merge[g] {
                        let sh = buf.shadows.borrow();
                        let dst = sh
                            .get(g)
                            .and_then(Option::as_ref)
                            .ok_or_else(|| SplitError::Invalid("no shadow buffer".into()))?;
                        peer_copy(dst, buf.ctxs[0], buf.copy(g)?, buf.ctxs[g], 0..buf.bytes as u64, &s.stream)?;
                    }
                }
            }
            ev[3].record(&s.stream)?;
        }

        // The home GPU: its own range.
        home.gpu.bind()?;
        if verify {
            // A declaration's check compares every GPU's copy with the home
            // snapshot outside that GPU's slices: the home GPU's writes must
            // not reach another GPU's copy through its replication (the race
            // that is harmless to the merges, above). Measured on the H200
            // pair before this wait: GPU 1 "changed" 2^27 words of triad, the
            // home GPU's half.
            for g in 1..self.n {
                if self.launches[g].is_some() {
                    home.stream.wait(&self.events[g][1])?;
                }
            }
        }
        let ev = &self.events[0];
        ev[0].record(&home.stream)?;
        ev[1].record(&home.stream)?;
        if let Some(l) = self.launches[0].as_mut() {
            let r = self.plan.ranges[0].clone();
            l.next = r.start;
            l.end = r.end;
            l.start(&home.stream, SmMask::range(0, home.gpu.sm_count()))?;
        }
        ev[2].record(&home.stream)?;
        ev[3].record(&home.stream)?;
        for g in 1..self.n {
            if self.launches[g].is_some() {
                home.stream.wait(&self.events[g][3])?;
            }
        }
        if verify {
            self.verify_and_copy_back()?;
        }
        self.merge_events[0].record(&home.stream)?;
        for ((buf, _, _), p) in buffers(&self.args).zip(&self.plan.buffers) {
            for g in (1..self.n).filter(|&g| p.shadow_merge[g]) {
                let sh = buf.shadows.borrow();
                let shadow =
                    sh.get(g).and_then(Option::as_ref).ok_or_else(|| SplitError::Invalid("no shadow buffer".into()))?;
                let snap = buf.snapshot.borrow();
                let pristine = snap.as_ref().ok_or_else(|| SplitError::Invalid("no snapshot buffer".into()))?;
                let words = (buf.bytes / 4) as u64;
                let mut params = Params::default();
                params.ptr(buf.copy(0)?.ptr).ptr(shadow.ptr).ptr(pristine.ptr).u64(words);
                // SAFETY: the parameters follow gmx_shadow_merge's signature; three buffers of `words` words.
                unsafe {
                    self.gpus.merge.launch(
                        [grid_for(words / 4 + 1, home.gpu.sm_count()), 1, 1],
                        [256, 1, 1],
                        0,
                        &home.stream,
                        &mut params,
                    )?
                };
            }
        }
        self.merge_events[1].record(&home.stream)?;
        home.stream.sync()?;
        let wall_ms = t0.elapsed().as_secs_f64() * 1e3;

        for g in 0..self.n {
            let Some(l) = self.launches[g].as_mut() else { continue };
            sides[g].gpu.bind()?;
            let out = l.finish()?;
            if out.next != self.plan.ranges[g].end {
                return Err(SplitError::Cuda(CudaError::Check(format!(
                    "GPU {g} of the split stopped at block {} of its range {:?}",
                    out.next, self.plan.ranges[g]
                ))));
            }
        }
        home.gpu.bind()?;
        if verify {
            let counts = self.counters.download()?;
            let nbuf = self.plan.buffers.len();
            for b in 0..nbuf {
                for g in 0..self.n {
                    let at = 8 * (b * self.n + g);
                    let words = u64::from_le_bytes(counts[at..at + 8].try_into().unwrap_or([0; 8]));
                    if words > 0 {
                        return Err(SplitError::WrongDeclaration { arg: self.arg_index(b), gpu: g, words });
                    }
                }
            }
        }
        let ms = |a: &Event, b: &Event| -> Result<f64> { Ok(a.elapsed_ms(b)? as f64) };
        let mut t = SplitTiming {
            wall_ms,
            kernel_ms: vec![0.0; self.n],
            replicate_ms: vec![0.0; self.n],
            copy_back_ms: vec![0.0; self.n],
            merge_ms: ms(&self.merge_events[0], &self.merge_events[1])?,
            ranges: self.plan.ranges.clone(),
            link_bytes: 0,
        };
        for g in 0..self.n {
            if self.launches[g].is_none() {
                continue;
            }
            sides[g].gpu.bind()?;
            let ev = &self.events[g];
            t.replicate_ms[g] = ms(&ev[0], &ev[1])?;
            t.kernel_ms[g] = ms(&ev[1], &ev[2])?;
            t.copy_back_ms[g] = ms(&ev[2], &ev[3])?;
        }
        home.gpu.bind()?;
        // Resident inputs cross no link.
        t.link_bytes = buffers(&self.args)
            .zip(&self.plan.buffers)
            .filter(|((_, role, _), _)| !(*role == Role::In && self.inputs_resident))
            .map(|((buf, role, merge), p)| {
                let one = SplitPlan { ranges: self.plan.ranges.clone(), buffers: vec![p.clone()] };
                one.link_bytes(&[BufferUse { bytes: buf.bytes as u64, role, merge }])
            })
            .sum();
        Ok(t)
    }

    /// The argument index of buffer argument `b`.
    fn arg_index(&self, b: usize) -> usize {
        self.args.iter().enumerate().filter(|(_, a)| matches!(a, SplitArg::Buffer { .. })).nth(b).map_or(b, |(i, _)| i)
    }

    /// The declaration checks (home GPU, its context current, after every
    /// GPU's kernel): each GPU's copy is brought home and its words changed
    /// outside its slices counted, the home GPU's before any other slice
    /// lands; then the slices are copied back.
    fn verify_and_copy_back(&self) -> Result<()> {
        let home = &self.gpus.sides[0];
        let sm = home.gpu.sm_count();
        for (b, ((buf, _, merge), p)) in buffers(&self.args).zip(&self.plan.buffers).enumerate() {
            let words = (buf.bytes / 4) as u64;
            let snap = buf.snapshot.borrow();
            for g in (0..self.n).filter(|&g| p.verify[g]) {
                let copy = if g == 0 {
                    buf.copy(0)?.ptr
                } else {
                    let sh = buf.shadows.borrow();
                    let dst = sh
                        .get(g)
                        .and_then(Option::as_ref)
                        .ok_or_else(|| SplitError::Invalid("no shadow buffer".into()))?;
                    peer_copy(dst, buf.ctxs[0], buf.copy(g)?, buf.ctxs[g], 0..buf.bytes as u64, &home.stream)?;
                    dst.ptr
                };
                let pristine = snap.as_ref().ok_or_else(|| SplitError::Invalid("no snapshot buffer".into()))?;
                let Merge::Slices { slices, .. } = merge else { continue };
                let bytes = slices.bytes_of(&self.plan.ranges[g], buf.bytes as u64);
                let (lo, hi) = (bytes.start / 4, bytes.end.div_ceil(4));
                let mut params = Params::default();
                params
                    .ptr(copy)
                    .ptr(pristine.ptr)
                    .u64(words)
                    .u64(lo)
                    .u64(hi)
                    .ptr(self.counters.ptr + 8 * (b * self.n + g) as u64);
                // SAFETY: the parameters follow gmx_count_outside's signature.
                unsafe {
                    self.gpus.count.launch([grid_for(words, sm), 1, 1], [256, 1, 1], 0, &home.stream, &mut params)?
                };
            }
        }
        for ((buf, _, _), p) in buffers(&self.args).zip(&self.plan.buffers) {
            for g in 1..self.n {
                for bytes in &p.copy_back[g] {
                    peer_copy(buf.copy(0)?, buf.ctxs[0], buf.copy(g)?, buf.ctxs[g], bytes.clone(), &home.stream)?;
                }
                if p.shadow_merge[g] {
                    let sh = buf.shadows.borrow();
                    let dst = sh
                        .get(g)
                        .and_then(Option::as_ref)
                        .ok_or_else(|| SplitError::Invalid("no shadow buffer".into()))?;
                    peer_copy(dst, buf.ctxs[0], buf.copy(g)?, buf.ctxs[g], 0..buf.bytes as u64, &home.stream)?;
                }
            }
        }
        Ok(())
    }

    /// The kernel it launches.
    pub fn kernel(&self) -> &SplitKernel {
        self.kernel
    }
}

/// Blocks for a grid-stride kernel over `items`: enough to fill the GPU, no more.
fn grid_for(items: u64, sm_count: u32) -> u32 {
    items.div_ceil(256).clamp(1, sm_count as u64 * 8) as u32
}

/// `cuMemcpyPeerAsync` of `bytes` (byte offsets, the same in both buffers)
/// from `src` in context `src_ctx` to `dst` in `dst_ctx`, on `stream`.
fn peer_copy(
    dst: &DeviceBuffer,
    dst_ctx: cu::CUcontext,
    src: &DeviceBuffer,
    src_ctx: cu::CUcontext,
    bytes: Range<u64>,
    stream: &Stream,
) -> Result<()> {
    if bytes.end > dst.bytes as u64 || bytes.end > src.bytes as u64 || bytes.start > bytes.end {
        return Err(SplitError::Invalid(format!(
            "a copy of bytes {bytes:?} between buffers of {} and {} bytes",
            src.bytes, dst.bytes
        )));
    }
    if bytes.is_empty() {
        return Ok(());
    }
    // SAFETY: both ranges lie inside live allocations of their contexts (checked above).
    check("cuMemcpyPeerAsync", unsafe {
        cu::cuMemcpyPeerAsync(
            dst.ptr + bytes.start,
            dst_ctx,
            src.ptr + bytes.start,
            src_ctx,
            (bytes.end - bytes.start) as usize,
            stream.raw,
        )
    })?;
    Ok(())
}

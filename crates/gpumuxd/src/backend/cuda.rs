//! The CUDA device behind the daemon: [`gpumux_cuda::client::ClientDevice`]
//! (clients' kernels as preemptible workers on a context of the daemon's
//! own) behind the [`Backend`] trait (docs/daemon-cuda.md).

use super::compile::{self, CompilePool, WorkPool};
use super::{ended_at_once, refused_op};
use super::{
    pitched_extent, Backend, BufferMove, DevAddr, Failure, HostSpan, KernelCode, KernelImage, LoadError, Loaded,
    MemError, MemInfo, ModuleImage, Moved, OpFailed, OpWork, Registered, Side2D, Wake,
};
use crate::shm::ShmRegion;
use gpumux_cuda::client::module::CompiledModule;
use gpumux_cuda::client::{ClientDevice, ClientWork, ContextLost, HostPtr, KernelHandle, MemoryError, PitchedSide};
use gpumux_cuda::error::Chain;
use gpumux_cuda::CudaError;
use gpumux_engine::device::{Command, Device, DeviceError, Event};
use gpumux_engine::ids::{LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::time::Nanos;
use std::collections::HashMap;
use std::sync::Arc;

/// Opens the GPU of `spec` for the daemon: co-locating launches on shares
/// of every SM if it says so (`ClientDevice::open_co_located`), choosing
/// per pair of kernels between that and SMs of their own unless it says to
/// always co-locate, queueing a stream's next kernel ahead unless it says not to.
pub fn open(spec: crate::daemon::CudaSpec) -> anyhow::Result<Box<dyn Backend>> {
    let ordinal = spec.ordinal;
    let opened = if spec.co_locate { ClientDevice::open_co_located(ordinal) } else { ClientDevice::open(ordinal) };
    let mut device = opened.map_err(|e| anyhow::anyhow!("opening cuda:{ordinal}: {}", Chain(&e)))?;
    device.set_queue_ahead(spec.queue_ahead);
    device.set_choose_placement(spec.choose);
    device.set_refill(spec.refill);
    device.set_hw_priority(spec.hw_priority.unwrap_or(false));
    Ok(Box::new(CudaBackend {
        device,
        regions: Vec::new(),
        refused: HashMap::new(),
        bound: HashMap::new(),
        pending: Vec::new(),
        failed: Vec::new(),
        compiles: compile::compile_pool(),
        pins: WorkPool::new("gpumuxd-pin", 1),
        pinning: HashMap::new(),
        registered: Vec::new(),
        staging: None,
    }))
}

/// How often a device with compiles under way and nothing else is looked
/// at: a compile takes tens of ms, so a load ends at most this much later.
const COMPILE_LOOK: std::time::Duration = std::time::Duration::from_micros(200);

/// [`ClientDevice`] as a [`Backend`].
pub struct CudaBackend {
    device: ClientDevice,
    /// Registered regions, kept mapped while registered (and registered again by a rebuild).
    regions: Vec<Arc<ShmRegion>>,
    /// Operations whose binding the device refused (the daemon checks first,
    /// so this is a bug's trace): their launches end at once, having run nothing.
    refused: HashMap<OpId, String>,
    /// Host spans of bound copies, kept alive with them.
    bound: HashMap<OpId, HostSpan>,
    /// Events of refused operations, for the next poll.
    pending: Vec<Event>,
    /// Refused operations whose end went out, for [`Backend::take_failed`].
    failed: Vec<OpFailed>,
    /// Modules compiling off the device's thread ([`Backend::start_load`]).
    compiles: CompilePool,
    /// Regions being pinned off the device's thread ([`Backend::start_register`]),
    /// by token, kept alive until then.
    pins: WorkPool<Result<(), String>>,
    pinning: HashMap<u64, Arc<ShmRegion>>,
    /// Pins done, for [`Backend::take_registered`].
    registered: Vec<Registered>,
    /// The region a moving client's bytes go through ([`super::pieces`]),
    /// registered (pinned) on the first move and kept.
    staging: Option<Arc<ShmRegion>>,
}

impl CudaBackend {
    /// Records the pins that finished: registered with the device (and so
    /// pinned again by a rebuild), and reported by `take_registered`.
    fn settle_pins(&mut self, results: Vec<(u64, Result<(), String>)>) {
        for (token, result) in results {
            let Some(region) = self.pinning.remove(&token) else { continue };
            let result = match result {
                Ok(()) => {
                    // SAFETY: pinned in this context by its pinner; `regions`
                    // keeps it mapped until it is unregistered.
                    unsafe { self.device.adopt_pinned(region.as_ptr(), region.len()) };
                    self.regions.push(region);
                    Ok(())
                }
                Err(e) => Err(MemError::Device(e)),
            };
            self.registered.push(Registered { token, result });
        }
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Pins under way finish before the context goes.
        self.pins.settle();
    }
}

fn mem_error(e: MemoryError) -> MemError {
    match e {
        MemoryError::OutOfMemory { bytes, free, total } => {
            MemError::OutOfMemory { bytes, free, total, bound: String::new() }
        }
        other => MemError::Device(Chain(&other).to_string()),
    }
}

/// A move's end as the core takes it: its time, ns, or why it failed.
fn moved((token, result): (u64, Result<std::time::Duration, MemoryError>)) -> Moved {
    let result = result.map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1)).map_err(mem_error);
    Moved { token, result }
}

fn cuda_mem_error(e: CudaError) -> MemError {
    MemError::Device(Chain(&e).to_string())
}

impl CudaBackend {
    /// A device error as the core's failure: a lost context with its suspects, or fatal.
    fn failure(&self, e: DeviceError) -> Failure {
        match ContextLost::find(&e) {
            Some(lost) => Failure::ContextLost { suspects: self.device.in_flight(), what: lost.to_string() },
            None => Failure::Fatal(e),
        }
    }

    /// The staging region, made and registered on first use.
    fn staging(&mut self) -> Result<Arc<ShmRegion>, MemError> {
        if let Some(r) = &self.staging {
            return Ok(r.clone());
        }
        let region = super::pieces::staging_region(super::pieces::PIECE)?;
        self.register_host(&region)?;
        self.staging = Some(region.clone());
        Ok(region)
    }

    /// Loads a compiled module into the context (the part of a load that needs it).
    fn load_compiled(&mut self, name: &str, compiled: &CompiledModule) -> Result<ModuleImage, LoadError> {
        let (kernels, log) =
            self.device.load_module(name, compiled).map_err(|e| LoadError::Device(Chain(&e).to_string()))?;
        let kernels = kernels
            .into_iter()
            .map(|(h, k)| KernelImage {
                name: k.name,
                code: KernelCode(h.0),
                param_sizes: Some(k.param_sizes),
                regs_per_thread: k.regs_per_thread,
                static_smem: k.static_smem,
                max_threads_per_block: k.max_threads_per_block,
                max_dynamic_smem: k.max_dynamic_smem,
            })
            .collect();
        Ok(ModuleImage { kernels, log, cached: compiled.cached })
    }

    /// A pitched copy's side for the device, and its host span if it has
    /// one (kept while bound); `None` for a span outside its region.
    fn pitched_side(side: Side2D, width: u64, height: u64) -> (Option<PitchedSide>, Option<HostSpan>) {
        match side {
            Side2D::Device { addr, pitch } => (Some(PitchedSide::Device { addr, pitch }), None),
            Side2D::Host { span, pitch } => {
                let ptr = pitched_extent(pitch, width, height).and_then(|extent| Self::host_ptr(&span, extent));
                (ptr.map(|ptr| PitchedSide::Host { ptr, pitch }), Some(span))
            }
        }
    }

    fn host_ptr(span: &HostSpan, bytes: u64) -> Option<HostPtr> {
        let offset = usize::try_from(span.offset).ok()?;
        span.region.contains(span.offset, bytes).then(|| {
            // SAFETY: offset + bytes is within the mapped region (checked above).
            HostPtr(unsafe { span.region.as_ptr().add(offset) })
        })
    }
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        self.device.describe()
    }

    fn info(&self) -> &DeviceInfo {
        self.device.info()
    }

    fn compute_capability(&self) -> [u32; 2] {
        let arch = self.device.arch();
        [arch / 10, arch % 10]
    }

    fn mem_info(&mut self) -> Result<MemInfo, MemError> {
        let (free, total) = self.device.mem_info().map_err(cuda_mem_error)?;
        Ok(MemInfo { free, total })
    }

    fn alloc(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        self.device.alloc(bytes).map_err(mem_error)
    }

    fn free(&mut self, addr: DevAddr) -> Result<(), MemError> {
        self.device.free(addr).map_err(mem_error)
    }

    fn swap_granularity(&self) -> Option<u64> {
        self.device.swap_granularity()
    }

    fn reserve(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        self.device.reserve_evicted(bytes).map_err(mem_error)
    }

    // The moves are done when these return (gpumux_cuda's `swap`): nothing
    // is left for the core to wait for.
    fn evict(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        self.device.evict(addr).map_err(mem_error).map(|()| 0)
    }

    fn restore(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        self.device.restore(addr).map_err(mem_error).map(|()| 0)
    }

    // Moves run on the device's mover thread (gpumux_cuda's `mover`): the
    // core and this thread go on meanwhile.
    fn start_move(&mut self, token: u64, what: BufferMove) -> Option<Result<Nanos, MemError>> {
        let started = match what {
            BufferMove::Evict(addr) => self.device.start_move(token, true, addr),
            BufferMove::Restore(addr) => self.device.start_move(token, false, addr),
        };
        started.err().map(|e| Err(mem_error(e)))
    }

    fn take_moved(&mut self, out: &mut Vec<Moved>) {
        let mut ended = Vec::new();
        self.device.take_moved(&mut ended);
        out.extend(ended.into_iter().map(moved));
    }

    fn settle_moves(&mut self, out: &mut Vec<Moved>) {
        let mut ended = Vec::new();
        self.device.settle_moves(&mut ended);
        out.extend(ended.into_iter().map(moved));
    }

    fn evicted_survive_rebuild(&self) -> bool {
        true
    }

    fn readdress_evicted(&mut self, addr: DevAddr) -> Result<DevAddr, MemError> {
        self.device.readdress_evicted(addr).map_err(mem_error)
    }

    // A moving client's bytes, a piece at a time through the pinned staging
    // region (`pieces`): each piece is one copy on the copy stream of its
    // direction, waited for.
    fn read_span(&mut self, addr: DevAddr, start: u64, bytes: u64) -> Option<Result<Vec<u8>, MemError>> {
        let staging = match self.staging() {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let device = &mut self.device;
        Some(super::pieces::read_back(start, bytes, &staging, |offset, len| {
            let into = &mut super::pieces::staging_bytes(&staging)[..len];
            device.read_piece(addr, offset, into).map_err(cuda_mem_error)
        }))
    }

    fn write_span(&mut self, addr: DevAddr, start: u64, data: &[u8]) -> Option<Result<(), MemError>> {
        let staging = match self.staging() {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        let device = &mut self.device;
        Some(super::pieces::write_in(start, data, &staging, |offset, len| {
            let from = &super::pieces::staging_bytes(&staging)[..len];
            device.write_piece(addr, offset, from).map_err(cuda_mem_error)
        }))
    }

    fn read_piece(&mut self, addr: DevAddr, offset: u64, into: &mut [u8]) -> Option<Result<(), MemError>> {
        Some(self.device.read_piece(addr, offset, into).map_err(cuda_mem_error))
    }

    // A split's bytes straight between the buffer and the split's region,
    // pinned in this context on first use (where another context of this
    // process pinned it already the driver refuses, and the copy goes at the
    // pace of pageable memory: a daemon of several GPUs runs each in a
    // device process of its own by default).
    fn read_to_region(
        &mut self,
        addr: DevAddr,
        offset: u64,
        region: &Arc<ShmRegion>,
        at: u64,
        len: u64,
    ) -> Option<Result<(), MemError>> {
        if let Err(e) = self.register_host(region) {
            tracing::debug!("a split's region is not pinned on this GPU: {e}");
        }
        let span = match super::pieces::region_span(region, at, len) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        let device = &mut self.device;
        Some(super::pieces::in_pieces(len, |o, n| {
            let piece = &mut span[o as usize..(o + n) as usize];
            device.read_piece(addr, offset + o, piece).map_err(cuda_mem_error)
        }))
    }

    fn write_from_region(
        &mut self,
        addr: DevAddr,
        offset: u64,
        region: &Arc<ShmRegion>,
        at: u64,
        len: u64,
    ) -> Option<Result<(), MemError>> {
        if let Err(e) = self.register_host(region) {
            tracing::debug!("a split's region is not pinned on this GPU: {e}");
        }
        let span = match super::pieces::region_bytes(region, at, len) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        let device = &mut self.device;
        Some(super::pieces::in_pieces(len, |o, n| {
            let piece = &span[o as usize..(o + n) as usize];
            device.write_piece(addr, offset + o, piece).map_err(cuda_mem_error)
        }))
    }

    fn write_piece(&mut self, addr: DevAddr, offset: u64, from: &[u8]) -> Option<Result<(), MemError>> {
        Some(self.device.write_piece(addr, offset, from).map_err(cuda_mem_error))
    }

    fn register_host(&mut self, region: &Arc<ShmRegion>) -> Result<(), MemError> {
        if region.is_empty() || self.regions.iter().any(|r| Arc::ptr_eq(r, region)) {
            return Ok(());
        }
        // SAFETY: the region stays mapped while `self.regions` holds it, until unregister_host.
        unsafe { self.device.register_host(region.as_ptr(), region.len()) }.map_err(cuda_mem_error)?;
        self.regions.push(region.clone());
        Ok(())
    }

    fn start_register(&mut self, token: u64, region: &Arc<ShmRegion>) {
        if region.is_empty() || self.regions.iter().any(|r| Arc::ptr_eq(r, region)) {
            self.registered.push(Registered { token, result: Ok(()) });
            return;
        }
        let (pinner, ptr, len) = (self.device.pinner(), region.as_ptr() as usize, region.len());
        self.pinning.insert(token, region.clone());
        self.pins.give(token, move || {
            // SAFETY: `pinning` keeps the region mapped until the pin is taken;
            // a rebuild or drop waits for pins under way (`settle`).
            unsafe { pinner.pin(ptr as *mut u8, len) }.map_err(|e| Chain(&e).to_string())
        });
    }

    fn take_registered(&mut self, out: &mut Vec<Registered>) {
        let done = self.pins.take();
        self.settle_pins(done);
        out.append(&mut self.registered);
    }

    fn unregister_host(&mut self, region: &ShmRegion) {
        let Some(i) = self.regions.iter().position(|r| std::ptr::eq(Arc::as_ptr(r), region)) else { return };
        let r = self.regions.swap_remove(i);
        self.device.unregister_host(r.as_ptr());
    }

    fn load_module(&mut self, name: &str, source: &str, options: &[String]) -> Result<ModuleImage, LoadError> {
        let compiled = compile::compile(name, source, options, self.device.arch(), self.device.hw_priority().0)?;
        self.load_compiled(name, &compiled)
    }

    fn start_load(&mut self, token: u64, name: &str, source: &str, options: &[String]) {
        let (arch, native) = (self.device.arch(), self.device.hw_priority().0);
        compile::give_compile(&mut self.compiles, token, name, source, options, arch, native);
    }

    fn take_loaded(&mut self, out: &mut Vec<Loaded>) {
        for (token, (name, result)) in self.compiles.take() {
            let result = result.and_then(|m| self.load_compiled(&name, &m));
            out.push(Loaded { token, result });
        }
    }

    fn unload_module(&mut self, kernels: &[KernelCode]) {
        for k in kernels {
            self.device.unload_kernel(KernelHandle(k.0));
        }
    }

    fn runs_block_ranges(&self) -> bool {
        true
    }

    fn kernels_loaded(&self) -> usize {
        self.device.kernels_loaded()
    }

    fn bind(&mut self, op: OpId, work: OpWork) {
        let mut follows = None;
        let mut blocks = None;
        let (work, span) = match work {
            OpWork::Kernel { code, grid, block, shared_bytes, params, after, range } => {
                follows = after;
                blocks = range.map(|[a, b]| a..b);
                (Some(ClientWork::Kernel { kernel: KernelHandle(code.0), grid, block, shared_bytes, params }), None)
            }
            OpWork::ToDevice { dst, src, bytes } => {
                (Self::host_ptr(&src, bytes).map(|src| ClientWork::ToDevice { dst, src, bytes }), Some(src))
            }
            OpWork::ToHost { src, dst, bytes } => {
                (Self::host_ptr(&dst, bytes).map(|dst| ClientWork::ToHost { src, dst, bytes }), Some(dst))
            }
            OpWork::DeviceCopy { src, dst, bytes } => (Some(ClientWork::DeviceCopy { src, dst, bytes }), None),
            OpWork::Memset { dst, value, bytes } => (Some(ClientWork::Memset { dst, value, bytes }), None),
            OpWork::Fill { dst, value, width, bytes } => (Some(ClientWork::Fill { dst, value, width, bytes }), None),
            OpWork::Copy2D { src, dst, width, height } => {
                // At most one side is a host region (the core refuses host to host).
                let (src, from) = Self::pitched_side(src, width, height);
                let (dst, to) = Self::pitched_side(dst, width, height);
                let work = src.zip(dst).map(|(src, dst)| ClientWork::Copy2D { src, dst, width, height });
                (work, from.or(to))
            }
        };
        let Some(work) = work else {
            self.refused.insert(op, "a host span outside its shared region".into());
            return;
        };
        // SAFETY: host spans point into regions the daemon registered; the
        // span (an Arc of its region) is kept in `self.bound` until unbind.
        let bound = unsafe { self.device.bind_after(op, work, follows) };
        // A split launch's part: its range of the grid (core/split.rs).
        let bound = bound.and_then(|()| blocks.map_or(Ok(()), |b| self.device.run_range(op, b)));
        match bound {
            Ok(()) => {
                if let Some(span) = span {
                    self.bound.insert(op, span);
                }
            }
            Err(e) => {
                tracing::warn!("the CUDA device refused operation {op}: {e}");
                self.refused.insert(op, e.to_string());
            }
        }
    }

    fn unbind(&mut self, op: OpId) {
        self.refused.remove(&op);
        self.device.unbind(op);
        self.bound.remove(&op);
    }

    fn now(&self) -> Nanos {
        self.device.now()
    }

    fn submit(&mut self, command: Command) -> Result<(), Failure> {
        if let Some((op, why)) = refused_op(&command).and_then(|op| self.refused.get(&op).map(|w| (op, w))) {
            tracing::warn!("not running {op}: the CUDA device refused its binding ({why})");
            self.failed.push(OpFailed { op, why: why.clone() });
            self.pending.extend(ended_at_once(&command));
            return Ok(());
        }
        let now = self.device.now();
        match self.device.submit(now, command) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failure(e)),
        }
    }

    fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
        events.append(&mut self.pending);
        let now = self.device.now();
        match self.device.advance(Some(now), events) {
            Ok(t) => Ok(t),
            Err(e) => Err(self.failure(e)),
        }
    }

    fn take_failed(&mut self, out: &mut Vec<OpFailed>) {
        out.append(&mut self.failed);
        out.extend(self.device.take_failed().into_iter().map(|(op, why)| OpFailed { op, why }));
    }

    fn next_wake(&self) -> Wake {
        if self.device.busy() || !self.pending.is_empty() {
            Wake::Spin
        } else if self.compiles.pending() > 0 || self.pins.pending() > 0 || !self.registered.is_empty() {
            // A compile's end is looked for, not announced.
            Wake::After(COMPILE_LOOK)
        } else {
            Wake::Idle
        }
    }

    fn submit_answered(&mut self, command: Command) -> Result<(), Failure> {
        if refused_op(&command).is_some_and(|op| self.refused.contains_key(&op)) {
            // Never reported ahead (nothing of it ran): as any refused launch.
            return self.submit(command);
        }
        let now = self.device.now();
        match self.device.submit_answered(now, command) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failure(e)),
        }
    }

    fn retire_answered(&mut self, launch: LaunchId, op: OpId) -> Result<(), Failure> {
        // A refused binding ran nothing and was never reported ahead.
        let retired = self.device.retire_answered(launch, op);
        self.refused.remove(&op);
        self.bound.remove(&op);
        retired.map_err(|e| self.failure(e))
    }

    fn report_ends_ahead(&mut self) {
        self.device.set_report_ends_ahead(true);
    }

    fn run_end_landed(&self) -> Option<bool> {
        self.device.run_end_landed()
    }

    fn look_between(&mut self, posts: usize) -> Result<super::Looked, Failure> {
        match self.device.look_between(posts) {
            Ok(l) => Ok(super::Looked { ended: l.ended, queued: l.queued, more: l.more }),
            Err(e) => Err(self.failure(e)),
        }
    }

    fn take_ends_ahead(&mut self, out: &mut Vec<super::ends_ahead::EndAhead>) {
        out.extend(self.device.take_ends_ahead().map(|(op, blocks)| super::ends_ahead::EndAhead { op, blocks }));
    }

    fn frees_retreats_at_once(&self) -> bool {
        // `ClientDevice`'s per-SM leave announces the SMs released in the command.
        true
    }

    fn rebuild(&mut self) -> Result<(), MemError> {
        // Pins under way finish in the old context, are recorded, and the
        // device pins them again in the new one with the rest.
        self.pins.settle();
        let done = self.pins.take();
        self.settle_pins(done);
        self.pending.clear();
        self.failed.clear();
        self.refused.clear();
        self.bound.clear();
        self.device.rebuild().map_err(cuda_mem_error)
    }
}

//! [`CudaDevice`]: the engine's [`Device`] contract on a real GPU (the module
//! doc of [`crate::device`] says how each command is realised).

use super::blocks::BlockMap;
use super::registry::Lease;
use super::state::{Role, STAGING_BYTES};
use super::suite_ref::{begin_on_instance, Refusal, SuiteTarget};
use super::verify::Verification;
use crate::error::CudaError;
use crate::launch_plan::Chunk;
use crate::preempt::{SmMask, WorkerLaunch};
use crate::runtime::{Event as CuEvent, Stream};
use crate::suite::App;
use gpumux_engine::device::{
    Command, CopyDirection, Device, DeviceError, DeviceStats, Event, Message, ProtocolError, ReleaseCause, TraceSpan,
};
use gpumux_engine::ids::{CopyId, KernelId, LaunchId, ProcessId};
use gpumux_engine::kernel::{DeviceInfo, KernelDesc};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// One engine launch in flight.
struct Live {
    kernel: KernelId,
    /// Index of its suite kernel in the GPU's state.
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
    /// SMs the current workers run on.
    mask: SmSet,
    started: Nanos,
}

struct CopyInFlight {
    copy: CopyId,
    done: CuEvent,
}

/// A real GPU behind the engine's device contract, for one engine run.
///
/// Opening it waits while another device holds the same GPU; the run ends
/// with [`CudaDevice::finish`], which checks the outputs and hands the GPU
/// on. A device dropped without `finish` still stops its work and hands the
/// GPU on, unchecked.
pub struct CudaDevice {
    /// The GPU's state, held until the device is dropped.
    state: Lease,
    info: DeviceInfo,
    seed: u64,
    start: Instant,
    /// Host time spent preparing kernels (compile, inputs, native run): the
    /// device clock stops meanwhile, so a run's first use of a kernel costs nothing.
    paused: Duration,
    chunk: Chunk,
    ctl: Stream,
    copy_streams: [Stream; 2],
    copies: [VecDeque<CopyInFlight>; 2],
    /// Suite blocks not yet run, per kernel invocation.
    left: HashMap<KernelId, BlockRanges>,
    /// Suite kernel and template of each kernel invocation not yet completed.
    bound: HashMap<KernelId, (usize, usize)>,
    /// The instance of each (process, multi-kernel app) in this run.
    instances: HashMap<(ProcessId, App), usize>,
    launches: HashMap<LaunchId, Live>,
    out: Vec<Event>,
    stats: DeviceStats,
    trace: Option<Vec<TraceSpan>>,
}

/// A backend error while doing `what`.
fn backend(what: impl Into<String>) -> impl FnOnce(CudaError) -> DeviceError {
    move |e| DeviceError::backend(what, e)
}

impl CudaDevice {
    /// Opens GPU `ordinal` for one engine run; `seed` makes the suite's inputs.
    /// Waits while another device on the same GPU is open in this process.
    pub fn open(ordinal: u32, seed: u64) -> Result<CudaDevice, CudaError> {
        let mut state = Lease::take(ordinal)?;
        state.gpu.bind()?;
        state.reset()?;
        let info = state.info()?;
        let ctl = Stream::high(&state.gpu)?;
        let copy_streams = [Stream::low(&state.gpu)?, Stream::low(&state.gpu)?];
        // Blocks per claim: chosen per launch from the kernel's measured
        // block time (launch_plan.rs) unless GPUMUX_CUDA_CHUNK fixes it.
        let chunk = std::env::var("GPUMUX_CUDA_CHUNK").ok().and_then(|v| v.parse().ok()).unwrap_or_default();
        Ok(CudaDevice {
            state,
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
        })
    }

    /// Ends the run: stops what is still in flight, checks every kernel's
    /// outputs (the [`verify`](super::verify) module says against what), and
    /// hands the GPU to the next device. `Err` when outputs cannot be read back.
    pub fn finish(mut self) -> Result<Verification, CudaError> {
        self.drain();
        self.state.gpu.bind()?;
        self.state.verify()
    }

    /// Stops every launch still in flight (retreat, then wait), waits for
    /// copies, and returns workers and streams to the GPU's pools, so that
    /// the next device finds the GPU idle. Errors are ignored: this runs at
    /// the end of a run, also of one that failed, and must leave the GPU usable.
    fn drain(&mut self) {
        let _ = self.state.gpu.bind();
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
        for (_, live) in self.launches.drain() {
            self.state.kernels[live.k].pools[live.t].extend(live.segs);
            self.state.give_stream(live.stream);
        }
    }

    fn now(&self) -> Nanos {
        self.start.elapsed().saturating_sub(self.paused).as_nanos() as Nanos
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

    /// Binds a kernel invocation, at its first launch, to its suite kernel
    /// (and for a multi-kernel app to the process's instance and the template
    /// that the instance runs next). Preparing an app the first time stops the clock.
    fn bind(&mut self, kernel: KernelId, process: ProcessId, desc: &KernelDesc) -> Result<(usize, usize), DeviceError> {
        let what = || format!("kernel `{}` of process {process}", desc.name);
        let refused = |why: Refusal| DeviceError::backend(what(), why);
        let target = SuiteTarget::of(desc).map_err(refused)?;
        let (seed, t0) = (self.seed, Instant::now());
        let before = self.state.kernels.len();
        let app = target.config.app;
        let bound = if app.is_multi_kernel() {
            let k = match self.instances.get(&(process, app)) {
                Some(&k) => k,
                None => self.state.instance(&target.config, process, seed).map_err(backend(what()))?,
            };
            let sk = &mut self.state.kernels[k];
            let Role::Instance { seq } = &mut sk.role else {
                return Err(DeviceError::backend(
                    what(),
                    CudaError::Invalid(format!("{} is not an instance", sk.label)),
                ));
            };
            let t = begin_on_instance(&sk.config, seq, &target).map_err(|e| refused(e.into()))?;
            self.instances.insert((process, app), k);
            (k, t)
        } else {
            (self.state.single(&target.config, seed).map_err(backend(what()))?, 0)
        };
        if self.state.kernels.len() > before {
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
        let state = &mut *self.state;
        let r = (|| -> Result<(), CudaError> {
            let k = state
                .kernels
                .get_mut(live.k)
                .ok_or_else(|| CudaError::Invalid(format!("no suite kernel {}", live.k)))?;
            for sr in live.map.suite_work(&live.requested, &left) {
                let mut w = match k.pools.get_mut(live.t).and_then(Vec::pop) {
                    Some(w) => w,
                    None => {
                        // One worker launch per template: keep the others for later.
                        let mut mine = None;
                        for (i, w) in k.prepared.worker_launches(&state.gpu, chunk)?.into_iter().enumerate() {
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
            Ok(())
        })();
        live.mask = live.sms;
        live.stopping = false;
        live.started = now;
        self.launches.insert(lid, live);
        r.map_err(backend(format!("starting the workers of launch {lid}")))
    }

    /// Ends a launch: SMs released, remaining work handed back.
    fn end_launch(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        let Some(live) = self.launches.remove(&lid) else { return Ok(()) };
        let left = self.left.get(&live.kernel).cloned().unwrap_or_default();
        let remaining = live.map.engine_remaining(&live.requested, &left);
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
            match &mut self.state.kernels[live.k].role {
                Role::Single { completed, .. } => *completed += 1,
                Role::Instance { seq } => done = seq.complete().map(|_| ()),
            }
        }
        self.state.kernels[live.k].pools[live.t].extend(live.segs);
        self.state.give_stream(live.stream);
        done.map_err(|e| DeviceError::backend(format!("ending launch {lid}"), e))
    }

    /// Handles launches whose workers have all left.
    fn poll_launches(&mut self) -> Result<(), DeviceError> {
        let mut ended: Vec<LaunchId> = Vec::new();
        for (&lid, live) in self.launches.iter() {
            let mut all = true;
            for w in &live.segs {
                if w.running() && !w.poll().map_err(backend(format!("polling launch {lid}")))? {
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
            let left = self.left.entry(live.kernel).or_default();
            for w in live.segs.iter_mut() {
                let from = w.next as u64;
                let o = w.finish().map_err(backend(format!("reading where launch {lid} stopped")))?;
                left.remove(from..o.next as u64);
            }
            let left = left.clone();
            let dur = now.saturating_sub(live.started);
            self.stats.sm_busy_ns += dur as u128 * live.mask.len() as u128;
            let label = self.state.kernels[live.k].span_label(live.t);
            self.span(live.mask, &label, live.started, now);
            let work_left = live.map.suite_work(&live.requested, &left).next().is_some();
            if work_left && !live.stopping {
                let why = CudaError::Check("its workers stopped with work left though no retreat was asked".into());
                return Err(DeviceError::backend(format!("launch {lid}"), why));
            }
            // Idle workers back to the pool; the launch keeps its stream.
            self.state.kernels[live.k].pools[live.t].append(&mut live.segs);
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
                if !c.done.done().map_err(backend(format!("polling copy {}", c.copy)))? {
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
            w.retreat(&self.ctl).map_err(backend(format!("asking launch {lid} to retreat")))?;
        }
        Ok(())
    }

    /// Queues a copy of `bytes` through the staging buffers on the direction's stream.
    fn copy(&mut self, copy: CopyId, direction: CopyDirection, bytes: u64) -> Result<(), CudaError> {
        let d = match direction {
            CopyDirection::HostToDevice => 0,
            CopyDirection::DeviceToHost => 1,
            // Workload files name host copies only; the daemon has its own device.
            CopyDirection::DeviceToDevice => {
                return Err(CudaError::Invalid("a workload run has no device-to-device copies".into()))
            }
        };
        let stream = &self.copy_streams[d];
        let (host, dev) = (&self.state.staging_host, &self.state.staging_dev);
        let mut left = bytes;
        while left > 0 {
            let n = left.min(STAGING_BYTES as u64) as usize;
            // SAFETY: both staging buffers hold STAGING_BYTES and live as long as the
            // GPU's state, which outlives every stream operation (drained before it is handed on).
            unsafe {
                if d == 0 {
                    stream.copy_to_device_async(dev.ptr, host.host_ptr(), n)?
                } else {
                    stream.copy_to_host_async(host.host_mut_ptr(), dev.ptr, n)?
                }
            }
            left -= n as u64;
        }
        let done = CuEvent::new_sync_only()?;
        done.record(stream)?;
        self.stats.bytes_copied += bytes;
        self.copies[d].push_back(CopyInFlight { copy, done });
        Ok(())
    }
}

impl Drop for CudaDevice {
    /// Stops what is still in flight before the lease hands the GPU on.
    fn drop(&mut self) {
        self.drain();
    }
}

impl Device for CudaDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, _now: Nanos, command: Command) -> Result<(), DeviceError> {
        self.state.gpu.bind().map_err(backend("making the GPU's context current"))?;
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
                let m = self.state.kernels[k].blocks[t];
                let stream = self.state.stream(priority).map_err(backend(format!("a stream for launch {launch}")))?;
                let map = BlockMap { engine: desc.shape.blocks.max(1), suite: m };
                self.left.entry(kernel).or_insert_with(|| BlockRanges::full(m));
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
                self.copy(copy, direction, bytes).map_err(backend(format!("copy {copy} of {bytes} bytes")))?;
            }
        }
        Ok(())
    }

    fn advance(&mut self, until: Option<Nanos>, events: &mut Vec<Event>) -> Result<Nanos, DeviceError> {
        self.state.gpu.bind().map_err(backend("making the GPU's context current"))?;
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

    #[test]
    fn a_device_without_gpu_is_an_error() {
        match CudaDevice::open(0, 1) {
            Ok(d) => {
                assert!(d.info().num_sms > 0);
                let v = d.finish().map_err(|e| e.to_string());
                assert_eq!(v.map(|v| v.ran().count()), Ok(0), "a device that ran nothing checked nothing");
            }
            Err(e) => {
                eprintln!("SKIPPED GPU part of a_device_without_gpu_is_an_error: {e}");
                assert!(!e.to_string().is_empty());
            }
        }
    }
}

//! [`ClientDevice`]: the engine's [`Device`] contract over clients' own
//! kernels and copies, on a context of its own ([`ClientContext`]).
//!
//! The command machinery is the suite device's ([`crate::device`] says how
//! each command is realised): launches as preemptible workers
//! ([`WorkerLaunch`]) restricted to the launch's SMs, on a stream of the
//! launch's priority; every retreat mechanism as a drain at the next chunk
//! boundary; grow as retreat + restart on the larger set; copies on copy
//! streams (host to device, device to host, on the device), each answered
//! by an event. What differs is what a launch runs: the work bound to the
//! command's operation ([`ClientWork`]), and engine block `i` *is* the
//! client kernel's linearised block `i` (no mapping).

use super::context::ClientContext;
use super::fault::ContextLost;
use super::module::{ClientKernel, CompiledModule};
use super::work::{BindError, ClientWork, KernelHandle};

mod ahead;
mod between;
mod clock;
mod corun;
mod handover;
mod higher;
mod lead;
mod peers;
mod refill;
mod watch;
use crate::error::CudaError;
use crate::launch_plan::{Chunk, Plan};
use crate::preempt::{SmMask, WholeGrid, WorkerLaunch};
use crate::runtime::launcher::Launcher;
use crate::runtime::{Event as CuEvent, Module, Params, Stream};
pub use ahead::{AheadCounts, DEEP_HOLD_NS, DEEP_MAX, ENDED_WAITING_MAX};
pub use between::Looked;
pub use corun::CoRunCounts;
use corun::{CoRunChooser, KernelKey, Mode};
use cudarc::driver::sys as cu;
use gpumux_engine::device::{Command, Device, DeviceError, DeviceStats, Event, Message, ProtocolError, ReleaseCause};
use gpumux_engine::id_map::{IdMap, IdSet};
use gpumux_engine::ids::{CopyId, LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
pub use peers::{PEER_HOLD_NS, PEER_HOLD_VAR};
pub use refill::Refill;
use refill::{CutKernel, PendingCut};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A bound kernel operation.
struct KernelOp {
    /// The handle it was bound with (unloaded maybe since: [`ClientDevice::unload_kernel`]).
    handle: KernelHandle,
    /// Shared with [`InContext::kernels`]: a bind per kernel of a chain
    /// copies no name or parameter list (a clone of it was four allocations).
    kernel: Arc<ClientKernel>,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    /// Its arguments, packed at the bind: each launch record that runs it
    /// copies them in, with no allocation (they were cloned, one vector per
    /// argument and one for the list, per kernel queued, and the record's
    /// old ones freed).
    params: Params,
    /// Blocks not yet run, in the whole grid's linear index.
    left: BlockRanges,
    /// The grid's block that the engine's block 0 is: 0, or where a split
    /// launch's range starts ([`ClientDevice::run_range`]).
    first: u64,
    /// Idle workers (control records) of this operation, reused by its relaunches.
    pool: Vec<WorkerLaunch>,
    /// Unbound while launched: forgotten when its launch ends.
    unbound: bool,
    /// The kernel operation right after it on its stream, once bound: its
    /// workers may be queued behind this one's ([`ahead`]).
    next: Option<OpId>,
    /// Its workers resident per SM (the worker's occupancy), asked of the
    /// driver once per kernel and shape ([`InContext::fits`]): queueing ahead
    /// weighs each kernel by it, and a driver call there waited for the
    /// launcher thread's `cuLaunchKernel` (the driver's lock).
    fits: u32,
}

impl KernelOp {
    /// Its whole grid on `sm_count` SMs of its workers' occupancy
    /// ([`KernelOp::fits`]).
    fn whole_grid(&self, sm_count: u32) -> WholeGrid {
        WholeGrid::of(&self.kernel.worker, self.grid, self.block, self.smem, self.fits, sm_count)
    }
}

/// One engine launch in flight.
struct Live {
    op: OpId,
    requested: BlockRanges,
    /// SMs the launch holds (its workers' mask after the next restart).
    sms: SmSet,
    /// SMs to announce as released once the current workers have left.
    releasing: SmSet,
    stream: Stream,
    /// Workers queued or running on `stream`.
    segs: Vec<WorkerLaunch>,
    /// Worker launches a refill cut ([`refill`]): leaving after the blocks
    /// they claimed, on the streams of `leaving_streams`.
    leaving: Vec<WorkerLaunch>,
    leaving_streams: Vec<Stream>,
    /// A refill's cut, asked and not answered yet.
    cut: Option<PendingCut>,
    /// Workers have been asked to retreat.
    stopping: bool,
    /// SMs the current workers run on.
    mask: SmSet,
    /// SMs of `mask` the current workers are told to stay off (per-SM retreat).
    gone: SmSet,
    /// SMs of `mask` the current workers were ever told to leave: none of
    /// them works there any more, even if a grow gave the SM back.
    vacated: SmSet,
    started: Nanos,
    /// The engine's priority of its process: co-location spreads a launch
    /// only over SMs no launch of another priority holds.
    priority: i32,
    /// Where the current workers were placed.
    place: Placement,
    /// The current workers were placed beside a peer kernel by the
    /// co-run chooser ([`corun`]): told how much they did when they end.
    corun: Option<CoRunTag>,
    /// What happened to it, oldest first (the last [`HISTORY`]): named in
    /// the error if its workers ever leave with blocks left unasked.
    history: History,
    /// The run of kernels of its stream it belongs to (the number of the
    /// first launch of the run; kept by the kernels queued behind it and the
    /// launches that adopt them): a stream's own kernels queued ahead are no
    /// peers of it ([`ahead`], "Deep").
    chain: u64,
    /// It adopted a kernel queued natively that was seen ended (its records
    /// given back: no worker launch): it ends at the next poll, every block
    /// done. Not in its launch command: a grow or retreat the engine sends
    /// before it learns of the end must still find it.
    done_ahead: bool,
}

/// Events a launch remembers.
const HISTORY: usize = 12;

/// The last [`HISTORY`] events of a launch, oldest first: kept in place,
/// not in a vector of its own (an allocation per launch command, for a
/// list read only in an error).
#[derive(Clone, Copy, Default)]
struct History {
    /// A ring: the oldest at `first`, `len` of them.
    events: [&'static str; HISTORY],
    first: usize,
    len: usize,
}

impl History {
    fn push(&mut self, what: &'static str) {
        if self.len == HISTORY {
            self.events[self.first] = what;
            self.first = (self.first + 1) % HISTORY;
        } else {
            self.events[(self.first + self.len) % HISTORY] = what;
            self.len += 1;
        }
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Oldest first, joined by `sep`.
    fn join(&self, sep: &str) -> String {
        let events = (0..self.len).map(|i| self.events[(self.first + i) % HISTORY]);
        events.collect::<Vec<_>>().join(sep)
    }
}

/// A launch placed by the co-run chooser: its kernel, its peer's, how.
#[derive(Clone, Copy, Debug)]
struct CoRunTag {
    kernel: KernelKey,
    peer: KernelKey,
    mode: Mode,
}

impl Live {
    fn note(&mut self, what: &'static str) {
        self.history.push(what);
    }
}

/// Where a launch's workers run: on the SMs of `mask`, and, co-located, at
/// the share `(held, over)` of each (`share_of_each_sm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Placement {
    mask: SmSet,
    share: Option<(u32, u32)>,
}

struct CopyInFlight {
    copy: CopyId,
    op: OpId,
    done: CuEvent,
}

/// A device step longer than this is logged (info): the daemon's core waits for it.
const SLOW_STEP: Duration = Duration::from_micros(500);

/// Logs `what` if it took longer than [`SLOW_STEP`] since `start`.
fn log_if_slow(start: Instant, what: impl FnOnce() -> String) {
    let took = start.elapsed();
    if took > SLOW_STEP {
        log_took(took, what);
    }
}

/// Logs that `what` took `took` (a step longer than [`SLOW_STEP`]).
fn log_took(took: Duration, what: impl FnOnce() -> String) {
    tracing::info!("CUDA device: {} took {:.0} µs", what(), took.as_secs_f64() * 1e6);
}

/// Idle launch records kept for reuse at most (each holds a 1.3 KB control
/// record and an event); more are freed.
const MAX_SPARE: usize = 1024;
/// Launch records made with the context and kept for its life
/// ([`InContext::make_kept_records`]): a record costs 0.8-2.1 ms to make on
/// the H100 (device and pinned host memory, an event: docs/history/benchmarks.md,
/// run 129), which a client's first launches would otherwise wait for. A run
/// of kernels queued natively holds one per kernel not seen ended, so they
/// also bound how far the GPU runs ahead of the engine: a poll that sees a
/// run's kernels end queues at most as many more as records came back. 32
/// (as many as a run may hold, [`DEEP_MAX`]) ran the programs bench's chain
/// 1.62x and 1.55x native against 1.72x and 1.71x with 16, alternating in one
/// call on an H200 (docs/program-speed.md, "What bounds the chain next"); 48
/// and 64 (with as deep a run) made no difference at 653c7f0: the cycle grows
/// with its burst.
const KEPT_RECORDS: usize = DEEP_MAX;

/// Everything that lives in the context: dropped before the context is
/// destroyed (so no stale handle outlives it), made again after.
pub(super) struct InContext {
    ctl: Stream,
    /// One per [`super::work::CopyLane`] (its index): a copy up, a copy
    /// down and work on the device each on a stream of its own, so that
    /// both copy engines move at once.
    copy_streams: [Stream; 3],
    copies: [VecDeque<CopyInFlight>; 3],
    /// Idle launch streams by CUDA priority (a few values, clamped to the
    /// device's range: looked up twice per launch command).
    streams: IdMap<i32, Vec<Stream>>,
    pub(super) kernels: HashMap<KernelHandle, (Arc<ClientKernel>, Arc<Module>)>,
    // Keyed by the engine's ids, looked up several times per launch command
    // and walked at each poll: a one-multiply hash, not SipHash (`IdMap`).
    ops: IdMap<OpId, KernelOp>,
    copy_ops: IdMap<OpId, ClientWork>,
    launches: IdMap<LaunchId, Live>,
    /// Idle launch records of operations that are gone, reused by any
    /// kernel's next launch ([`WorkerLaunch::reuse`] says why).
    spare: Vec<WorkerLaunch>,
    /// Records made with the context and never freed before it
    /// ([`KEPT_RECORDS`], by [`WorkerLaunch::record_id`]): when their
    /// kernel is unloaded they go back to `spare` holding `park` instead of
    /// being freed, so a client that comes after finds them, and the
    /// context's memory after a client left is what it was before it came.
    kept: Vec<u64>,
    /// The function idle kept records hold (the cut kernel's: loaded for
    /// the context's life), so that they keep no client's module loaded.
    park: Option<crate::runtime::Function>,
    /// Allocations: address → bytes.
    pub(super) allocations: HashMap<u64, u64>,
    /// Mapped (address-stable) allocations, resident or evicted ([`super::swap`]).
    pub(super) mappings: HashMap<u64, super::swap::Mapping>,
    /// The mapping granularity; `None`: this GPU cannot map, or oversubscription
    /// is off (`swap::OVERSUBSCRIBE_VAR`): every buffer is a `cuMemAlloc`.
    pub(super) granularity: Option<usize>,
    /// The thread evictions and restores run on, with its stream and
    /// pinned ring (started on first use; [`super::mover`]).
    pub(super) mover: Option<super::mover::Mover>,
    /// Workers resident per SM by kernel, threads per block and dynamic
    /// shared memory ([`KernelOp::fits`]).
    fits: HashMap<(KernelHandle, u32, u32), u32>,
    /// Workers of an operation queued behind the launch before it on its
    /// stream, by operation, until the engine launches it ([`ahead`]).
    ahead: IdMap<OpId, ahead::Ahead>,
    /// Which kernel of `ahead` is queued natively behind which ([`ahead::BehindIndex`]).
    behind: ahead::BehindIndex,
    /// How many of `ahead` are not cancelled, by priority and run ([`ahead::Uncancelled`]).
    uncancelled: ahead::Uncancelled,
    /// Which kernel of `ahead` holds which stream ([`ahead::StreamHolders`]).
    holders: ahead::StreamHolders,
    /// The queued kernels that may be runs' tails ([`ahead::Tails`]).
    tails: ahead::Tails,
    /// The kernels of `ahead` not seen ended, and maybe some since gone or
    /// seen ended (dropped at the next poll's walk): what the polls' and the
    /// held polls' looks go through, not the up to `ENDED_WAITING_MAX` seen
    /// ended (`ahead::unended`). Every queued kernel enters it when queued.
    unended: IdSet<OpId>,
    /// Kernels of `ahead` queued natively and seen ended ([`ahead::ENDED_WAITING_MAX`]).
    ended_waiting: usize,
    /// Queued workers of operations unbound before the engine launched
    /// them, leaving: reaped once their workers are gone.
    orphans: Vec<(OpId, ahead::Ahead)>,
    /// The refills' cut kernel ([`refill`]), loaded with the context (so
    /// that its device memory counts in the context's baseline); `None`: it
    /// would not load, and a grow that cannot go on in place drains.
    cut_kernel: Option<CutKernel>,
    /// Where cuts run: a stream of their own at the highest priority, so that
    /// a cut waiting for a free slot holds up no retreat on `ctl`.
    cut_stream: Stream,
    /// Answer words of cuts, kept for the next.
    cut_buffers: Vec<crate::runtime::HostMapped>,
    /// The thread that makes the CUDA calls of workers queued ahead
    /// (`runtime::launcher`; [`ahead`]); `None`: they are made in the
    /// command (the thread would not start, or a test turned it off:
    /// [`ClientDevice::set_launch_thread`]).
    /// Declared last: dropped after every launch record that may wait for it.
    launcher: Option<Launcher>,
}

impl Drop for InContext {
    /// Posted launches name streams that other fields own: they are made
    /// (or fail) before any field is dropped.
    fn drop(&mut self) {
        if let Some(l) = &self.launcher {
            l.drain();
        }
    }
}

impl InContext {
    /// The context's state, with its kept launch records made for `chunk`.
    fn new(ctx: &ClientContext, chunk: Chunk) -> Result<InContext, CudaError> {
        let low = |_| Stream::in_range(ctx.priority_range, ctx.priority_range.0);
        let cut_kernel = match CutKernel::load(ctx.arch()) {
            Ok(k) => Some(k),
            Err(e) => {
                let e = crate::error::Chain(&e);
                tracing::warn!("CUDA device: SMs given back stay idle until their launch ends: no cut kernel ({e})");
                None
            }
        };
        let mut st = InContext {
            ctl: Stream::in_range(ctx.priority_range, ctx.priority_range.1)?,
            copy_streams: [low(())?, low(())?, low(())?],
            copies: Default::default(),
            streams: IdMap::default(),
            kernels: HashMap::new(),
            ops: IdMap::default(),
            copy_ops: IdMap::default(),
            launches: IdMap::default(),
            spare: Vec::new(),
            kept: Vec::new(),
            park: cut_kernel.as_ref().map(|k| k.func.clone()),
            allocations: HashMap::new(),
            mappings: HashMap::new(),
            granularity: super::swap::stable_granularity(ctx.ordinal),
            mover: None,
            fits: HashMap::new(),
            ahead: IdMap::default(),
            behind: ahead::BehindIndex::default(),
            uncancelled: ahead::Uncancelled::default(),
            holders: ahead::StreamHolders::default(),
            tails: ahead::Tails::default(),
            unended: IdSet::default(),
            ended_waiting: 0,
            orphans: Vec::new(),
            cut_kernel,
            cut_stream: Stream::in_range(ctx.priority_range, ctx.priority_range.1)?,
            cut_buffers: Vec::new(),
            launcher: start_launcher(),
        };
        st.make_kept_records(chunk, ctx.summary.sm_count);
        Ok(st)
    }
}

/// A launcher thread; `None` (said in the log) if it would not start. It
/// is always wanted: it raised the 8-client launch rate by 17-25% on the
/// H100 (docs/daemon-cuda.md, "The launcher thread"; the switch that left it
/// out is in git: f0dceeb).
fn start_launcher() -> Option<Launcher> {
    match Launcher::start() {
        Ok(l) => Some(l),
        Err(e) => {
            tracing::warn!("CUDA device: workers queued ahead are launched in the command: {e}");
            None
        }
    }
}

impl InContext {
    /// What a launch of `priority` on `chain` would run beside ([`Neighbours`]).
    fn neighbours(&self, priority: i32, except: Option<LaunchId>, chain: Option<u64>) -> Neighbours<'_> {
        Neighbours { launches: &self.launches, ahead: &self.ahead, queued: &self.uncancelled, priority, except, chain }
    }

    /// A launch stream nothing is queued on any more, for the next launch of its priority.
    fn return_stream(&mut self, stream: Stream) {
        self.streams.entry(stream.priority).or_default().push(stream);
    }

    /// Forgets a kernel operation; its idle launch records become spares,
    /// unless its kernel was unloaded (a record holds its function, and so
    /// its module: the records are freed and the module with the last; kept
    /// records are parked instead, [`InContext::park_or_free`]).
    fn retire(&mut self, op: OpId) {
        if let Some(mut k) = self.ops.remove(&op) {
            if !self.kernels.contains_key(&k.handle) {
                for w in k.pool.drain(..) {
                    self.park_or_free(w);
                }
                return;
            }
            let room = MAX_SPARE.saturating_sub(self.spare.len());
            let keep = k.pool.len().min(room);
            self.spare.extend(k.pool.drain(..keep));
            // Beyond the spares' room: freed, the kept ones parked.
            for w in k.pool.drain(..) {
                self.park_or_free(w);
            }
        }
    }

    /// Makes [`KEPT_RECORDS`] launch records for the context's life, as
    /// spares holding `park` (none without it: the cut kernel did not load).
    fn make_kept_records(&mut self, chunk: Chunk, sm_count: u32) {
        let Some(park) = self.park.clone() else { return };
        for _ in 0..KEPT_RECORDS {
            match WorkerLaunch::new(park.clone(), Params::default(), [1, 1, 1], [1, 1, 1], 0, chunk, sm_count) {
                Ok(w) => {
                    self.kept.push(w.record_id());
                    self.spare.push(w);
                }
                Err(e) => {
                    tracing::warn!("CUDA device: launch records are made at first use: {e}");
                    return;
                }
            }
        }
    }

    /// An idle record whose kernel is gone: a kept one goes back to the
    /// spares holding `park`, any other is freed (with the module's last
    /// reference, if it is that).
    fn park_or_free(&mut self, mut w: WorkerLaunch) {
        if !self.kept.contains(&w.record_id()) {
            return;
        }
        let Some(park) = &self.park else { return };
        match w.reuse(park, &Params::default(), [1, 1, 1], [1, 1, 1], 0) {
            Ok(()) => self.spare.push(w),
            Err(e) => {
                // Not idle after all (a bug): freed, and the context's memory shows it.
                tracing::warn!("CUDA device: a kept launch record could not be parked: {e}");
                self.kept.retain(|&id| id != w.record_id());
            }
        }
    }
}

/// A real GPU serving clients' kernels and copies (module doc).
pub struct ClientDevice {
    pub(super) ctx: ClientContext,
    /// `None` only while a rebuild is under way or after one failed.
    pub(super) st: Option<InContext>,
    /// Host ranges registered (address, bytes): registered again after a rebuild.
    pub(super) host: Vec<(usize, usize)>,
    /// Evicted buffers' bytes, by address: outside the context, so that they
    /// outlive a lost one ([`super::swap`]).
    pub(super) swapped: HashMap<u64, super::swap::HostCopy>,
    /// The last restored buffer's host copy, kept for the next eviction of
    /// a buffer of about its size ([`super::swap`]).
    pub(super) spare_copy: Option<super::swap::HostCopy>,
    /// The pinned host pool's cap, if set on the device ([`ClientDevice::set_swap_pinned`]);
    /// else gpumuxd's environment says ([`super::PINNED_VAR`]).
    pub(super) swap_pinned: Option<usize>,
    /// Buffer moves that ended and were not yet taken ([`super::swap`]).
    pub(super) moves_ended: Vec<(u64, Result<Duration, super::memory::MemoryError>)>,
    info: DeviceInfo,
    start: Instant,
    chunk: Chunk,
    next_kernel: u64,
    out: Vec<Event>,
    /// Operations whose launch the driver refused for a reason of their own
    /// ([`ClientDevice::take_failed`]).
    failed: Vec<(OpId, String)>,
    stats: DeviceStats,
    /// Co-location ([`ClientDevice::open_co_located`]).
    co_locate: bool,
    /// Queue a stream's next kernel behind the running one ([`ahead`];
    /// [`ClientDevice::set_queue_ahead`]).
    queue_ahead: bool,
    ahead_counts: AheadCounts,
    /// Co-location chosen per pair of kernels by measuring both placements
    /// ([`corun`]; [`ClientDevice::set_choose_placement`]); off: always co-located.
    chooser: Option<CoRunChooser>,
    /// Where launch commands' time goes ([`clock`]), logged on close.
    clock: clock::LaunchClock,
    /// Where polls' time goes ([`clock::PollClock`]), logged on close.
    poll_clock: clock::PollClock,
    /// When a grow refills a launch ([`refill`]; [`ClientDevice::set_refill`]).
    refill: Refill,
    /// Refills asked and carried out (logged on close).
    refills: (u64, u64),
    /// Lone launches left to the hardware's stream priorities
    /// ([`ClientDevice::set_hw_priority`]), and the launches run natively so far.
    hw_priority: bool,
    native_launches: u64,
    /// Under hardware priority, a kernel known to be short runs natively
    /// beside peers of its priority too ([`peers`]).
    peers: peers::PeerRule,
    peer_counts: peers::PeerCounts,
    /// Ends of kernels queued natively seen before the engine launched them,
    /// kept for [`ClientDevice::take_ends_ahead`] while `report_ends` ([`ahead`]).
    ends_ahead: Vec<(OpId, u64)>,
    report_ends: bool,
    /// Launches the daemon answered itself from their ends seen ahead
    /// ([`ClientDevice::submit_answered`]), until they end.
    answered: Vec<LaunchId>,
    /// Runs of kernels queued natively may go on at the next poll
    /// ([`ClientDevice::deepen_tails`]): a launch adopted a queued kernel, or
    /// an operation was unbound (launch records may have come back).
    refill_ahead: bool,
    /// A look between polls stopped at its bound of posts with runs that may
    /// go on: the next look deepens them even if no end landed ([`between`]).
    between_owed: bool,
    /// The GPU's lead over the engine at each poll ([`lead`]).
    lead: lead::Lead,
    /// Which priorities started launches lately ([`higher`]): a lower one is
    /// not queued natively ahead while a higher one is active.
    higher: higher::Higher,
    /// [`ClientDevice::deepen_tails`]' list, kept between its calls (one
    /// at most polls: not a vector allocated per poll).
    tails: Vec<OpId>,
    /// The same for a poll's heads of runs ([`ClientDevice::poll_ahead`]),
    /// its launches whose end a later kernel may imply
    /// ([`ClientDevice::mark_implied_ends`]) and the launches it ends
    /// ([`ClientDevice::poll_launches_of`]; an answered launch command's
    /// look at the launch before it too).
    heads: Vec<OpId>,
    implied: Vec<(LaunchId, OpId)>,
    ended: Vec<LaunchId>,
}

/// A device error while doing `what`, typed [`ContextLost`] when the context is gone.
pub(super) fn failed(what: impl Into<String>) -> impl FnOnce(CudaError) -> DeviceError {
    move |e| match ContextLost::of(&e) {
        Some(lost) => DeviceError::backend(what, lost),
        None => DeviceError::backend(what, e),
    }
}

/// [`failed`] with its words made only if it did fail: most of these
/// name a launch, and a `format!` per launch per poll showed in profiles.
pub(super) fn failed_with(what: impl FnOnce() -> String) -> impl FnOnce(CudaError) -> DeviceError {
    move |e| failed(what())(e)
}

/// Whether `params` have the sizes `want`, else their sizes: compared in
/// place, the list made only for the error (a bind per kernel allocated it).
fn param_sizes_match(params: &[Vec<u8>], want: &[u32]) -> Result<(), Vec<u32>> {
    let sizes = || params.iter().map(|p| p.len() as u32);
    if params.len() == want.len() && sizes().eq(want.iter().copied()) {
        return Ok(());
    }
    Err(sizes().collect())
}

/// `st`, with `ctx` made current (a free function, so that callers may
/// borrow the device's other fields meanwhile).
fn state_of<'a>(ctx: &ClientContext, st: &'a mut Option<InContext>) -> Result<&'a mut InContext, CudaError> {
    ctx.bind()?;
    st.as_mut().ok_or_else(|| CudaError::Invalid("the device's context failed to rebuild".into()))
}

fn sm_mask(sms: SmSet) -> SmMask {
    let mut mask = SmMask::empty();
    for sm in sms.iter() {
        mask.insert(sm.0 as u32);
    }
    mask
}

/// Workers per SM of a co-located launch that holds `held` of `sm_count`
/// SMs: its share of each SM's `workers_per_sm`, rounded, at least 1
/// ([`ClientDevice::open_co_located`]).
fn share_of_each_sm(workers_per_sm: u32, held: u32, sm_count: u32) -> u32 {
    let (w, h, p) = (workers_per_sm as u64, held as u64, sm_count.max(1) as u64);
    ((w * h + p / 2) / p).max(1) as u32
}

/// The SMs a co-located launch of `priority` spreads over: every SM but
/// those the launches of other priorities hold (`others`: each one's
/// priority and SMs). Peers of one priority share SMs; an urgent launch
/// does not spread onto SMs still full of low-priority blocks (its workers
/// would wait there for those blocks to end, a whole block time), and a
/// low-priority one does not spread onto an urgent launch's SMs.
fn co_location_spread(sm_count: u32, priority: i32, others: impl Iterator<Item = (i32, SmSet)>) -> SmSet {
    others
        .filter(|(p, _)| *p != priority)
        .fold(SmSet::range(0, sm_count as u16), |spread, (_, sms)| spread.difference(&sms))
}

/// Where `live`'s workers go (co-located: every SM no launch of another
/// priority holds, at the launch's share of each, when a peer of its
/// priority runs; with nobody to share SMs with, a small launch spread over
/// every SM would only start more workers). `live` is not in `st.launches`.
/// A peer's next kernel running queued ahead counts as a peer: between its
/// kernels the engine sees none, and a launch placed then on its own SMs at
/// full occupancy would leave the peer's next launch no room beside it.
fn placement(co_locate: bool, sm_count: u32, st: &InContext, live: &Live) -> Placement {
    let spread = co_location_spread(sm_count, live.priority, st.launches.values().map(|l| (l.priority, l.sms)));
    let peer = !st.neighbours(live.priority, None, Some(live.chain)).alone();
    // An operation not bound (the start fails on it anyway): its own SMs.
    let workers_per_sm = st.ops.get(&live.op).map_or(1, |o| o.fits);
    placement_of(co_locate && peer, live.sms, spread, workers_per_sm)
}

/// [`placement`]'s arithmetic: a launch given `sms`, that may spread over
/// `spread` (`spread_ok`: co-location is on and a peer of its priority
/// runs), with `workers_per_sm` slots per SM (its kernel's occupancy).
///
/// Spread, it takes `share_of_each_sm` workers on every SM of `spread`. A
/// share that rounds to the whole SM is no share: its workers would fill
/// every SM they reach, the SMs the engine kept for others included, and a
/// launch the engine then starts there finds no slot until those workers
/// leave, which a grid that never ends never does (issue 36: a grid of
/// 2^31 blocks of 1024 threads given 130 of 132 SMs took 2 of 2 slots
/// everywhere, and a peer's one-block kernel on the two SMs kept for it
/// waited up to 5.4 s). Such a launch runs on its own SMs, at full
/// occupancy there: the slots it is owed, exactly, and none of the others'.
fn placement_of(spread_ok: bool, sms: SmSet, spread: SmSet, workers_per_sm: u32) -> Placement {
    if spread_ok && !sms.is_empty() && sms.len() < spread.len() {
        let share = (sms.len(), spread.len());
        if share_of_each_sm(workers_per_sm, share.0, share.1) < workers_per_sm {
            return Placement { mask: spread, share: Some(share) };
        }
    }
    Placement { mask: sms, share: None }
}

/// Workers a launch placed at `place` may have on SM `sm`, with
/// `workers_per_sm` slots there: its share of the SM where it spreads,
/// the whole SM where it runs on its own SMs, none elsewhere (the model of
/// the mask and per-SM cap that the prelude's `gmx_enter` checks).
#[cfg(test)]
fn workers_on(place: Placement, workers_per_sm: u32, sm: gpumux_engine::ids::SmId) -> u32 {
    if !place.mask.contains(sm) {
        return 0;
    }
    place.share.map_or(workers_per_sm, |(held, over)| share_of_each_sm(workers_per_sm, held, over))
}

/// [`placement`], with co-location decided per pair of kernels by the
/// co-run chooser if there is one ([`corun`]): a launch that would be
/// co-located beside exactly one peer kernel goes where the chooser says.
fn place(
    co_locate: bool,
    chooser: Option<&mut CoRunChooser>,
    sm_count: u32,
    st: &InContext,
    live: &Live,
) -> (Placement, Option<CoRunTag>) {
    let shared = placement(co_locate, sm_count, st, live);
    let Some(chooser) = chooser else { return (shared, None) };
    if shared.share.is_none() {
        return (shared, None);
    }
    let (Some(kernel), Some(peer)) = (kernel_of(st, live.op), sole_peer(st, live.priority, live.chain)) else {
        return (shared, None);
    };
    if kernel == peer {
        // One loaded kernel on two streams: nothing to tell apart.
        return (shared, None);
    }
    let mode = chooser.mode(kernel, peer, Instant::now());
    let placed = match mode {
        Mode::CoLocated => shared,
        Mode::OwnSms => Placement { mask: live.sms, share: None },
    };
    (placed, Some(CoRunTag { kernel, peer, mode }))
}

/// The loaded worker function of kernel operation `op`.
fn kernel_of(st: &InContext, op: OpId) -> Option<KernelKey> {
    st.ops.get(&op).map(|o| o.kernel.worker.key())
}

/// The one kernel running (or queued ahead to run, but on `chain`'s own
/// stream) at `priority`, if exactly one is: the peer a launch of that
/// priority is placed beside.
fn sole_peer(st: &InContext, priority: i32, chain: u64) -> Option<KernelKey> {
    let running = st.launches.values().filter(|l| l.priority == priority && !l.sms.is_empty()).map(|l| l.op);
    let queued = ahead::peers(&st.ahead, &st.uncancelled, priority, Some(chain));
    let mut keys = running.chain(queued).filter_map(|op| kernel_of(st, op));
    let first = keys.next()?;
    keys.all(|k| k == first).then_some(first)
}

/// What a launch of `priority` on stream chain `chain` (if any) would run
/// beside: the device's launches but `except`, and the workers queued ahead
/// of them ([`ahead`]). Built once where a start or a queueing decides how the
/// launch runs; its methods answer the questions that decision asks.
struct Neighbours<'a> {
    launches: &'a IdMap<LaunchId, Live>,
    ahead: &'a IdMap<OpId, ahead::Ahead>,
    queued: &'a ahead::Uncancelled,
    priority: i32,
    except: Option<LaunchId>,
    chain: Option<u64>,
}

impl Neighbours<'_> {
    /// No launch of its priority but `except` and `chain`'s holds SMs, and no
    /// workers of it are queued ahead but `chain`'s (its own stream's): the
    /// launch has no peer to share SMs with.
    fn alone(&self) -> bool {
        let (priority, except, chain) = (self.priority, self.except, self.chain);
        !self
            .launches
            .iter()
            .any(|(&l, x)| Some(l) != except && Some(x.chain) != chain && x.priority == priority && !x.sms.is_empty())
            && !ahead::peer_running(self.queued, priority, chain)
    }

    /// How the launch runs under hardware priority
    /// ([`ClientDevice::set_hw_priority`]), as (natively whatever its length,
    /// natively if long): nothing native unless it is alone at its priority;
    /// alone, natively if long, and whatever its length if launches of
    /// another priority leave room for it ([`Neighbours::beside_others_natively`]).
    /// With peers, a kernel known to be short may still run natively
    /// ([`Neighbours::native_beside_peers`]).
    fn hw_native(&self, hw_priority: bool) -> (bool, bool) {
        if !hw_priority || !self.alone() {
            return (false, false);
        }
        (self.beside_others_natively(), true)
    }

    /// Launches of priorities other than its own (but `except`) leave room
    /// for a short native grid of it: none runs as workers, or some run
    /// natively. Beside another priority's workers a short launch stays
    /// workers: the engine's SMs are what keeps the two apart there (a native
    /// grid would take free slots on the other's SMs); beside its native blocks
    /// workers could not displace them, and the hardware orders the two by
    /// stream priority.
    fn beside_others_natively(&self) -> bool {
        let others = self.launches.iter().filter(|(&l, x)| Some(l) != self.except && x.priority != self.priority);
        let (mut native, mut workers) = (false, false);
        for (_, l) in others {
            for w in l.segs.iter().chain(&l.leaving).filter(|w| w.running()) {
                native |= w.running_native();
                workers |= !w.running_native();
            }
        }
        workers |= ahead::workers_of_others(self.ahead, self.queued, self.priority);
        native || !workers
    }

    /// The launch, its kernel `short` (known short: [`WholeGrid::is_short`]),
    /// runs natively though peers of its priority run or are queued
    /// ([`peers`]): under hardware priority, not alone (alone,
    /// [`Neighbours::hw_native`] decides), and beside other priorities as
    /// [`Neighbours::beside_others_natively`] allows.
    fn native_beside_peers(&self, hw_priority: bool, short: bool) -> bool {
        // The cheap answers first: most launches are alone, or long.
        if !hw_priority || !short {
            return false;
        }
        let alone = self.alone();
        let beside = !alone && self.beside_others_natively();
        peers::native_beside_peers(hw_priority, alone, beside, short)
    }
}

/// Kernel operation `o`'s whole grid is known to be short on `sm_count` SMs.
fn op_is_short(o: &KernelOp, sm_count: u32) -> bool {
    o.kernel.native.is_some() && o.whole_grid(sm_count).is_short()
}

/// How [`start_segs`] starts workers.
#[derive(Clone, Copy)]
struct SegPlan {
    place: Placement,
    /// Never the native kernel (it cannot retreat): workers queued ahead
    /// must be able to leave unrun if the launch before them retreats.
    never_native: bool,
    /// The whole grid natively if the native build is at hand, always or if
    /// the launch is long ([`ClientDevice::set_hw_priority`]).
    native_anywhere: bool,
    native_if_long: bool,
    chunk: Chunk,
    sm_count: u32,
    /// A native start publishes its end in host memory (`WorkerLaunch::publish_end`).
    publish_end: bool,
    /// A native start by the launcher thread records no end event until a
    /// poll needs one (`WorkerLaunch::lazy_end`): kernels queued natively
    /// ahead, whose ends are read from host memory.
    lazy_end: bool,
}

/// Starts workers for `ranges` of kernel operation `op` on `stream`, one
/// launch record per range (the operation's idle ones first, then spares);
/// each joins `segs` as it starts. `lid` names the launch in logs.
#[allow(clippy::too_many_arguments)]
fn start_segs(
    ops: &mut IdMap<OpId, KernelOp>,
    spare: &mut Vec<WorkerLaunch>,
    op: OpId,
    ranges: &BlockRanges,
    stream: &Stream,
    how: SegPlan,
    lid: LaunchId,
    segs: &mut Vec<WorkerLaunch>,
    post: Option<(&Launcher, cu::CUcontext)>,
    clock: &mut clock::LaunchClock,
) -> Result<(), CudaError> {
    // The launch calls below (here or on the launcher thread) are stamped
    // as this operation's (issue 35's stage stamps; nothing when off).
    gpumux_stamps::set_tag(op.0);
    let op = ops.get_mut(&op).ok_or_else(|| CudaError::Invalid(format!("no work bound to {op}")))?;
    let mask = sm_mask(how.place.mask);
    for r in ranges.ranges() {
        let readying = clock.start();
        let reused = match op.pool.pop() {
            Some(w) => Some(w),
            None => spare
                .pop()
                .map(|mut w| w.reuse(&op.kernel.worker, &op.params, op.grid, op.block, op.smem).map(|_| w))
                .transpose()?,
        };
        // A new record is what may be slow (1-2 ms): only it is timed (no
        // clock read for a record reused, as a chain's kernels' are).
        let made = reused.is_none().then(Instant::now);
        let w = match reused {
            Some(w) => w,
            None => WorkerLaunch::new(
                op.kernel.worker.clone(),
                op.params.clone(),
                op.grid,
                op.block,
                op.smem,
                how.chunk,
                how.sm_count,
            )?,
        };
        let mut w = w.urgent(how.never_native);
        w.next = r.start as u32;
        w.end = r.end as u32;
        let native = how.native_anywhere || how.native_if_long;
        w.set_native(if native { op.kernel.native.as_ref() } else { None });
        w.native_anywhere(how.native_anywhere);
        w.native_if_long(how.native_if_long);
        w.publish_end(how.publish_end);
        w.lazy_end(how.lazy_end);
        if let Some(t) = made {
            log_if_slow(t, || format!("a launch record for launch {lid}"));
        }
        w.share_cap = how.place.share.map(|(held, over)| share_of_each_sm(w.workers_per_sm(), held, over));
        // A post makes no driver call (the launcher thread makes them) but a
        // timed start's, which `last_start_calls` times: the clock is read
        // around a start made here, or in a sampled command.
        let t = (post.is_none() || clock.timing()).then(Instant::now);
        clock.part(clock::Part::Record, readying);
        w.time_start = clock.timing();
        let started = match post {
            Some((launcher, ctx)) => w.start_posted(stream, mask, launcher, ctx),
            None => w.start(stream, mask),
        };
        clock.part(clock::Part::StartCall, t);
        clock.start_parts(w.last_start_parts);
        match t {
            Some(t) => log_if_slow(t, || format!("launching launch {lid}'s workers")),
            None => {
                let (launch, record) = w.last_start_calls;
                let calls = Duration::from_nanos(launch as u64 + record as u64);
                if calls > SLOW_STEP {
                    log_took(calls, || format!("launching launch {lid}'s workers (their calls)"));
                }
            }
        }
        segs.push(w);
        started?;
    }
    Ok(())
}

/// Every worker of `segs` has left (a poll of each still running).
fn all_left(segs: &[WorkerLaunch]) -> Result<bool, CudaError> {
    for w in segs {
        if w.running() && !w.poll()? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `r` moved up by `by` blocks (`up`), or down: between the engine's block
/// index and a range operation's grid index (`ClientDevice::run_range`).
/// Taken by value: most operations are whole grids (`by` 0), and `r` is
/// then returned as it is, not copied (an allocation per launch command).
fn shifted(r: BlockRanges, by: u64, up: bool) -> BlockRanges {
    if by == 0 {
        return r;
    }
    let mut out = BlockRanges::new();
    for x in r.ranges() {
        if up {
            out.insert(x.start + by..x.end + by);
        } else {
            out.insert(x.start.saturating_sub(by)..x.end.saturating_sub(by));
        }
    }
    out
}

/// Blocks of `requested` still in `left`.
fn still_to_run(requested: &BlockRanges, left: &BlockRanges) -> BlockRanges {
    let mut out = BlockRanges::new();
    for r in requested.ranges() {
        for w in left.within(r.clone()) {
            out.insert(w);
        }
    }
    out
}

/// Every block of `left` is in `requested`: `still_to_run(requested, left) == *left`,
/// without making the set (an allocation per adopting launch command).
fn all_requested(requested: &BlockRanges, left: &BlockRanges) -> bool {
    let req = requested.ranges();
    // `requested`'s ranges are disjoint and not adjacent: a range of `left`
    // inside their union lies inside one of them.
    left.ranges().iter().all(|r| {
        let at = req.partition_point(|x| x.end <= r.start);
        req.get(at).is_some_and(|x| x.start <= r.start && r.end <= x.end)
    })
}

impl ClientDevice {
    /// Opens GPU `ordinal` with a context of its own.
    pub fn open(ordinal: i32) -> Result<ClientDevice, CudaError> {
        Self::open_with(ordinal, false)
    }

    /// Opens GPU `ordinal` **co-locating** launches: a launch given a share
    /// of the SMs (k of P) while a launch of its priority runs beside it
    /// spreads its workers over *every* SM no launch of another priority
    /// holds (P of them), each SM taking at most round(k / P × its
    /// occupancy) of them (at least 1). Urgent and low-priority launches
    /// keep SMs of their own: an urgent one spread onto SMs full of
    /// low-priority blocks would wait for them to end. The engine's
    /// spatial decisions become shares of each SM, so a memory-bound and a
    /// compute-bound kernel split "in half" both stay resident everywhere:
    /// the memory-bound one needs bandwidth from every SM, not SMs of its
    /// own (issue 14's co-run measurements). A launch given every SM runs
    /// as without co-location, and so does one whose share rounds to the
    /// whole SM (it would fill the SMs the engine kept for others:
    /// `placement_of`). Shares are exact for even splits; with
    /// three or more launches the rounded shares may add up to a little
    /// more than an SM holds, and the hardware then fits what it can.
    pub fn open_co_located(ordinal: i32) -> Result<ClientDevice, CudaError> {
        Self::open_with(ordinal, true)
    }

    fn open_with(ordinal: i32, co_locate: bool) -> Result<ClientDevice, CudaError> {
        let ctx = ClientContext::create(ordinal)?;
        let info = crate::device::info_of(&ctx.summary, ordinal, |a| ctx.attr(a))?;
        let chunk = std::env::var("GPUMUX_CUDA_CHUNK").ok().and_then(|v| v.parse().ok()).unwrap_or_default();
        let st = InContext::new(&ctx, chunk)?;
        let mut device = ClientDevice {
            ctx,
            st: Some(st),
            host: Vec::new(),
            swapped: HashMap::new(),
            spare_copy: None,
            swap_pinned: None,
            moves_ended: Vec::new(),
            info,
            start: Instant::now(),
            chunk,
            next_kernel: 1,
            out: Vec::new(),
            failed: Vec::new(),
            stats: DeviceStats::default(),
            co_locate,
            queue_ahead: true,
            ahead_counts: AheadCounts::default(),
            chooser: co_locate.then(CoRunChooser::default),
            clock: clock::LaunchClock::default(),
            poll_clock: clock::PollClock::default(),
            refill: Refill::Drained,
            refills: (0, 0),
            hw_priority: false,
            native_launches: 0,
            peers: peers::PeerRule::from_env(),
            peer_counts: peers::PeerCounts::default(),
            ends_ahead: Vec::new(),
            report_ends: false,
            answered: Vec::new(),
            refill_ahead: false,
            between_owed: false,
            lead: lead::Lead::default(),
            higher: higher::Higher::default(),
            tails: Vec::new(),
            heads: Vec::new(),
            implied: Vec::new(),
            ended: Vec::new(),
        };
        // The pinned host pool grown from the start, if gpumuxd asked (`swap::update_ahead`).
        device.update_ahead();
        Ok(device)
    }

    /// The GPU, in words (`NVIDIA H100 80GB HBM3 (cuda:0)`).
    pub fn describe(&self) -> String {
        format!("{} (cuda:{})", self.ctx.summary.name, self.ctx.ordinal)
    }

    /// The architecture modules are compiled for (90 on Hopper).
    pub fn arch(&self) -> u32 {
        self.ctx.arch()
    }

    /// Device time now: ns since the device opened.
    pub fn now(&self) -> Nanos {
        self.start.elapsed().as_nanos() as Nanos
    }

    /// The context-bound state, with the context made current.
    pub(super) fn state(&mut self) -> Result<&mut InContext, CudaError> {
        state_of(&self.ctx, &mut self.st)
    }

    /// Loads a compiled client module; each kernel gets a handle.
    pub fn load_module(
        &mut self,
        name: &str,
        compiled: &CompiledModule,
    ) -> Result<(Vec<(KernelHandle, ClientKernel)>, String), CudaError> {
        let first = self.next_kernel;
        let loaded = {
            let _ = self.state()?;
            super::module::load(name, compiled)?
        };
        self.next_kernel += loaded.kernels.len() as u64;
        let st = self.state()?;
        let mut out = Vec::new();
        for (i, k) in loaded.kernels.into_iter().enumerate() {
            let h = KernelHandle(first + i as u64);
            st.kernels.insert(h, (Arc::new(k.clone()), loaded.module.clone()));
            out.push((h, k));
        }
        Ok((out, loaded.log))
    }

    /// The launch records made with the context and kept for its life, and
    /// the idle ones now (ids: [`WorkerLaunch::record_id`]).
    pub fn launch_records(&self) -> (Vec<u64>, Vec<u64>) {
        self.st.as_ref().map_or((Vec::new(), Vec::new()), |st| {
            (st.kept.clone(), st.spare.iter().map(WorkerLaunch::record_id).collect())
        })
    }

    /// Kernels loaded and not unloaded ([`ClientDevice::unload_kernel`]).
    pub fn kernels_loaded(&self) -> usize {
        self.st.as_ref().map_or(0, |st| st.kernels.len())
    }

    /// Forgets a kernel (its module is unloaded with its last kernel).
    /// Operations bound to it keep its code loaded until they are unbound,
    /// and workers of it still on the GPU (queued, or leaving after a
    /// client died) until they are reaped: a [`crate::runtime::Function`]
    /// holds its module.
    pub fn unload_kernel(&mut self, kernel: KernelHandle) {
        let Ok(st) = state_of(&self.ctx, &mut self.st) else { return };
        st.fits.retain(|&(h, _, _), _| h != kernel);
        if let Some((k, _)) = st.kernels.remove(&kernel) {
            // Idle records of it kept for other kernels would keep its module.
            let key = k.worker.key();
            let (gone, stay): (Vec<_>, Vec<_>) =
                std::mem::take(&mut st.spare).into_iter().partition(|w| w.function().key() == key);
            st.spare = stay;
            for w in gone {
                st.park_or_free(w);
            }
            if let Some(chooser) = self.chooser.as_mut() {
                chooser.forget(key);
            }
        }
    }

    /// Binds operation `op`'s work before the engine may start it.
    ///
    /// # Safety
    /// The host addresses of a copy must point to `bytes` bytes registered
    /// with [`ClientDevice::register_host`] that stay mapped until the
    /// operation is unbound (or the device dropped).
    pub unsafe fn bind(&mut self, op: OpId, work: ClientWork) -> Result<(), BindError> {
        let Some(st) = self.st.as_mut() else { return Err(BindError::UnknownKernel(KernelHandle(0))) };
        if st.ops.contains_key(&op) || st.copy_ops.contains_key(&op) {
            return Err(BindError::Twice(op.0));
        }
        let ClientWork::Kernel { kernel, grid, block, shared_bytes, params } = work else {
            st.copy_ops.insert(op, work);
            return Ok(());
        };
        let (k, _) = st.kernels.get(&kernel).ok_or(BindError::UnknownKernel(kernel))?;
        if let Err(got) = param_sizes_match(&params, &k.param_sizes) {
            return Err(BindError::Params { kernel: k.name.clone(), want: k.param_sizes.clone(), got });
        }
        let shape = |what: String| BindError::Shape { kernel: k.name.clone(), what };
        let (blocks, threads) = super::work::check_launch_shape(grid, block).map_err(shape)?;
        if threads > k.max_threads_per_block as u64 {
            return Err(shape(format!("{threads} threads per block (at most {})", k.max_threads_per_block)));
        }
        if shared_bytes > k.max_dynamic_smem {
            return Err(shape(format!(
                "{shared_bytes} bytes of dynamic shared memory (at most {})",
                k.max_dynamic_smem
            )));
        }
        let left = BlockRanges::full(blocks);
        let fits = *st
            .fits
            .entry((kernel, threads as u32, shared_bytes))
            .or_insert_with(|| k.worker.blocks_per_sm(threads as u32, shared_bytes).unwrap_or(1));
        let (handle, kernel) = (kernel, Arc::clone(k));
        let (pool, unbound, next) = (Vec::new(), false, None);
        let params = Params::of_args(&params);
        st.ops.insert(
            op,
            KernelOp {
                handle,
                kernel,
                grid,
                block,
                smem: shared_bytes,
                params,
                left,
                first: 0,
                pool,
                unbound,
                next,
                fits,
            },
        );
        Ok(())
    }

    /// Makes bound kernel operation `op` run only blocks `blocks` of its
    /// grid (linear index, `blockIdx`/`gridDim` of the whole grid): the
    /// engine's blocks 0.. are the grid's `blocks.start`.. (a launch split
    /// over GPUs: gpumuxd's `core/split.rs`). Before it is launched. Such an
    /// operation never runs natively (a native grid runs whole) nor is
    /// queued ahead (both need the whole grid).
    pub fn run_range(&mut self, op: OpId, blocks: std::ops::Range<u64>) -> Result<(), BindError> {
        let Some(st) = self.st.as_mut() else { return Err(BindError::UnknownKernel(KernelHandle(0))) };
        let k = st.ops.get_mut(&op).ok_or(BindError::NotBound(op.0))?;
        let total = k.left.len();
        if blocks.is_empty() || blocks.end > total || k.left != BlockRanges::full(total) {
            return Err(BindError::Shape {
                kernel: k.kernel.name.clone(),
                what: format!("blocks {blocks:?} of a grid of {total} (or after it started)"),
            });
        }
        k.left = BlockRanges::new();
        k.left.insert(blocks.clone());
        k.first = blocks.start;
        Ok(())
    }

    /// [`ClientDevice::bind`] for a kernel that follows kernel operation
    /// `after` on its stream (the operation right before it there): its
    /// workers may be queued on the GPU behind `after`'s (queue ahead:
    /// docs/daemon-cuda.md, and the module `client/device/ahead.rs`).
    ///
    /// # Safety
    /// As for [`ClientDevice::bind`].
    pub unsafe fn bind_after(&mut self, op: OpId, work: ClientWork, after: Option<OpId>) -> Result<(), BindError> {
        // SAFETY: the caller's guarantee, passed on.
        unsafe { self.bind(op, work)? };
        if let Some(a) = after {
            self.follow(a, op);
        }
        Ok(())
    }

    /// Chooses per pair of co-running kernels between co-locating them and
    /// SMs of their own by measuring both (the default of a co-locating
    /// device; `client/device/corun.rs` says why and how), or always
    /// co-locates. No effect on a device opened without co-location.
    pub fn set_choose_placement(&mut self, on: bool) {
        self.chooser = match (on && self.co_locate, self.chooser.take()) {
            (true, Some(c)) => Some(c),
            (true, None) => Some(CoRunChooser::default()),
            (false, _) => None,
        };
    }

    /// When a grow cuts a launch's workers where they are and starts fresh
    /// ones over all its SMs at once ([`Refill`]; `client/device/refill.rs`
    /// says why and how): where it cannot go on in place (the default),
    /// also whenever it gives back SMs workers had left, or never (a drain
    /// and a restart instead).
    pub fn set_refill(&mut self, mode: Refill) {
        self.refill = mode;
    }

    /// Leaves priority to the hardware where a launch has no peer: a launch
    /// alone at its priority (no launch of its priority running or queued
    /// beside it) runs as the client's kernel itself, its whole grid, on its
    /// priority's stream, if the module was compiled with its native build
    /// (`module::add_native`), unless it is short (not timed yet, one wave,
    /// or 20 µs at most) and launches of another priority run beside it as
    /// workers only (`hw_native`); the hardware gives a higher-priority stream's
    /// blocks the first slots that free anywhere, as MPS and two streams of
    /// one process do. Such a launch cannot retreat: a retreat of it releases
    /// its SMs at once (the next launch there takes slots as its blocks end)
    /// and it runs all its blocks. Its end is read from host memory, as a
    /// worker launch's is, and the next kernel of its stream is queued
    /// natively behind it by the launcher thread. Peers of one priority still
    /// run as workers, co-located or on SMs of their own. Off by default here;
    /// gpumuxd turns it on under the PPQ policies (`cuda:N,hw-priority`,
    /// `,no-hw-priority`). docs/daemon-cuda.md, "Hardware priority", says why
    /// and what it measured.
    pub fn set_hw_priority(&mut self, on: bool) {
        self.hw_priority = on;
    }

    /// Whether launches alone at their priority run natively
    /// ([`ClientDevice::set_hw_priority`]), and how many did so far.
    pub fn hw_priority(&self) -> (bool, u64) {
        (self.hw_priority, self.native_launches)
    }

    /// Refills so far: launches cut to fill SMs given back, and of those the
    /// ones that started fresh workers ([`ClientDevice::set_refill`]).
    pub fn refills(&self) -> (u64, u64) {
        self.refills
    }

    /// What the co-run chooser did so far (zeros when it is off).
    pub fn corun_counts(&self) -> CoRunCounts {
        self.chooser.as_ref().map(CoRunChooser::counts).unwrap_or_default()
    }

    /// Queues the next kernel of a stream on the GPU behind the one running
    /// (the default; `client/device/ahead.rs` says why and how), or not.
    pub fn set_queue_ahead(&mut self, on: bool) {
        self.queue_ahead = on;
    }

    /// Makes the CUDA calls of workers queued ahead on a thread of their own
    /// (the default; `runtime::launcher` says why), or in the command that
    /// queues them, as the device does when the thread would not start (for
    /// the tests of that path). Turning it off waits for the calls posted.
    pub fn set_launch_thread(&mut self, on: bool) {
        let Some(st) = self.st.as_mut() else { return };
        if !on {
            // Dropping it makes every posted call first; its sums stay counted.
            if let Some(l) = st.launcher.take() {
                l.drain();
                self.clock.made(l.made());
            }
        } else if st.launcher.is_none() {
            st.launcher = start_launcher();
        }
    }

    /// Whether workers queued ahead are launched by the launcher thread.
    pub fn launch_thread(&self) -> bool {
        self.st.as_ref().is_some_and(|st| st.launcher.is_some())
    }

    /// Forgets an operation that completed or was dropped (a launched kernel
    /// is forgotten once its launch ends).
    pub fn unbind(&mut self, op: OpId) {
        self.refill_ahead = true;
        if let Err(e) = self.drop_ahead(op) {
            tracing::warn!("CUDA device: cancelling the queued workers of {op}: {e}");
        }
        let Some(st) = self.st.as_mut() else { return };
        st.copy_ops.remove(&op);
        if st.launches.values().any(|l| l.op == op) || st.orphans.iter().any(|o| o.0 == op) {
            if let Some(k) = st.ops.get_mut(&op) {
                k.unbound = true;
            }
        } else {
            st.retire(op);
        }
    }

    /// [`Device::submit`] of a launch command the daemon answered itself
    /// from its kernel's end seen ahead ([`ClientDevice::take_ends_ahead`]):
    /// carried out as any other (the queued kernel adopted, the launch ended
    /// at the next poll, every block done), but its end reports no SM
    /// released (the engine freed them with the end it was given).
    pub fn submit_answered(&mut self, now: Nanos, command: Command) -> Result<(), DeviceError> {
        if let Command::Launch { launch, .. } = &command {
            self.answered.push(*launch);
        }
        self.submit(now, command)
    }

    /// Operations on the device now (running launches, copies in flight):
    /// the suspects when the context is lost.
    pub fn in_flight(&self) -> Vec<OpId> {
        let Some(st) = self.st.as_ref() else { return Vec::new() };
        let mut ops: Vec<OpId> =
            st.launches.values().filter(|l| !l.segs.is_empty() || !l.leaving.is_empty()).map(|l| l.op).collect();
        ops.extend(st.copies.iter().flatten().map(|c| c.op));
        ops.extend(st.ahead.keys().chain(st.orphans.iter().map(|o| &o.0)));
        ops.sort();
        ops.dedup();
        ops
    }

    /// Whether anything is on the device (the daemon polls while so).
    /// Kernels queued ahead do not count: the engine's launch command for
    /// theirs follows the end of the launch before them in the same turn, and
    /// counting them cost the daemon's launch rate (1-2 clients 12-25% in run
    /// 188, docs/history/benchmarks.md), polls the device process answered instead of
    /// launching.
    pub fn busy(&self) -> bool {
        self.st.as_ref().is_some_and(|st| {
            st.launches.values().any(|l| !l.segs.is_empty() || !l.leaving.is_empty() || l.done_ahead)
                || st.copies.iter().any(|q| !q.is_empty())
                || !st.orphans.is_empty()
        })
    }

    /// After a lost context: drops every handle of the old context (launches,
    /// copies, streams, events, modules, kernels, bound operations,
    /// allocations), destroys it, creates a fresh one and registers the host
    /// ranges again. Kernel handles are never reused: old ones are refused.
    pub fn rebuild(&mut self) -> Result<(), CudaError> {
        // Moves under way end first (failing, on a lost context), so that
        // every host copy is back on the books before the mover goes.
        self.collect_moves(true);
        // Handles first, context second: a stale handle must not outlive its
        // context (the driver may give its value to a new object).
        self.st = None;
        self.out.clear();
        // Pinned in the old context; a fresh one is made when needed.
        self.spare_copy = None;
        // Host copies of the pinned pool were pinned in the old context too.
        self.forget_pins();
        self.answered.clear();
        self.ctx.recreate().map_err(|e| match ContextLost::of(&e) {
            // Seen on an H100 (driver 580): after an illegal address, a new
            // context in the same process fails with the same error. The
            // driver poisons the process, not only the context.
            Some(lost) => CudaError::Invalid(format!(
                "a new context could not be created ({lost}): the CUDA driver keeps a fault's error for the \
                 whole process, which must be restarted to use the GPU again"
            )),
            None => e,
        })?;
        self.st = Some(InContext::new(&self.ctx, self.chunk)?);
        for &(ptr, bytes) in &self.host {
            super::memory::register(ptr as *mut u8, bytes)?;
        }
        Ok(())
    }

    /// Operations whose launch the driver refused for a reason of their own
    /// since the last call, with the reason: each ended having run nothing
    /// (its blocks reported done), and its client must be told.
    pub fn take_failed(&mut self) -> Vec<(OpId, String)> {
        std::mem::take(&mut self.failed)
    }

    /// A launch whose workers did not start, for a reason of its own: an
    /// error that is not a lost context (`cuLaunchKernel` refusing a shape or
    /// the resources it asks for), with no worker of it running. Its
    /// operation fails for its client ([`ClientDevice::take_failed`]) and the
    /// launch ends at once with nothing left to run, so the device, the
    /// daemon and every other client go on (issue 36, case 0: such an error
    /// stopped the daemon). Anything else is the device's failure, `e`.
    fn fail_unstarted(&mut self, launch: LaunchId, op: OpId, e: DeviceError) -> Result<(), DeviceError> {
        if ContextLost::find(&e).is_some() {
            return Err(e);
        }
        let Some(st) = self.st.as_mut() else { return Err(e) };
        if st.launches.get(&launch).is_none_or(|l| !l.segs.is_empty() || !l.leaving.is_empty()) {
            return Err(e);
        }
        if let Some(k) = st.ops.get_mut(&op) {
            k.left = BlockRanges::new();
        }
        let why = crate::error::Chain(&e).to_string();
        tracing::warn!("CUDA device: {op} failed, its launch {launch} ran nothing: {why}");
        self.failed.push((op, why));
        Ok(())
    }

    /// Starts workers for the launch's blocks still to run, on its SMs;
    /// then queues its stream's next kernel behind them where it can.
    fn start_workers(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        let (chunk, now, sm_count) = (self.chunk, self.now(), self.info.num_sms as u32);
        let (co_locate, hw_priority) = (self.co_locate, self.hw_priority);
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let Some(mut live) = st.launches.remove(&lid) else {
            return Err(ProtocolError::UnknownLaunch { launch: lid, by: Message::Launch }.into());
        };
        // Hardware priority: a launch alone at its priority runs natively
        // (`hw_native` says when a short one does not).
        let neighbours = st.neighbours(live.priority, None, Some(live.chain));
        let (native_anywhere, native_if_long) = neighbours.hw_native(hw_priority);
        // Beside peers, natively if known short (`peers`).
        let short = || st.ops.get(&live.op).is_some_and(|o| op_is_short(o, sm_count));
        let beside_peers = !native_if_long && neighbours.native_beside_peers(hw_priority, short());
        let native_anywhere = native_anywhere || beside_peers;
        self.peer_counts.started += beside_peers as u64;
        // (Alone at its priority, a launch is placed on its own SMs: no peer
        // to share them with. A peer's short kernel run natively is placed
        // there too, and its run is no co-run sample: its grid goes wherever
        // slots free, so the chooser would learn nothing of the pair.)
        let (place, corun) = if beside_peers {
            (Placement { mask: live.sms, share: None }, None)
        } else {
            place(co_locate, self.chooser.as_mut(), sm_count, st, &live)
        };
        live.corun = corun;
        let r = match st.ops.get(&live.op) {
            None => Err(CudaError::Invalid(format!("no work bound to {}", live.op))),
            Some(op) => {
                let ranges = still_to_run(&live.requested, &op.left);
                // A native start publishes its end in host memory and
                // records its end event only if a poll needs it (a fault):
                // the launch command makes two driver calls, not three.
                let (never_native, publish_end, lazy_end) = (false, true, true);
                let how = SegPlan {
                    place,
                    never_native,
                    native_anywhere,
                    native_if_long,
                    chunk,
                    sm_count,
                    publish_end,
                    lazy_end,
                };
                let (ops, spare, segs) = (&mut st.ops, &mut st.spare, &mut live.segs);
                start_segs(ops, spare, live.op, &ranges, &live.stream, how, lid, segs, None, &mut self.clock)
            }
        };
        self.native_launches += live.segs.iter().filter(|w| w.last_plan() == Some(Plan::Native)).count() as u64;
        live.mask = live.sms;
        live.place = place;
        live.note(if live.history.is_empty() { "started" } else { "restarted" });
        live.gone = SmSet::EMPTY;
        live.vacated = SmSet::EMPTY;
        live.stopping = false;
        live.started = now;
        st.launches.insert(lid, live);
        r.map_err(failed_with(|| format!("starting the workers of launch {lid}")))?;
        let t = self.clock.start();
        let queued = self.try_queue_ahead(lid);
        self.clock.part(clock::Part::QueueAhead, t);
        queued
    }

    /// Ends a launch: SMs released, remaining blocks handed back.
    fn end_launch(&mut self, lid: LaunchId) {
        let Some(st) = self.st.as_mut() else { return };
        let Some(mut live) = st.launches.remove(&lid) else { return };
        let op = st.ops.get_mut(&live.op);
        let remaining =
            op.as_ref().map(|o| shifted(still_to_run(&live.requested, &o.left), o.first, false)).unwrap_or_default();
        // A launch the daemon answered: the engine freed its SMs with the
        // end it was given; only the end goes out, for the daemon's side to
        // check and drop (one event instead of one per SM).
        let answered = self.answered.iter().position(|&l| l == lid).map(|i| self.answered.swap_remove(i));
        if answered.is_none() {
            for sm in live.releasing.iter() {
                self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Retreated });
            }
            for sm in live.sms.difference(&live.releasing).iter() {
                self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Exhausted });
            }
        }
        let completed = live.requested.len().saturating_sub(remaining.len());
        self.stats.blocks_completed += completed;
        if let (Some(tag), Some(chooser)) = (live.corun, self.chooser.as_mut()) {
            chooser.ended(tag.kernel, tag.peer, tag.mode, completed, Instant::now());
        }
        self.out.push(Event::LaunchEnded { launch: lid, remaining, saved: Vec::new(), completed });
        if let Some(o) = op {
            o.pool.append(&mut live.segs);
            o.pool.append(&mut live.leaving);
            if o.unbound {
                st.retire(live.op);
            }
        }
        for s in live.leaving_streams.drain(..) {
            st.return_stream(s);
        }
        // Workers queued behind this launch's keep its stream (their order on it).
        if let Some(stream) = ahead::take_stream(st, lid, live.stream) {
            st.return_stream(stream);
        }
    }

    /// Handles launches whose workers have all left.
    fn poll_launches(&mut self) -> Result<(), DeviceError> {
        self.poll_launches_of(None)
    }

    /// [`ClientDevice::poll_launches`], of launch `only` alone if given (a
    /// launch whose end the engine already has: ended between commands, it
    /// can take no command the engine sends after; any other launch must
    /// end at a poll, where the engine learns it before its next commands).
    pub(super) fn poll_launches_of(&mut self, only: Option<LaunchId>) -> Result<(), DeviceError> {
        let now = self.now();
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        // A list kept between polls (a vector allocated per poll that ended a
        // launch before, and per answered launch command).
        let mut ended = std::mem::take(&mut self.ended);
        ended.clear();
        // One launch is looked up, not found in a walk of all (an answered
        // launch command's look at the launch before it).
        let one = only.and_then(|o| st.launches.get_key_value(&o));
        let all = only.is_none().then(|| st.launches.iter()).into_iter().flatten();
        for (&lid, live) in one.into_iter().chain(all) {
            if live.cut.is_none()
                && all_left(&live.segs).map_err(failed_with(|| format!("polling launch {lid}")))?
                && all_left(&live.leaving).map_err(failed_with(|| format!("polling launch {lid}'s cut workers")))?
            {
                ended.push(lid);
            }
        }
        ended.sort();
        for &lid in &ended {
            let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
            let Some(mut live) = st.launches.remove(&lid) else { continue };
            let Some(op) = st.ops.get_mut(&live.op) else {
                st.launches.insert(lid, live);
                self.end_launch(lid);
                continue;
            };
            let mut outcomes = Vec::new();
            // A refill's cut workers first: their blocks end where the fresh ones' begin.
            live.segs.splice(0..0, std::mem::take(&mut live.leaving));
            for s in live.leaving_streams.drain(..) {
                // `InContext::return_stream`, which `op`'s borrow of `st` rules out here.
                st.streams.entry(s.priority).or_default().push(s);
            }
            for w in live.segs.iter_mut() {
                let from = w.next as u64;
                let t = Instant::now();
                let o = w.finish().map_err(failed_with(|| format!("reading where launch {lid} stopped")))?;
                log_if_slow(t, || format!("reading where launch {lid} ended (event sync, control record copy)"));
                op.left.remove(from..o.next as u64);
                outcomes.push((from, o, w.last_plan()));
            }
            let work_left = !still_to_run(&live.requested, &op.left).is_empty();
            op.pool.append(&mut live.segs);
            self.stats.sm_busy_ns += now.saturating_sub(live.started) as u128 * live.mask.len() as u128;
            // No worker found room on the launch's SMs: they were full of
            // workers queued ahead for another stream, which the engine does
            // not see and which were asked to leave when the engine gave the
            // SMs to this launch (`ahead`); the grid went through other SMs'
            // free slots, each worker leaving at once, before those left. No
            // block ran: start again (they leave within a chunk).
            let nobody_ran = outcomes.iter().all(|(from, o, _)| o.workers == 0 && o.next as u64 == *from);
            // (Never with workers queued behind it: they would have run
            // first. `ahead::try_queue_ahead` queues none where this can
            // happen; if it did, the check below stops the device.)
            let queued_behind = ahead::queued_behind(&st.behind, &st.ahead, lid);
            if work_left && !live.stopping && live.vacated.is_empty() && nobody_ran && !queued_behind {
                live.note("restarted: no worker found room on its SMs");
                self.ahead_counts.unplaced += 1;
                live.stopping = true;
            }
            // Workers left with blocks to run only when asked: a retreat, or
            // per-SM retreats that happened to cover every SM a worker ran on.
            if work_left && !live.stopping && live.vacated.is_empty() {
                let why = CudaError::Check(format!(
                    "its workers stopped with work left though no retreat was asked (operation {}, blocks {:?} \
                     asked, {:?} left, SMs {:?}, placed on {:?}; its worker launches (first block, outcome, \
                     plan): {:?}; what happened to it: {})",
                    live.op,
                    live.requested,
                    still_to_run(&live.requested, &op.left),
                    live.sms,
                    live.place,
                    outcomes,
                    live.history.join(", ")
                ));
                return Err(DeviceError::backend(format!("launch {lid}"), why));
            }
            if work_left && !live.sms.is_empty() {
                for sm in live.releasing.iter() {
                    self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Retreated });
                }
                live.releasing = SmSet::EMPTY;
                st.launches.insert(lid, live);
                self.start_workers(lid)?;
            } else {
                st.launches.insert(lid, live);
                self.end_launch(lid);
            }
        }
        self.ended = ended;
        Ok(())
    }

    fn poll_copies(&mut self) -> Result<(), DeviceError> {
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        for q in st.copies.iter_mut() {
            while let Some(c) = q.front() {
                if !c.done.done().map_err(failed_with(|| format!("polling copy {}", c.copy)))? {
                    break;
                }
                self.out.push(Event::CopyDone { copy: c.copy });
                q.pop_front();
            }
        }
        Ok(())
    }

    fn retreat_workers(&mut self, lid: LaunchId) -> Result<(), DeviceError> {
        let st = self.state().map_err(failed("making the context current"))?;
        let Some(live) = st.launches.get_mut(&lid) else { return Ok(()) };
        if live.stopping {
            return Ok(());
        }
        live.stopping = true;
        for w in &live.segs {
            w.retreat(&st.ctl).map_err(failed_with(|| format!("asking launch {lid} to retreat")))?;
        }
        Ok(())
    }

    /// Per-SM retreat of `gone` (SMs the launch no longer holds). The SMs are
    /// announced released **at once**: the workers there leave after their
    /// current chunk, and whatever the engine starts there next (on a stream
    /// of its own priority) gets their places as they leave, the way the
    /// hardware slips a high-priority kernel's blocks in as blocks retire.
    /// The drain overlaps the next launch instead of preceding it. Workers on
    /// the launch's other SMs go on (`WorkerLaunch::leave`); only when none
    /// is left does the launch drain and restart, or end, as after a retreat.
    fn leave_sms(&mut self, lid: LaunchId, gone: SmSet) -> Result<(), DeviceError> {
        let st = state_of(&self.ctx, &mut self.st).map_err(failed("making the context current"))?;
        let Some(live) = st.launches.get_mut(&lid) else { return Ok(()) };
        for sm in gone.iter() {
            self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Retreated });
        }
        if live.stopping {
            // Its workers are leaving already; the restart runs on what it holds.
            return Ok(());
        }
        let here = gone.intersection(&live.mask);
        live.gone = live.gone.union(&here);
        live.vacated = live.vacated.union(&here);
        if live.mask.difference(&live.vacated).is_empty() {
            return self.retreat_workers(lid);
        }
        let mask = sm_mask(live.gone);
        for w in live.segs.iter_mut() {
            w.leave(&st.ctl, &mask)
                .map_err(failed_with(|| format!("asking launch {lid} to leave {} SMs", gone.len())))?;
        }
        Ok(())
    }

    /// A grow that gives back SMs the current workers left (per-SM retreat):
    /// their bits are cleared (workers not yet started may enter again), and
    /// the launch goes on where its workers are rather than drain and restart
    /// on the larger set, as long as they still cover 3/4 of what it holds
    /// (a restart costs the whole launch a drain; the SMs stay idle only
    /// until the launch ends). False: the caller drains and restarts.
    fn regrow_in_place(&mut self, lid: LaunchId, add: SmSet) -> Result<bool, DeviceError> {
        let st = self.state().map_err(failed("making the context current"))?;
        let Some(live) = st.launches.get_mut(&lid) else { return Ok(true) };
        if live.stopping || !add.difference(&live.mask).is_empty() {
            return Ok(false);
        }
        live.gone = live.gone.difference(&add);
        let mask = sm_mask(live.gone);
        for w in live.segs.iter_mut() {
            w.leave(&st.ctl, &mask).map_err(failed_with(|| format!("giving launch {lid} {} SMs back", add.len())))?;
        }
        let working = live.mask.difference(&live.vacated).len();
        Ok(working * 4 >= live.sms.len() * 3)
    }

    /// A grow of launch `lid` that runs natively (its kernel's own grid, or
    /// its kernel seen ended ahead): the SMs join its account and nothing
    /// else changes (`true`). A native grid already takes free slots on
    /// every SM and can neither be refilled nor restarted; a retreat asked
    /// for a refill would only end its stream's run queued ahead, which
    /// peers' short kernels grown by the engine between their launches
    /// would lose at every grow ([`peers`]). `false`: workers, grown as usual.
    fn grow_native(&mut self, lid: LaunchId, sms: SmSet) -> bool {
        let Some(live) = self.st.as_mut().and_then(|st| st.launches.get_mut(&lid)) else { return false };
        let native = live.done_ahead
            || (!live.segs.is_empty() && live.segs.iter().all(|w| w.running_native()) && live.leaving.is_empty());
        if !native || live.stopping {
            return false;
        }
        live.sms = live.sms.union(&sms);
        live.note("grown natively: its account only");
        true
    }

    /// Queues copy `copy`, the work bound to `op`, on its copy stream.
    fn copy(&mut self, copy: CopyId, op: OpId) -> Result<(), CudaError> {
        let st = state_of(&self.ctx, &mut self.st)?;
        let work = st.copy_ops.get(&op).cloned().ok_or_else(|| CudaError::Invalid(format!("no copy bound to {op}")))?;
        let lane =
            work.copy_lane().ok_or_else(|| CudaError::Invalid(format!("{op} is a launch, not a copy")))? as usize;
        let bytes = work.copy_bytes();
        let n = usize::try_from(bytes).map_err(|_| CudaError::Invalid(format!("a copy of {bytes} bytes")))?;
        let s = &st.copy_streams[lane];
        // SAFETY: the binder guaranteed (ClientDevice::bind) that the device
        // and host ranges are live and registered until the operation is unbound.
        unsafe {
            match work {
                ClientWork::ToDevice { dst, src, .. } => s.copy_to_device_async(dst, src.0, n)?,
                ClientWork::ToHost { src, dst, .. } => s.copy_to_host_async(dst.0, src, n)?,
                ClientWork::DeviceCopy { src, dst, .. } => s.copy_on_device_async(dst, src, n)?,
                ClientWork::Memset { dst, value, .. } => s.memset_async(dst, value, n)?,
                ClientWork::Fill { dst, value, width, .. } => s.fill_async(dst, value, width, n)?,
                ClientWork::Copy2D { src, dst, width, height } => {
                    let size =
                        |v: u64| usize::try_from(v).map_err(|_| CudaError::Invalid(format!("a 2-D copy of {v}")));
                    s.copy_2d_async(pitched(src, size)?, pitched(dst, size)?, size(width)?, size(height)?)?
                }
                ClientWork::Kernel { .. } => {}
            }
        }
        let done = CuEvent::new_sync_only()?;
        done.record(s)?;
        st.copies[lane].push_back(CopyInFlight { copy, op, done });
        self.stats.bytes_copied += bytes;
        Ok(())
    }

    /// A launch stream for engine priority `priority` (higher is more
    /// urgent): CUDA priority `least - priority`, clamped.
    fn stream(&mut self, priority: i32) -> Result<Stream, CudaError> {
        let range @ (least, greatest) = self.ctx.priority_range;
        let p = least.saturating_sub(priority).clamp(greatest.min(least), greatest.max(least));
        match self.state()?.streams.get_mut(&p).and_then(Vec::pop) {
            Some(s) => Ok(s),
            None => Stream::in_range(range, p),
        }
    }
}

/// A pitched copy's side as the runtime takes it (`size` converts a
/// count, failing on a 32-bit host for one over `usize`).
fn pitched(
    side: super::work::PitchedSide,
    size: impl Fn(u64) -> Result<usize, CudaError>,
) -> Result<crate::runtime::Pitched2D, CudaError> {
    Ok(match side {
        super::work::PitchedSide::Device { addr, pitch } => {
            crate::runtime::Pitched2D::Device { addr, pitch: size(pitch)? }
        }
        super::work::PitchedSide::Host { ptr, pitch } => {
            crate::runtime::Pitched2D::Host { ptr: ptr.0, pitch: size(pitch)? }
        }
    })
}

impl Drop for ClientDevice {
    /// Logs what queue ahead did (info), then stops every launch (retreat,
    /// then wait) and waits for the copies, so no worker reads memory that
    /// is being freed. Errors are ignored: the context is destroyed right after.
    fn drop(&mut self) {
        let c = self.ahead_counts;
        if c.queued > 0 {
            tracing::info!(
                "CUDA device: queue ahead: {} kernels queued behind the one before ({} natively behind a kernel \
                 itself queued, {} seen ended before their launch command), {} adopted as queued, \
                 {} retired with no launch, {} restarted elsewhere, {} cancelled; {} launches started again because no worker found room; \
                 a run's next kernel held back {} times for lack of a launch record, {} by the kernels ended and \
                 not launched yet, {} by the run's bounds; between polls {} looks, {} kernels seen ended, {} queued",
                c.queued,
                c.deep,
                c.ended_ahead,
                c.adopted,
                c.retired,
                c.restarted,
                c.cancelled,
                c.unplaced,
                c.held_no_record,
                c.held_ended_waiting,
                c.held_deep,
                c.looks_between,
                c.ended_between,
                c.queued_between
            );
        }
        if let Some(s) = self.peer_counts.summary() {
            tracing::info!("CUDA device: {s}");
        }
        if let Some(words) = self.lead.words() {
            tracing::info!("CUDA device: the GPU's lead over the engine: {words}");
        }
        if let Some(s) = self.poll_clock.summary() {
            tracing::info!("CUDA device: {s}");
        }
        if let Some(s) = self.poll_clock.ends_summary() {
            tracing::info!("CUDA device: {s}");
        }
        let launcher = self.st.as_ref().and_then(|st| st.launcher.as_ref()).map(Launcher::made).unwrap_or_default();
        if let Some(s) = self.clock.summary(launcher) {
            tracing::info!("CUDA device: {s}");
        }
        if self.refills.0 > 0 {
            tracing::info!(
                "CUDA device: refills: {} launches cut to fill SMs given back, {} started fresh workers (the others were done or retreating)",
                self.refills.0,
                self.refills.1
            );
        }
        if self.hw_priority {
            tracing::info!(
                "CUDA device: hardware priority: {} launches alone at their priority ran natively",
                self.native_launches
            );
        }
        let c = self.corun_counts();
        if c.probes > 0 {
            tracing::info!(
                "CUDA device: co-run placement: {} probes of a pair, {} chose SMs of their own, {} co-location",
                c.probes,
                c.chose_own_sms,
                c.probes - c.chose_own_sms
            );
        }
        if self.ctx.bind().is_err() {
            return;
        }
        if let Some(st) = self.st.as_mut() {
            // Queued workers first: they must not start blocks once the
            // launches before them have left.
            for a in st.ahead.values_mut().chain(st.orphans.iter_mut().map(|o| &mut o.1)) {
                a.stop(&st.ctl);
            }
            for live in st.launches.values_mut() {
                for w in live.segs.iter_mut().chain(live.leaving.iter_mut()) {
                    let _ = w.retreat(&st.ctl);
                    let _ = w.finish();
                }
            }
            for a in st.ahead.values_mut().chain(st.orphans.iter_mut().map(|o| &mut o.1)) {
                a.wait();
            }
            for s in &st.copy_streams {
                let _ = s.sync();
            }
        }
        self.st = None;
        for &(ptr, _) in &self.host {
            super::memory::unregister(ptr as *mut u8);
        }
    }
}

impl Device for ClientDevice {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, _now: Nanos, command: Command) -> Result<(), DeviceError> {
        if tracing::enabled!(tracing::Level::TRACE) {
            match &command {
                Command::Launch { launch, op, blocks, sms, .. } => {
                    tracing::trace!("CUDA device: launch {launch} of {op}: blocks {blocks:?} on {sms:?}")
                }
                Command::Grow { launch, sms } => tracing::trace!("CUDA device: grow {launch} by {sms:?}"),
                Command::Retreat { launch, sms, .. } => tracing::trace!("CUDA device: retreat {launch} from {sms:?}"),
                Command::Copy { .. } => {}
            }
        }
        match command {
            Command::Launch { launch, op, priority, blocks, restore, sms, .. } => {
                if !restore.is_empty() {
                    return Err(ProtocolError::CannotRestore { launch, blocks: restore.len() }.into());
                }
                if let Some(sm) = sms.iter().find(|s| s.0 >= self.info.num_sms) {
                    let (device, sms) = (self.info.name.clone(), self.info.num_sms as usize);
                    return Err(ProtocolError::NoSuchSm { sm, device, sms }.into());
                }
                // One clock read for the device's time and the command's
                // (`ClientDevice::now` is the time since `start`).
                let t = Instant::now();
                let now = t.saturating_duration_since(self.start).as_nanos() as Nanos;
                // Every launch command counts, adoptions of kernels queued
                // ahead and ends answered ahead too: they are its work.
                self.higher.started(priority, t);
                let began = t;
                self.clock.begin();
                let stream = self.stream(priority).map_err(failed_with(|| format!("a stream for launch {launch}")))?;
                let got_stream = t.elapsed();
                if got_stream > SLOW_STEP {
                    log_took(got_stream, || format!("a stream for launch {launch}"));
                }
                let st = self.state().map_err(failed("making the context current"))?;
                if st.launches.contains_key(&launch) {
                    return Err(ProtocolError::LaunchedTwice { launch }.into());
                }
                if !st.ops.contains_key(&op) {
                    let why = CudaError::Invalid(format!("no kernel is bound to operation {op}"));
                    return Err(DeviceError::backend(format!("launch {launch}"), why));
                }
                // The engine's blocks are the operation's range's (`run_range`).
                let first = st.ops.get(&op).map_or(0, |k| k.first);
                let live = Live {
                    op,
                    requested: shifted(blocks, first, true),
                    sms,
                    releasing: SmSet::EMPTY,
                    stream,
                    segs: Vec::new(),
                    leaving: Vec::new(),
                    leaving_streams: Vec::new(),
                    cut: None,
                    stopping: false,
                    mask: sms,
                    gone: SmSet::EMPTY,
                    vacated: SmSet::EMPTY,
                    started: now,
                    priority,
                    place: Placement { mask: sms, share: None },
                    corun: None,
                    history: History::default(),
                    chain: launch.0,
                    done_ahead: false,
                };
                // Another kernel's workers queued on these SMs leave them.
                let t = self.clock.start();
                self.cancel_ahead_on(sms, Some(op), priority)?;
                self.clock.part(clock::Part::Cancel, t);
                let st = self.state().map_err(failed("making the context current"))?;
                if st.ahead.contains_key(&op) {
                    let t = self.clock.start();
                    self.adopt(launch, live)?;
                    self.clock.part(clock::Part::Adopt, t);
                } else {
                    st.launches.insert(launch, live);
                    if !sms.is_empty() {
                        let t = self.clock.start();
                        if let Err(e) = self.start_workers(launch) {
                            self.fail_unstarted(launch, op, e)?;
                        }
                        self.clock.part(clock::Part::Start, t);
                        if let Some(l) = self.st.as_ref().and_then(|st| st.launches.get(&launch)) {
                            for w in &l.segs {
                                self.clock.calls(w.last_start_calls);
                            }
                        }
                    }
                }
                self.clock.command(began.elapsed(), got_stream);
                // Nothing to run on, or nothing left to run: it ends with what it
                // has (one whose kernel was seen ended ahead ends at the next poll).
                let ends_now = |l: &Live| l.segs.is_empty() && l.leaving.is_empty() && !l.done_ahead;
                if self.st.as_ref().and_then(|st| st.launches.get(&launch)).is_some_and(ends_now) {
                    self.end_launch(launch);
                }
            }
            Command::Grow { launch, sms } => {
                let priority = self.st.as_ref().and_then(|st| st.launches.get(&launch)).map(|l| l.priority);
                if self.grow_native(launch, sms) {
                    return Ok(());
                }
                // Stream order: what is queued behind it cannot follow a
                // restart, nor stay on SMs the engine gives out.
                self.cancel_ahead_behind(launch)?;
                if let Some(priority) = priority {
                    self.cancel_ahead_on(sms, None, priority)?;
                }
                let st = self.state().map_err(failed("making the context current"))?;
                let Some(live) = st.launches.get_mut(&launch) else {
                    return Err(ProtocolError::UnknownLaunch { launch, by: Message::Grow }.into());
                };
                let add = sms.difference(&live.sms);
                if add.is_empty() {
                    return Ok(());
                }
                live.sms = live.sms.union(&add);
                live.note("grow");
                if live.cut.is_some() {
                    // The refill under way starts its workers on every SM held then.
                    return Ok(());
                }
                // In place while the workers still cover 3/4 of its SMs (those
                // that had not left yet go on there); else refilled, or, if it
                // cannot be, drained and restarted. `Refill::Always` refills
                // whenever SMs some workers had left come back.
                let vacated = !add.intersection(&live.vacated).is_empty();
                let in_place = self.regrow_in_place(launch, add)?;
                let refill = !in_place || (vacated && self.refill == Refill::Always);
                if refill && !self.ask_refill(launch)? && !in_place {
                    self.retreat_workers(launch)?;
                }
            }
            Command::Retreat { launch, sms, mechanism: _ } => {
                // Before the launch's workers may leave with blocks left.
                self.cancel_ahead_behind(launch)?;
                let st = self.state().map_err(failed("making the context current"))?;
                let Some(live) = st.launches.get_mut(&launch) else {
                    return Err(ProtocolError::UnknownLaunch { launch, by: Message::Retreat }.into());
                };
                let gone = sms.intersection(&live.sms);
                if gone.is_empty() {
                    return Ok(());
                }
                live.sms = live.sms.difference(&gone);
                live.note("retreat");
                // Co-located workers too leave only the SMs taken: the rest go
                // on at their share (draining them all and restarting on a
                // smaller share cost the launch every block in flight).
                self.leave_sms(launch, gone)?;
            }
            Command::Copy { copy, op, bytes, .. } => {
                self.copy(copy, op).map_err(failed_with(|| format!("copy {copy} of {bytes} bytes")))?;
            }
        }
        Ok(())
    }

    /// Polls once when `until` is now or past (the daemon's use); otherwise
    /// spins (sleeping while nothing runs) until something happens or `until`.
    fn advance(&mut self, until: Option<Nanos>, events: &mut Vec<Event>) -> Result<Nanos, DeviceError> {
        loop {
            if self.out.is_empty() {
                self.poll_clock.begin();
                self.poll_cuts()?;
                self.poll_clock.part(0);
                self.mark_implied_ends()?;
                self.poll_clock.part(1);
                self.poll_launches()?;
                self.poll_clock.part(2);
                // Runs go on as their kernels end (and give their launch
                // records back), not only at launch commands.
                let ended = self.poll_ahead()?;
                self.poll_clock.part(3);
                if ended || std::mem::take(&mut self.refill_ahead) {
                    self.deepen_tails()?;
                }
                self.note_lead();
                self.poll_clock.part(4);
                if ended {
                    self.poll_clock.saw_ends();
                }
                self.poll_copies()?;
                self.poll_clock.part(5);
                self.poll_orphans()?;
                self.poll_clock.part(6);
            }
            let now = self.now();
            if !self.out.is_empty() {
                self.stats.events += self.out.len() as u64;
                events.append(&mut self.out);
                return Ok(now);
            }
            if until.is_some_and(|u| now >= u) {
                return Ok(now);
            }
            if !self.busy() {
                match until {
                    None => return Err(DeviceError::Stalled { now }),
                    Some(u) if u - now > 200_000 => std::thread::sleep(Duration::from_nanos(u - now - 100_000)),
                    Some(_) => {}
                }
            }
            std::hint::spin_loop();
        }
    }

    fn stats(&self) -> DeviceStats {
        self.stats.clone()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parameter_sizes_match_as_the_list_of_them_would() {
        let mut below = super::ahead::test_support::xorshift(7);
        let mut mismatches = 0;
        for case in 0..2000 {
            let params: Vec<Vec<u8>> = (0..below(4)).map(|_| vec![0u8; below(3) as usize * 4]).collect();
            let want: Vec<u32> = (0..below(4)).map(|_| below(3) as u32 * 4).collect();
            let got: Vec<u32> = params.iter().map(|p| p.len() as u32).collect();
            let expected = if got == want { Ok(()) } else { Err(got) };
            mismatches += expected.is_err() as u32;
            assert_eq!(super::param_sizes_match(&params, &want), expected, "case {case}");
        }
        assert!(mismatches > 100 && mismatches < 2000, "{mismatches} mismatches: the cases saw too little");
    }

    use super::{
        co_location_spread, placement_of, share_of_each_sm, shifted, still_to_run, workers_on, History, HISTORY,
    };
    use gpumux_engine::ranges::BlockRanges;

    /// A split launch's part (`run_range`): the engine's blocks 0..k are the
    /// grid's first..first+k, and what is left goes back in the engine's index.
    #[test]
    fn a_launchs_history_keeps_its_last_events_oldest_first_as_the_list_did() {
        const WORDS: [&str; 5] = ["started", "grow", "retreat", "restarted", "adopted"];
        for n in 0..40usize {
            let (mut ring, mut list) = (History::default(), Vec::new());
            for i in 0..n {
                let what = WORDS[(i * 7 + n) % WORDS.len()];
                ring.push(what);
                if list.len() == HISTORY {
                    list.remove(0);
                }
                list.push(what);
            }
            assert_eq!(ring.is_empty(), list.is_empty(), "{n} events");
            assert_eq!(ring.join(", "), list.join(", "), "{n} events");
        }
    }

    #[test]
    fn a_range_operations_blocks_move_between_the_engines_index_and_the_grids() {
        let mut engine = BlockRanges::new();
        engine.insert(0..10);
        engine.insert(20..25);
        let grid = shifted(engine.clone(), 128, true);
        assert_eq!(grid.ranges(), &[128..138, 148..153]);
        let mut left = BlockRanges::new();
        left.insert(128..256);
        left.remove(128..133);
        let remaining = shifted(still_to_run(&grid, &left), 128, false);
        assert_eq!(remaining.ranges(), &[5..10, 20..25]);
        assert_eq!(shifted(engine.clone(), 0, true), engine, "a whole grid is not moved");
    }

    #[test]
    fn whether_every_block_left_was_requested_is_what_the_set_of_those_still_to_run_says() {
        // Seeded sets of up to four ranges below 64 each (ahead's test xorshift).
        let mut below = super::ahead::test_support::xorshift(0x005e_ed35);
        let set = |below: &mut dyn FnMut(u64) -> u64| {
            let mut s = BlockRanges::new();
            let mut at = below(8);
            for _ in 0..below(5) {
                let len = 1 + below(12);
                s.insert(at..at + len);
                at += len + 1 + below(6);
            }
            s
        };
        let (mut subsets, mut others) = (0, 0);
        for case in 0..2_000 {
            let (requested, mut left) = (set(&mut below), set(&mut below));
            if case % 3 == 0 {
                // Often a subset: what is left of what was asked.
                left = still_to_run(&requested, &left);
            }
            let want = still_to_run(&requested, &left) == left;
            assert_eq!(super::all_requested(&requested, &left), want, "{requested:?} ⊇ {left:?}");
            if want {
                subsets += 1;
            } else {
                others += 1;
            }
        }
        assert!(subsets > 500 && others > 500, "both answers drawn: {subsets} and {others}");
    }
    use gpumux_engine::ids::SmId;
    use gpumux_engine::smset::SmSet;

    #[test]
    fn co_location_spreads_over_peers_sms_but_not_other_priorities() {
        let (low, urgent) = (SmSet::range(17, 132), SmSet::range(0, 17));
        // An urgent launch beside a low-priority one holding the rest: its own SMs only.
        assert_eq!(co_location_spread(132, 5, [(0, low)].into_iter()), urgent);
        // Two peers: each spreads over every SM.
        assert_eq!(co_location_spread(132, 0, [(0, SmSet::range(66, 132))].into_iter()), SmSet::range(0, 132));
        // A peer and an urgent launch: the peers share what the urgent one does not hold.
        let spread = co_location_spread(132, 0, [(0, SmSet::range(66, 132)), (5, urgent)].into_iter());
        assert_eq!(spread, SmSet::range(17, 132));
    }

    #[test]
    fn co_located_shares_split_an_sm_by_the_sms_held() {
        // H100, 8 workers of 256 threads per SM: an even split is 4 + 4.
        assert_eq!(share_of_each_sm(8, 66, 132), 4);
        assert_eq!(share_of_each_sm(8, 66, 132) * 2, 8);
        // Uneven: 3/4 of the SMs, 6 of 8.
        assert_eq!(share_of_each_sm(8, 99, 132), 6);
        // Three ways: 44 SMs each is 2.67 workers, rounded to 3 (a little
        // more than an SM holds in all; the hardware fits what it can).
        assert_eq!(share_of_each_sm(8, 44, 132), 3);
        // Never nothing: one SM of 132 still gets a worker per SM.
        assert_eq!(share_of_each_sm(8, 1, 132), 1);
        assert_eq!(share_of_each_sm(2, 132, 132), 2);
    }

    /// Issue 36's huge grid beside two small clients, as ppq-even splits an
    /// H200 (132 SMs): the grid (1024-thread blocks, 2 per SM) is given 130
    /// SMs, and the engine keeps SMs 130 and 131 for the small clients'
    /// one-block kernels (32 threads, 32 per SM), which it starts there.
    #[test]
    fn a_grid_co_located_beside_small_launches_leaves_the_sms_kept_for_them_free() {
        let all = SmSet::range(0, 132);
        let (grid_sms, kept) = (SmSet::range(0, 130), SmSet::range(130, 132));
        let (grid_w, small_w) = (2, 32);
        // Every SM is the spread (one priority); a peer runs.
        let grid = placement_of(true, grid_sms, all, grid_w);
        for sm in kept.iter() {
            assert_eq!(workers_on(grid, grid_w, sm), 0, "the grid's workers on kept SM {sm:?}: {grid:?}");
        }
        // Its own SMs at full occupancy: the 260 slots it is owed, exactly.
        let grid_slots: u32 = all.iter().map(|sm| workers_on(grid, grid_w, sm)).sum();
        assert_eq!(grid_slots, grid_sms.len() * grid_w);
        // A small launch given kept SM 131 beside it has a slot on both kept
        // SMs, and the grid's threads and its own fit there: it starts at once.
        let small = placement_of(true, SmSet::single(SmId(131)), all, small_w);
        for sm in kept.iter() {
            let small_here = workers_on(small, small_w, sm);
            assert!(small_here >= 1, "the small launch has no slot on kept SM {sm:?}: {small:?}");
            let threads = workers_on(grid, grid_w, sm) * 1024 + small_here * 32;
            assert!(threads <= 2048, "kept SM {sm:?} is asked for {threads} threads");
        }
        // On the grid's SMs the grid fills every slot, so the small one can
        // only start on the kept ones.
        assert!(grid_sms.iter().all(|sm| workers_on(grid, grid_w, sm) == grid_w));
    }

    #[test]
    fn a_share_short_of_the_whole_sm_still_co_locates_and_a_lone_launch_never_does() {
        let all = SmSet::range(0, 132);
        // Even split, 8 per SM: 4 of 8 on every SM (issue 14's co-runs, unchanged).
        let half = placement_of(true, SmSet::range(0, 66), all, 8);
        assert_eq!(half.mask, all);
        assert_eq!((0..132).map(|s| workers_on(half, 8, SmId(s))).collect::<Vec<_>>(), vec![4; 132]);
        // 3/4 of the SMs, 2 per SM: 1.5 rounds to 2, the whole SM: its own SMs.
        let most = placement_of(true, SmSet::range(0, 99), all, 2);
        assert_eq!((most.mask, most.share), (SmSet::range(0, 99), None));
        // 120 of 132 at 8 per SM: 7 of 8 on every SM, a slot left on each for a peer.
        let wide = placement_of(true, SmSet::range(0, 120), all, 8);
        assert_eq!(wide.mask, all);
        assert!((0..132).all(|s| workers_on(wide, 8, SmId(s)) == 7));
        // One worker per SM: any share is the whole SM.
        let one = placement_of(true, SmSet::range(0, 66), all, 1);
        assert_eq!(one.mask, SmSet::range(0, 66));
        // No peer (or co-location off), or given every SM: its own SMs.
        assert_eq!(placement_of(false, SmSet::range(0, 66), all, 8).share, None);
        assert_eq!(placement_of(true, all, all, 8).share, None);
        assert_eq!(placement_of(true, SmSet::EMPTY, all, 8).mask, SmSet::EMPTY);
    }
}

//! Preemptible launches: the host side of the control record that the
//! transformed kernels read (layout: `cuda/prelude.cuh`).

use crate::error::{CudaError, Result};
use crate::launch_plan::{self, Chunk, LaunchFacts, Plan, ProfileKey};
use crate::runtime::launcher::{Launcher, Pending, Publish};
use crate::runtime::{DeviceBuffer, Event, Function, HostMapped, Params, Stream};

/// Bytes of one control record (`gmx_ctl_t`): a 128-byte line with the claim
/// word and the result (the host reads its first 32 bytes), a 128-byte line
/// with the exit count, and 256 per-SM counters.
pub const CTL_BYTES: usize = 128 + 128 + 256 * 4;
const NO_RESUME: u32 = u32::MAX;
/// Claims per worker a launch is cut into at least (when its chunk allows):
/// fewer claims cost fewer atomic round trips, more balance the tail.
pub const DEFAULT_MIN_CLAIMS: u32 = 4;
/// `gmx_launch_t::cap` for "no per-SM cap": the workers skip the per-SM counter.
pub const NO_CAP: u32 = u32::MAX;
/// Byte offset of `gmx_ctl_t::gone` (16 words, per-SM retreat) in the control record.
const GONE_OFFSET: u64 = 128 + 8;
/// `gone` words: SMs 16i..16i+15 each.
const GONE_WORDS: usize = 16;
/// Byte offset of `gmx_ctl_t::host_result` (where the last worker also
/// publishes the result, in host memory) in the control record.
const HOST_RESULT_OFFSET: usize = 128 + 8 + 4 * GONE_WORDS;
/// Bytes of the host copy of the result: next, workers, seq (and a pad word).
const HOST_RESULT_BYTES: usize = 16;
/// The word of the host copy that holds the launch's number (`seq`),
/// written last: by the last worker, or by the stream after a native kernel.
const HOST_SEQ_WORD: usize = 2;
/// A launch whose end shows in host memory is polled there alone for this
/// long after its start; only later does a poll also query its end event,
/// which is what reports a fault (its workers then never publish). An event
/// query takes the driver's lock, and a daemon polls every few µs.
const EVENT_QUERY_AFTER: std::time::Duration = std::time::Duration::from_micros(100);
/// After [`EVENT_QUERY_AFTER`], a launch whose end shows in host memory has
/// its end event queried at most this often, not at every poll: with 8
/// clients each poll of the daemon's device process found several launches
/// past 100 µs (queued ahead behind others) and queried each, and a
/// low-priority launch of 2 ms was queried at every poll, 5 µs apart, each
/// query taking the lock that the next `cuLaunchKernel` waits for. A fault
/// is still seen within this much of the first query.
const EVENT_QUERY_EVERY: std::time::Duration = std::time::Duration::from_micros(100);

/// Set to `event` to find a native launch's end by querying its end event, as
/// before its end was published in host memory (for comparisons: docs/history/benchmarks.md,
/// runs 182-183).
pub const NATIVE_END_VAR: &str = "GPUMUX_NATIVE_END";

/// A native launch's end is published in host memory (not [`NATIVE_END_VAR`] = `event`).
fn native_end_published() -> bool {
    static PUBLISHED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PUBLISHED.get_or_init(|| !std::env::var(NATIVE_END_VAR).is_ok_and(|v| v.trim() == "event"))
}

/// `gone` word `i` for SMs `sms` and launch `seq`: the SMs' bits low, the seq's tag high.
fn gone_word(sms: &SmMask, i: usize, seq: u32) -> u32 {
    let bits = (sms.0[i / 4] >> (16 * (i % 4))) as u32 & 0xffff;
    ((seq & 0xffff) << 16) | bits
}

/// Set to `start` to record a native launch's end event right after it on
/// the launch command's own path, as before issue 35 (for comparisons); by
/// default a native launch whose end is published in host memory records
/// it only if a poll needs it ([`WorkerLaunch::lazy_end`]).
pub const NATIVE_END_EVENT_VAR: &str = "GPUMUX_NATIVE_END_EVENT";

/// A native start asked for a lazy end event may leave it unrecorded (not [`NATIVE_END_EVENT_VAR`] = `start`).
fn native_end_event_lazy() -> bool {
    static LAZY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *LAZY.get_or_init(|| !std::env::var(NATIVE_END_EVENT_VAR).is_ok_and(|v| v.trim() == "start"))
}

/// Workers to launch for `count` blocks on `mask_sms` of `sm_count` SMs.
/// Enough to reach every SM: those outside the mask or over the cap leave
/// at once. On the whole GPU a small launch needs fewer: the first worker
/// on any SM always enters (every SM is in the mask and the cap is at least
/// 1), and every worker that enters claims until no block is left, so
/// 2 × count (at least one per SM) is plenty, and a full grid of workers
/// that mostly leave costs more than the launch (an empty one-block kernel
/// of 32 threads would start 32 × 132 workers on an H100).
pub fn worker_grid(workers_per_sm: u32, sm_count: u32, mask_sms: u32, count: u32) -> u32 {
    let full = workers_per_sm * sm_count;
    if mask_sms >= sm_count {
        full.min(count.saturating_mul(2).max(sm_count)).max(1)
    } else {
        full
    }
}

/// A set of SMs as a 256-bit mask (bit i = SM i).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SmMask(pub [u64; 4]);

impl SmMask {
    /// No SM.
    pub fn empty() -> SmMask {
        SmMask([0; 4])
    }
    /// SMs lo..hi (exclusive).
    pub fn range(lo: u32, hi: u32) -> SmMask {
        let mut m = SmMask::empty();
        for s in lo..hi.min(256) {
            m.insert(s);
        }
        m
    }
    /// Adds SM `sm` (SMs from 256 on are ignored).
    pub fn insert(&mut self, sm: u32) {
        if sm < 256 {
            self.0[(sm / 64) as usize] |= 1u64 << (sm % 64);
        }
    }
    /// Whether SM `sm` is in the set.
    pub fn contains(&self, sm: u32) -> bool {
        sm < 256 && self.0[(sm / 64) as usize] >> (sm % 64) & 1 == 1
    }
    /// SMs in the set.
    pub fn count(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
}

/// The immutable launch description (`gmx_launch_t`), passed by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchDesc {
    /// The user's grid, for `blockIdx`/`gridDim`.
    pub grid: [u32; 3],
    /// First linear block index of this launch.
    pub begin: u32,
    /// Blocks in this launch.
    pub count: u32,
    /// Blocks per claim.
    pub chunk: u32,
    /// Workers per SM at most (balances small grids); [`NO_CAP`]: no cap.
    pub cap: u32,
    /// Nonzero launch number; a retreat names it.
    pub seq: u32,
    /// SMs this launch may run on.
    pub mask: SmMask,
    /// Workers that can run blocks at once: SMs in the mask × workers per SM
    /// (the claims shrink towards the end of the launch by this share).
    pub slots: u32,
}

impl LaunchDesc {
    /// The kernel parameter's bytes, laid out as `gmx_launch_t`.
    pub fn to_bytes(&self) -> [u8; 72] {
        let mut b = [0u8; 72];
        let words = [self.grid[0], self.grid[1], self.grid[2], self.begin, self.count, self.chunk, self.cap, self.seq];
        for (i, w) in words.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        for (i, m) in self.mask.0.iter().enumerate() {
            b[32 + i * 8..40 + i * 8].copy_from_slice(&m.to_le_bytes());
        }
        b[64..68].copy_from_slice(&self.slots.to_le_bytes());
        b
    }
}

/// The header of the control record (`gmx_ctl_t`) as the host reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtlHeader {
    /// Next block to claim, relative to the launch's `begin`.
    pub claim: u32,
    /// `seq` of the launch asked to retreat (0: none).
    pub retreat_seq: u32,
    /// Lowest relative index claimed after the retreat request (`u32::MAX`: none).
    pub resume: u32,
    /// Published by the last worker out: the first block not done.
    pub result_next: u32,
    /// Published by the last worker out: workers that ran blocks.
    pub result_workers: u32,
    /// Which launch the published result belongs to.
    pub result_seq: u32,
}

impl CtlHeader {
    /// Reads the header from the record's first bytes (`None` if fewer than 24).
    pub fn from_bytes(b: &[u8]) -> Option<CtlHeader> {
        let w = |i: usize| Some(u32::from_le_bytes(b.get(i * 4..i * 4 + 4)?.try_into().ok()?));
        Some(CtlHeader {
            claim: w(0)?,
            retreat_seq: w(1)?,
            resume: w(2)?,
            result_next: w(3)?,
            result_workers: w(4)?,
            result_seq: w(5)?,
        })
    }
    /// The state a record must hold between launches; `host_result` is the
    /// device address of the host copy of the result (0: none).
    pub fn idle_bytes(host_result: u64) -> Vec<u8> {
        let mut b = vec![0u8; CTL_BYTES];
        b[8..12].copy_from_slice(&NO_RESUME.to_le_bytes());
        b[HOST_RESULT_OFFSET..HOST_RESULT_OFFSET + 8].copy_from_slice(&host_result.to_le_bytes());
        b
    }
}

/// What a finished (or retreated) launch left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Blocks [next, end) are still to run.
    pub next: u32,
    /// End of the launch's range.
    pub end: u32,
    /// Workers that found themselves on an allowed SM.
    pub workers: u32,
}

impl Outcome {
    /// No block of the range is left.
    pub fn done(&self) -> bool {
        self.next >= self.end
    }
}

impl From<u32> for Chunk {
    fn from(n: u32) -> Chunk {
        Chunk::Fixed(n.max(1))
    }
}

/// A timed launch whose end will give the kernel's block time.
struct Measuring {
    start: Event,
    end: Event,
    blocks: u64,
    slots: u64,
}

/// One transformed kernel launch that can be started on an SM set, told to
/// retreat, and started again where it stopped. Starting needs no host-side
/// reset of the record: the last worker of each launch resets it.
///
/// With [`Chunk::Auto`] (and a native build given by [`WorkerLaunch::with_native`])
/// each start is planned by [`launch_plan::plan`]: a kernel's first launch is
/// timed, later ones run natively when they are short, else as workers with a
/// chunk fitted to the kernel's block time.
pub struct WorkerLaunch {
    func: Function,
    /// The untransformed kernel, for launches too short to need preemption,
    /// while `native_on` (kept off between a reuse and the next
    /// [`WorkerLaunch::set_native`], so that a record reused for the same
    /// kernel clones no function: [`WorkerLaunch::native_build`]).
    native: Option<Function>,
    native_on: bool,
    /// The user's arguments, packed (a slot per parameter): a start copies
    /// them, and a reuse copies another kernel's in, with no allocation.
    args: Params,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    /// Blocks per claim asked for; small launches use less (see `describe`).
    pub chunk: Chunk,
    /// How the last start ran.
    last_plan: Option<Plan>,
    /// How long the last start's CUDA calls took, ns: the kernel launch
    /// and the end event's record (the device's launch timings).
    pub last_start_calls: (u32, u32),
    /// Time the next start's parts ([`WorkerLaunch::last_start_parts`]):
    /// set by a device that samples where its launch commands' time goes.
    pub time_start: bool,
    /// How long the last timed start's parts took, ns: its plan (the
    /// profile lookup), the parameters and launch description (with the
    /// start event of a launch timed to learn its kernel's block time), and
    /// the launch calls or their post to the launcher thread.
    pub last_start_parts: [u32; 3],
    measuring: Option<Measuring>,
    /// Claims per worker below which the chunk shrinks (see `describe`).
    pub min_claims: u32,
    /// First block of the range still to run (a start runs [next, end)).
    pub next: u32,
    /// End of the range (suite block index, exclusive).
    pub end: u32,
    workers_per_sm: u32,
    sm_count: u32,
    ctl: DeviceBuffer,
    /// Where the last worker also publishes the result ([`HOST_RESULT_BYTES`],
    /// pinned and mapped): a launch's end is then a read of host memory, not
    /// an event query and a copy of the record. `None` where the pinned
    /// allocation failed: the event and the copy, as before. Declared after
    /// `ctl` so that it is freed after the record that points to it.
    host: Option<HostMapped>,
    seq: u32,
    ended: Event,
    /// When a poll next queries the end event of a launch that publishes
    /// its end in host memory ([`EVENT_QUERY_AFTER`], [`EVENT_QUERY_EVERY`]).
    event_query_at: std::cell::Cell<std::time::Instant>,
    running: bool,
    /// The running launch is the native kernel (it cannot retreat; it runs to the end).
    running_native: bool,
    /// The running native launch publishes its end in host memory ([`NATIVE_END_VAR`]).
    native_published: bool,
    /// The next native start publishes its end ([`WorkerLaunch::publish_end`]).
    publish_end: bool,
    /// The next native start records no end event unless a poll needs it
    /// ([`WorkerLaunch::lazy_end`]).
    lazy_end: bool,
    /// The running launch's end event is not recorded yet: the raw handle
    /// of the stream it was launched on, where the event is recorded when a
    /// poll first needs it ([`WorkerLaunch::lazy_end`]).
    end_unrecorded: std::cell::Cell<Option<usize>>,
    /// The running native launch is known to have ended: a later launch on
    /// its stream published its end ([`WorkerLaunch::ended_before`]).
    known_ended: bool,
    /// Started to displace other work: never native (see [`WorkerLaunch::urgent`]).
    urgent: bool,
    /// Run the whole grid natively whatever its length and SMs, if the native
    /// build is at hand ([`WorkerLaunch::native_anywhere`]).
    native_anywhere: bool,
    /// The same, for a launch known to be long ([`WorkerLaunch::native_if_long`]).
    native_if_long: bool,
    /// Workers per SM at most, set by a device that co-locates launches on
    /// the same SMs (each keeps to its share of every SM); `None`: the occupancy.
    pub share_cap: Option<u32>,
    /// What the host last wrote to each `gone` word of the record (0: nothing).
    gone: [u32; GONE_WORDS],
    /// The running launch's CUDA calls, posted to a launcher thread
    /// ([`WorkerLaunch::start_posted`]) and maybe not made yet.
    pending: Option<Pending>,
}

/// `func`'s block time at this shape once timed ([`launch_plan::TIMED_LAUNCHES`]; `None` before).
pub fn timed_block_ns(func: &Function, block: [u32; 3], smem: u32) -> Option<f64> {
    let timed = func.profiles.get(&func.name, ProfileKey { block, smem }).filter(|t| !t.timing());
    timed.map(|t| t.block_ns)
}

/// A launch of a function's whole grid on `sm_count` SMs of `workers_per_sm`
/// slots, as the choices between native and workers weigh it: its blocks, the
/// slots, and its shape's block time once timed ([`launch_plan::TIMED_LAUNCHES`];
/// `None` before). Built once per decision, so that the profile cache is asked
/// once and every answer below reads the same timing.
#[derive(Clone, Copy, Debug)]
pub struct WholeGrid {
    blocks: u64,
    slots: u64,
    block_ns: Option<f64>,
}

impl WholeGrid {
    /// `func`'s whole `grid` of `block`-thread blocks with `smem` bytes of
    /// shared memory each, on `sm_count` SMs of `workers_per_sm` slots.
    pub fn of(func: &Function, grid: [u32; 3], block: [u32; 3], smem: u32, workers_per_sm: u32, sm_count: u32) -> Self {
        Self::timed(grid, workers_per_sm, sm_count, timed_block_ns(func, block, smem))
    }

    /// [`WholeGrid::of`] with its shape's block time already looked up
    /// (`block_ns`: [`timed_block_ns`]'s answer).
    fn timed(grid: [u32; 3], workers_per_sm: u32, sm_count: u32, block_ns: Option<f64>) -> Self {
        WholeGrid {
            blocks: grid.iter().map(|&g| g as u64).product(),
            slots: workers_per_sm as u64 * sm_count as u64,
            block_ns,
        }
    }

    fn waves(&self) -> u64 {
        self.blocks.div_ceil(self.slots.max(1))
    }

    /// Long: its kernel shape has been timed, and it takes more than one wave
    /// and more than [`launch_plan::SHORT_LAUNCH_NS`] ([`WorkerLaunch::native_if_long`]).
    pub fn is_long(&self) -> bool {
        let waves = self.waves();
        self.block_ns.is_some_and(|bt| waves > 1 && bt * waves as f64 > launch_plan::SHORT_LAUNCH_NS)
    }

    /// Known to be short: timed, and its waves take at most
    /// [`launch_plan::SHORT_LAUNCH_NS`] ([`launch_plan::known_short`]).
    pub fn is_short(&self) -> bool {
        launch_plan::known_short(self.blocks, self.slots, self.block_ns)
    }

    /// The GPU time it is expected to take: its waves times its shape's block
    /// time once timed, else `untimed_wave_ns` a wave (the CUDA client device's
    /// deep queue ahead bounds what it queues natively by this).
    pub fn expected_ns(&self, untimed_wave_ns: f64) -> f64 {
        self.waves() as f64 * self.block_ns.unwrap_or(untimed_wave_ns)
    }

    /// It may hold the GPU longer than [`launch_plan::NATIVE_HOLD_MAX_NS`]
    /// ([`launch_plan::holds_too_long`]): such a launch never runs natively,
    /// as a peer of its priority could not make it leave.
    pub fn holds_too_long(&self) -> bool {
        launch_plan::holds_too_long(self.blocks, self.slots, self.block_ns)
    }
}

impl WorkerLaunch {
    /// `args` are the kernel's own parameters (without the worker's two):
    /// raw bytes per parameter (`Vec<Vec<u8>>`), or packed ([`Params`]).
    pub fn new(
        func: Function,
        args: impl Into<Params>,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        chunk: impl Into<Chunk>,
        sm_count: u32,
    ) -> Result<Self> {
        let blocks: u64 = grid.iter().map(|&g| g as u64).product();
        if blocks >= (u32::MAX / 2) as u64 {
            return Err(CudaError::Invalid(format!("grid of {blocks} blocks is too large to linearise in 31 bits")));
        }
        let threads = block[0] * block[1] * block[2];
        let workers_per_sm = func.blocks_per_sm(threads, smem)?;
        let ctl = DeviceBuffer::new(CTL_BYTES)?;
        let host = match HostMapped::new(HOST_RESULT_BYTES) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!("launch results are copied back from the device: no mapped host memory for them ({e})");
                None
            }
        };
        ctl.upload(&CtlHeader::idle_bytes(host.as_ref().map_or(0, |h| h.dev)))?;
        Ok(WorkerLaunch {
            func,
            native: None,
            native_on: false,
            args: args.into(),
            grid,
            block,
            smem,
            chunk: chunk.into(),
            last_plan: None,
            last_start_calls: (0, 0),
            time_start: false,
            last_start_parts: [0; 3],
            measuring: None,
            min_claims: DEFAULT_MIN_CLAIMS,
            next: 0,
            end: blocks as u32,
            workers_per_sm,
            sm_count,
            ctl,
            host,
            seq: 0,
            ended: Event::new_sync_only()?,
            event_query_at: std::cell::Cell::new(std::time::Instant::now()),
            pending: None,
            running: false,
            running_native: false,
            native_published: false,
            publish_end: true,
            lazy_end: false,
            end_unrecorded: std::cell::Cell::new(None),
            known_ended: false,
            urgent: false,
            native_anywhere: false,
            native_if_long: false,
            share_cap: None,
            gone: [0; GONE_WORDS],
        })
    }

    /// Re-targets an idle launch record (not running) to another launch, of
    /// this or another kernel: what a launch costs to make is its control
    /// record and event (`cuMemAlloc`, and a `cuMemFree` that waits for the
    /// whole device when the record goes), so a device serving a stream of
    /// one-off launches (gpumuxd's clients) keeps records and reuses them.
    /// The record is idle between launches (its last worker resets it).
    /// `args` are copied in (packed once by the caller, [`Params::of_args`]).
    /// A record reused for the function it holds keeps it (and its native
    /// build, off until [`WorkerLaunch::set_native`]): a clone of a function
    /// is an allocation (its name), and a chain's kernels each reused a
    /// record of the same one.
    pub fn reuse(&mut self, func: &Function, args: &Params, grid: [u32; 3], block: [u32; 3], smem: u32) -> Result<()> {
        if self.running {
            return Err(CudaError::Invalid("reuse: the launch is still running".into()));
        }
        let blocks: u64 = grid.iter().map(|&g| g as u64).product();
        if blocks >= (u32::MAX / 2) as u64 {
            return Err(CudaError::Invalid(format!("grid of {blocks} blocks is too large to linearise in 31 bits")));
        }
        let threads = block[0] * block[1] * block[2];
        if func.name != self.func.name || block != self.block || smem != self.smem {
            self.workers_per_sm = func.blocks_per_sm(threads, smem)?;
        }
        if func.key() != self.func.key() {
            // Another function: its native build (and the module it holds) goes too.
            self.func = func.clone();
            self.native = None;
        }
        self.native_on = false;
        self.args.clone_from(args);
        self.grid = grid;
        self.block = block;
        self.smem = smem;
        self.last_plan = None;
        self.measuring = None;
        self.next = 0;
        self.end = blocks as u32;
        self.urgent = false;
        self.native_anywhere = false;
        self.native_if_long = false;
        self.share_cap = None;
        self.publish_end = true;
        self.lazy_end = false;
        self.known_ended = false;
        Ok(())
    }

    /// Marks a launch that arrives while other work retreats for it (a
    /// high-priority kernel): it always runs as workers. Measured on the H100
    /// (docs/benchmarks.md): a native probe grid waiting for draining workers
    /// reached its first block at p99 81 µs, the same probe as workers at 49 µs,
    /// because its workers start on the first SM that frees a slot.
    pub fn urgent(mut self, yes: bool) -> Self {
        self.urgent = yes;
        self
    }

    /// Whether the next start, if native, publishes its end in host memory
    /// (a stream write after the kernel, ~2 µs of the GPU's time between two
    /// short kernels); the default, and set again after each start. Without
    /// it the launch's end is read from its end event, or known from a
    /// later launch of its stream that published its end
    /// ([`WorkerLaunch::ended_before`]): the CUDA client device's runs of
    /// kernels queued natively publish the end of one kernel in a few.
    pub fn publish_end(&mut self, yes: bool) {
        self.publish_end = yes;
    }

    /// Whether the next start, if native and made by a launcher thread
    /// ([`WorkerLaunch::start_posted`]), or made here with its end published
    /// in host memory, leaves its end event unrecorded (for this start only;
    /// here unless [`NATIVE_END_EVENT_VAR`] is `start`). The thread then makes
    /// `cuLaunchKernel` alone (and the end's write, if published): the CUDA client device's runs of
    /// kernels queued natively, where a record per kernel cost the thread
    /// 2.2 µs beside a 5.2 µs launch (H200), and the GPU waited for it. The
    /// event is recorded on the launch's stream when a poll or a finish
    /// first needs it (stream order: it completes once the kernel and
    /// whatever was queued after it by then ended, or fails with a fault);
    /// a poll that reads the end in host memory, or knows it from a later
    /// kernel's ([`WorkerLaunch::ended_before`]), never does.
    pub fn lazy_end(&mut self, yes: bool) {
        self.lazy_end = yes;
    }

    /// The running launch is native and its end is neither published nor
    /// known yet ([`WorkerLaunch::publish_end`]).
    pub fn end_unpublished(&self) -> bool {
        self.running && self.running_native && !self.native_published && !self.known_ended
    }

    /// The running launch's end shows in host memory (it published it, or
    /// a later launch of its stream did: [`WorkerLaunch::ended_before`]):
    /// a read of a word, no driver call. `false` for a launch not running,
    /// whose calls a launcher thread has not made yet, or whose end is read
    /// from its end event only (a timed launch, an unpublished native one).
    pub fn end_in_host_memory(&self) -> bool {
        if !self.running || self.pending.as_ref().is_some_and(|p| !p.done()) {
            return false;
        }
        self.known_ended || self.host_result().is_some()
    }

    /// The running native launch ended: a launch queued after it on the
    /// same stream published its end (stream order). Its poll and finish
    /// then need no driver call. Nothing for any other launch.
    pub fn ended_before(&mut self) {
        if self.running && self.running_native {
            self.known_ended = true;
        }
    }

    /// Gives the launch the kernel's native build, which [`Chunk::Auto`] uses
    /// for launches too short to need preemption.
    pub fn with_native(mut self, native: Function) -> Self {
        self.native = Some(native);
        self.native_on = true;
        self
    }

    /// [`WorkerLaunch::with_native`] on a record in place (`None`: none), for
    /// the next start; the one it holds is kept if it is that one.
    pub fn set_native(&mut self, native: Option<&Function>) {
        let Some(f) = native else {
            self.native_on = false;
            return;
        };
        if self.native.as_ref().is_none_or(|n| n.key() != f.key()) {
            self.native = Some(f.clone());
        }
        self.native_on = true;
    }

    /// The native build the next start may run, if any ([`WorkerLaunch::set_native`]).
    fn native_build(&self) -> Option<&Function> {
        self.native.as_ref().filter(|_| self.native_on)
    }

    /// Runs the next start's whole grid as the native kernel, however long
    /// and whatever SMs it is given, if the native build is at hand and the
    /// start begins at block 0 and runs to the end: for a device that leaves
    /// priority to the hardware's stream priorities where no preemption is
    /// needed (`ClientDevice::set_hw_priority`). Not for a launch marked
    /// [`WorkerLaunch::urgent`] (never native).
    pub fn native_anywhere(&mut self, yes: bool) {
        self.native_anywhere = yes;
    }

    /// [`WorkerLaunch::native_anywhere`] for a launch whose kernel shape has
    /// been timed and takes more than one wave and more than
    /// [`launch_plan::SHORT_LAUNCH_NS`] on the whole GPU: where workers cost
    /// a kernel the most (their claims and barriers beside busy warps) and a
    /// native launch's own cost is spread over the most work. Short ones stay
    /// workers (the daemon's launch path serves them fastest as such).
    pub fn native_if_long(&mut self, yes: bool) {
        self.native_if_long = yes;
    }

    /// The running launch is the native kernel.
    pub fn running_native(&self) -> bool {
        self.running && self.running_native
    }

    /// How the last start ran (None before the first).
    pub fn last_plan(&self) -> Option<Plan> {
        self.last_plan
    }

    fn profile_key(&self) -> ProfileKey {
        ProfileKey { block: self.block, smem: self.smem }
    }

    /// How a start on `mask` would run now.
    pub fn plan(&self, mask: SmMask) -> Plan {
        let total: u64 = self.grid.iter().map(|&g| g as u64).product();
        let facts = LaunchFacts {
            blocks: (self.end - self.next.min(self.end)) as u64,
            slots: self.workers_per_sm as u64 * mask.count().min(self.sm_count) as u64,
            whole_grid_on_whole_gpu: self.next == 0 && self.end as u64 == total && mask.count() >= self.sm_count,
            native_available: self.native_build().is_some() && !self.urgent,
        };
        // Until a timed launch of this kernel shape has finished, every
        // launch of it is timed (the first to finish is kept by the cache).
        let known = self.func.profiles.get(&self.func.name, self.profile_key());
        let asks_native = self.native_anywhere || self.native_if_long;
        if facts.native_available && self.next == 0 && self.end as u64 == total && asks_native {
            // From the timing looked up above (what `timed_block_ns` would answer): the cache asked once a start.
            let block_ns = known.filter(|t| !t.timing()).map(|t| t.block_ns);
            let whole = WholeGrid::timed(self.grid, self.workers_per_sm, self.sm_count, block_ns);
            if (self.native_anywhere || whole.is_long()) && !whole.holds_too_long() {
                return Plan::Native;
            }
        }
        match launch_plan::plan(self.chunk, facts, known.map(|t| t.block_ns)) {
            // Timed until enough launches were (`TIMED_LAUNCHES`).
            Plan::Workers { chunk, measure: false }
                if self.chunk == Chunk::Auto && known.is_some_and(|t| t.timing()) =>
            {
                Plan::Workers { chunk, measure: true }
            }
            plan => plan,
        }
    }

    /// No block of the range is left.
    pub fn done(&self) -> bool {
        self.next >= self.end
    }
    /// Started and not yet finished (see [`WorkerLaunch::finish`]).
    pub fn running(&self) -> bool {
        self.running
    }
    /// What a cut of the running launch needs (`client/device/refill.rs`):
    /// its control record's device address and the launch's number; `None`
    /// when no worker launch is running (or a native one, which cannot stop).
    pub fn cut_target(&self) -> Option<(u64, u32)> {
        (self.running && !self.running_native).then_some((self.ctl.ptr, self.seq))
    }
    /// The worker function it launches (kept loaded while this record is).
    pub fn function(&self) -> &Function {
        &self.func
    }
    /// Tells this launch record from every other live one (its control
    /// record's device address).
    pub fn record_id(&self) -> u64 {
        self.ctl.ptr
    }
    /// Resident workers per SM (the kernel's occupancy).
    pub fn workers_per_sm(&self) -> u32 {
        self.workers_per_sm
    }
    /// Replaces one of the user's arguments (between launches).
    pub fn set_arg(&mut self, i: usize, bytes: Vec<u8>) {
        self.args.set_slot(i, &bytes);
    }

    /// The launch description for the blocks left, on `mask`. Small launches
    /// get a per-SM cap and a smaller chunk so that their blocks spread over
    /// the SMs as the hardware would spread them, instead of piling onto the
    /// workers that happen to claim first.
    pub fn describe(&self, mask: SmMask, chunk: u32) -> LaunchDesc {
        let count = self.end - self.next;
        let sms = mask.count().max(1);
        let mut cap = count.div_ceil(sms).clamp(1, self.workers_per_sm);
        if let Some(share) = self.share_cap {
            cap = cap.min(share.max(1));
        }
        let slots = (sms * cap).max(1);
        // At least about `min_claims` claims per worker before the chunk grows.
        let chunk = (count / (slots * self.min_claims.max(1))).clamp(1, chunk.max(1));
        LaunchDesc {
            grid: self.grid,
            begin: self.next,
            count,
            chunk,
            // The occupancy already bounds workers per SM: no counter needed.
            cap: if cap >= self.workers_per_sm { NO_CAP } else { cap },
            seq: self.seq,
            mask,
            slots,
        }
    }

    /// Starts workers for blocks [next, end) on the SMs of `mask`, on `stream`.
    pub fn start(&mut self, stream: &Stream, mask: SmMask) -> Result<()> {
        self.start_with(stream, mask, None)
    }

    /// [`WorkerLaunch::start`], with the worker launch's CUDA calls (the
    /// kernel and its end event) made by `launcher`'s thread in context
    /// `ctx` instead of this one (`runtime::launcher`: for workers queued
    /// ahead, which nobody waits for yet). A timed launch is made here as
    /// before. Until [`WorkerLaunch::settle`], `stream` must stay
    /// alive and take nothing else.
    pub fn start_posted(
        &mut self,
        stream: &Stream,
        mask: SmMask,
        launcher: &Launcher,
        ctx: cudarc::driver::sys::CUcontext,
    ) -> Result<()> {
        self.start_with(stream, mask, Some((launcher, ctx)))
    }

    /// Waits for the CUDA calls of a posted start ([`WorkerLaunch::start_posted`]);
    /// their error if they failed. Nothing to do for any other start.
    /// Whether it had to wait (the launcher thread had not made them yet).
    pub fn settle(&mut self) -> Result<bool> {
        let Some(p) = self.pending.take() else { return Ok(false) };
        let waited = !p.done();
        self.last_start_calls = p.wait()?;
        Ok(waited)
    }

    fn start_with(
        &mut self,
        stream: &Stream,
        mask: SmMask,
        launcher: Option<(&Launcher, cudarc::driver::sys::CUcontext)>,
    ) -> Result<()> {
        if self.running {
            return Err(CudaError::Invalid("start: the launch is still running".into()));
        }
        let began = self.time_start.then(std::time::Instant::now);
        if began.is_some() {
            // A native start returns before the parts are taken: it counts none.
            self.last_start_parts = [0; 3];
        }
        let plan = self.plan(mask);
        self.last_plan = Some(plan);
        // For this start only (`publish_end`, `lazy_end`).
        let publish_end = std::mem::replace(&mut self.publish_end, true);
        let lazy_end = std::mem::replace(&mut self.lazy_end, false);
        self.end_unrecorded.set(None);
        let planned = began.map(|_| std::time::Instant::now());
        // The user's arguments, packed: a copy, no allocation (`Params`).
        let mut p = self.args.clone();
        // `native_build`, borrowing the field alone (the arms change others).
        let chunk = match (plan, self.native.as_ref().filter(|_| self.native_on)) {
            (Plan::Native, Some(native)) => {
                // Its end is published as a worker launch's is, in host memory
                // (a stream write of its number after the kernel): a poll reads
                // a word instead of querying the end event, which takes the
                // driver's lock that the next launch waits for.
                self.seq = self.seq.wrapping_add(1).max(1);
                let publish = match &self.host {
                    Some(h) if native_end_published() && publish_end => {
                        Some(Publish { addr: h.dev + HOST_SEQ_WORD as u64 * 4, value: self.seq })
                    }
                    _ => None,
                };
                self.native_published = publish.is_some();
                self.last_start_calls = match launcher {
                    Some((launcher, ctx)) => {
                        let (grid, block, smem) = (self.grid, self.block, self.smem);
                        let ended = (!lazy_end).then_some(&self.ended);
                        self.pending = Some(launcher.post(ctx, native, grid, block, smem, stream, p, publish, ended)?);
                        if lazy_end {
                            self.end_unrecorded.set(Some(stream.raw as usize));
                        }
                        (0, 0)
                    }
                    None => {
                        let tag = gpumux_stamps::tag();
                        if tag != 0 {
                            gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchStart, tag, 0);
                        }
                        let t = std::time::Instant::now();
                        // SAFETY: the user's arguments follow the native kernel's signature.
                        unsafe { native.launch(self.grid, self.block, self.smem, stream, &mut p)? };
                        let launched = t.elapsed();
                        if tag != 0 {
                            gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchReturn, tag, 0);
                        }
                        let t = std::time::Instant::now();
                        if let Some(w) = publish {
                            w.write(stream)?;
                        }
                        if lazy_end && publish.is_some() && native_end_event_lazy() {
                            // Its end is read from host memory: the event
                            // (one more driver call on the command's path,
                            // before the core's next poll) is recorded only
                            // if a poll needs it, as a kernel queued ahead's.
                            self.end_unrecorded.set(Some(stream.raw as usize));
                        } else {
                            self.ended.record(stream)?;
                        }
                        (launched.as_nanos() as u32, t.elapsed().as_nanos() as u32)
                    }
                };
                self.event_query_at.set(std::time::Instant::now() + EVENT_QUERY_AFTER);
                self.running = true;
                self.running_native = true;
                return Ok(());
            }
            (Plan::Workers { chunk, .. }, _) => chunk,
            (Plan::Native, None) => 1,
        };
        self.seq = self.seq.wrapping_add(1).max(1);
        // A `gone` word left by the launch 65,536 starts ago carries this
        // launch's tag: clear it first (in stream order, before the workers).
        for i in 0..GONE_WORDS {
            let w = self.gone[i];
            if w >> 16 == self.seq & 0xffff && w & 0xffff != 0 {
                stream.write_u32(self.ctl.ptr + GONE_OFFSET + 4 * i as u64, 0)?;
                self.gone[i] = 0;
            }
        }
        let desc = self.describe(mask, chunk);
        p.ptr(self.ctl.ptr).push_bytes(&desc.to_bytes());
        let workers = worker_grid(self.workers_per_sm, self.sm_count, mask.count(), desc.count);
        let measuring = match plan {
            Plan::Workers { measure: true, .. } => {
                let m = Measuring {
                    start: Event::new()?,
                    end: Event::new()?,
                    blocks: desc.count as u64,
                    slots: self.workers_per_sm as u64 * mask.count().min(self.sm_count) as u64,
                };
                m.start.record(stream)?;
                Some(m)
            }
            _ => None,
        };
        let prepared = began.map(|_| std::time::Instant::now());
        let calls = match (launcher, &measuring) {
            // Workers nobody waits for yet: the launcher thread makes the calls.
            (Some((launcher, ctx)), None) => {
                let (func, block, smem) = (&self.func, self.block, self.smem);
                let ended = Some(&self.ended);
                let posted = launcher.post(ctx, func, [workers, 1, 1], block, smem, stream, p, None, ended)?;
                self.pending = Some(posted);
                (0, 0)
            }
            _ => {
                let tag = gpumux_stamps::tag();
                if tag != 0 {
                    gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchStart, tag, 0);
                }
                let t = std::time::Instant::now();
                // SAFETY: parameters follow the transformed signature (user args, ctl, launch).
                unsafe { self.func.launch([workers, 1, 1], self.block, self.smem, stream, &mut p)? };
                let launched = t.elapsed();
                if tag != 0 {
                    gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchReturn, tag, 0);
                }
                if let Some(m) = &measuring {
                    m.end.record(stream)?;
                }
                let t = std::time::Instant::now();
                self.ended.record(stream)?;
                (launched.as_nanos() as u32, t.elapsed().as_nanos() as u32)
            }
        };
        if let (Some(b), Some(p), Some(q)) = (began, planned, prepared) {
            let ns = |d: std::time::Duration| d.as_nanos().min(u32::MAX as u128) as u32;
            self.last_start_parts = [ns(p - b), ns(q - p), ns(q.elapsed())];
        }
        self.measuring = measuring;
        self.last_start_calls = calls;
        self.event_query_at.set(std::time::Instant::now() + EVENT_QUERY_AFTER);
        self.running = true;
        self.running_native = false;
        Ok(())
    }

    /// Tells the workers to stop after their current chunk. `ctl_stream`
    /// should be a stream with nothing queued, so the write lands at once.
    /// A request that lands before the workers start stops them before any
    /// block; one that lands after the launch ended names an old launch and
    /// is ignored by later ones.
    pub fn retreat(&self, ctl_stream: &Stream) -> Result<()> {
        if !self.running || self.running_native {
            return Ok(());
        }
        ctl_stream.write_u32(self.ctl.ptr + 4, self.seq)
    }

    /// Per-SM retreat: tells the running launch's workers to leave the SMs of
    /// `gone` after their current chunk and not to enter them; the workers
    /// on the launch's other SMs go on claiming, so the launch's blocks are
    /// all run by them. `gone` is the whole set (an SM taken out of it may
    /// be entered again by workers not yet started). One stream write per
    /// 16 SMs whose bits change, on `ctl_stream` (idle, so it lands at once).
    /// If every SM of the launch is gone its workers all leave with blocks
    /// left, as after [`WorkerLaunch::retreat`]. A native launch ignores it.
    pub fn leave(&mut self, ctl_stream: &Stream, gone: &SmMask) -> Result<()> {
        if !self.running || self.running_native {
            return Ok(());
        }
        let tag = self.seq & 0xffff;
        for i in 0..GONE_WORDS {
            let want = gone_word(gone, i, self.seq);
            let old = self.gone[i];
            let old_bits = if old >> 16 == tag { old & 0xffff } else { 0 };
            if want & 0xffff != old_bits {
                ctl_stream.write_u32(self.ctl.ptr + GONE_OFFSET + 4 * i as u64, want)?;
                self.gone[i] = want;
            }
        }
        Ok(())
    }

    /// Has the running launch ended (finished or retreated)? A read of host
    /// memory when its last worker has published the result there; else an
    /// event query (which also reports a fault).
    pub fn poll(&self) -> Result<bool> {
        if !self.running {
            return Ok(true);
        }
        if let Some(p) = &self.pending {
            // Not launched yet, its end event not recorded: not ended.
            if !p.done() {
                return Ok(false);
            }
            if let Some(e) = p.error() {
                return Err(e);
            }
        }
        if self.known_ended || self.host_result().is_some() {
            return Ok(true);
        }
        if self.host_words().is_some() {
            let now = std::time::Instant::now();
            if now < self.event_query_at.get() {
                return Ok(false);
            }
            self.event_query_at.set(now + EVENT_QUERY_EVERY);
        }
        self.record_end_if_lazy()?;
        self.ended.done()
    }

    /// Records the end event of a launch started without it
    /// ([`WorkerLaunch::lazy_end`]), once its launch call was made: on its
    /// stream, now, so that it completes after the kernel (or reports its fault).
    fn record_end_if_lazy(&self) -> Result<()> {
        if self.pending.as_ref().is_some_and(|p| !p.done()) {
            return Ok(());
        }
        if let Some(stream) = self.end_unrecorded.take() {
            // SAFETY: the stream the launch was made on: the device keeps its
            // launch streams for the context's life (it reuses them, never frees them).
            if let Err(e) = unsafe { self.ended.record_raw(stream as cudarc::driver::sys::CUstream) } {
                self.end_unrecorded.set(Some(stream));
                return Err(e);
            }
        }
        Ok(())
    }

    /// The result (next, workers) the running launch's last worker published
    /// in host memory, once it has; for a native launch, the stream's write of
    /// its number after the kernel. Not for a timed one (its end event must be
    /// complete to read the time, so it ends by the event).
    fn host_result(&self) -> Option<(u32, u32)> {
        let words = self.host_words()?;
        if words.read(HOST_SEQ_WORD) != self.seq {
            return None;
        }
        if self.running_native {
            // Written by the stream after the kernel: it ran every block.
            return Some((self.end, 0));
        }
        // The device wrote the fields, then (after a system fence) the seq.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
        Some((words.read(0), words.read(1)))
    }

    /// The host copy of the result, where the running launch publishes one
    /// there (see [`WorkerLaunch::host_result`]).
    fn host_words(&self) -> Option<crate::runtime::MappedWords<'_>> {
        if self.measuring.is_some() || (self.running_native && !self.native_published) {
            return None;
        }
        self.host.as_ref().map(HostMapped::words)
    }

    /// Waits for the launch to end and records where it stopped.
    pub fn finish(&mut self) -> Result<Outcome> {
        self.settle()?;
        if !self.running {
            return Ok(Outcome { next: self.next, end: self.end, workers: 0 });
        }
        if std::mem::take(&mut self.known_ended) {
            // A native launch: every block ran (`ended_before`).
            self.running = false;
            self.running_native = false;
            self.next = self.end;
            return Ok(Outcome { next: self.next, end: self.end, workers: 0 });
        }
        if let Some((next, workers)) = self.host_result() {
            // Every worker has left: the record is idle and may start again
            // (the grid's last block may still be exiting; it touches nothing more).
            self.running = false;
            self.running_native = false;
            self.check_result(next, self.seq)?;
            self.next = next;
            return Ok(Outcome { next, end: self.end, workers });
        }
        self.record_end_if_lazy()?;
        self.ended.sync()?;
        self.running = false;
        if std::mem::take(&mut self.running_native) {
            self.next = self.end;
            return Ok(Outcome { next: self.next, end: self.end, workers: 0 });
        }
        let measured = self.measuring.take();
        let h = CtlHeader::from_bytes(&self.ctl.download_prefix(32)?)
            .ok_or_else(|| CudaError::Invalid("control record too short".into()))?;
        self.check_result(h.result_next, h.result_seq)?;
        // A timed launch that ran all its blocks gives the kernel's block time
        // (a retreated one ran an unknown share of its time on fewer blocks).
        if let Some(m) = measured {
            if h.result_next == self.end {
                let ns = m.start.elapsed_ms(&m.end)? as f64 * 1e6;
                if let Some(bt) = launch_plan::block_ns_of(ns, m.blocks, m.slots) {
                    if let Some(t) = self.func.profiles.record(&self.func.name, self.profile_key(), bt) {
                        // Once per kernel shape: what every later launch of it is planned with.
                        tracing::info!(
                            "kernel {} with {:?} threads per block and {} B of dynamic shared memory: \
                             {} workers per SM, block time {:.1} µs (the least of {} timed launches; \
                             this one {:.1} µs over {} blocks on {} slots); later launches claim up to {} \
                             block(s) at a time",
                            self.func.name,
                            self.block,
                            self.smem,
                            self.workers_per_sm,
                            t.block_ns / 1e3,
                            t.launches,
                            bt / 1e3,
                            m.blocks,
                            m.slots,
                            match self.chunk {
                                Chunk::Fixed(n) => n,
                                Chunk::Auto => launch_plan::auto_chunk(t.block_ns),
                            }
                        );
                    }
                }
            }
        }
        self.next = h.result_next;
        Ok(Outcome { next: self.next, end: self.end, workers: h.result_workers })
    }

    /// A published result must be this launch's and lie in its range.
    fn check_result(&self, next: u32, seq: u32) -> Result<()> {
        if seq != self.seq {
            return Err(CudaError::Check(format!("control record holds launch {seq} after launch {} ended", self.seq)));
        }
        if next < self.next || next > self.end {
            return Err(CudaError::Check(format!(
                "control record moved from {} to {next} (end {})",
                self.next, self.end
            )));
        }
        Ok(())
    }

    /// Starts over from block 0 (a new run of the same launch).
    pub fn rewind(&mut self) -> Result<()> {
        self.settle()?;
        if self.running {
            return Err(CudaError::Invalid("rewind: the launch is still running".into()));
        }
        self.next = 0;
        Ok(())
    }
}

impl Drop for WorkerLaunch {
    /// A posted start's calls are made before the record, the event and the
    /// function they name are freed (errors ignored: the launch is given up).
    fn drop(&mut self) {
        if let Some(p) = self.pending.take() {
            let _ = p.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_launches_on_the_whole_gpu_start_fewer_workers_others_a_full_grid() {
        // H100: 132 SMs; an empty 32-thread kernel fits 32 per SM.
        assert_eq!(worker_grid(32, 132, 132, 1), 132);
        assert_eq!(worker_grid(8, 132, 132, 132), 264);
        assert_eq!(worker_grid(8, 132, 132, 100_000), 8 * 132);
        // A subset of the SMs: workers land anywhere, so a full grid reaches them all.
        assert_eq!(worker_grid(8, 132, 66, 1), 8 * 132);
    }

    use super::*;

    #[test]
    fn launch_description_matches_the_prelude_layout() {
        let mut mask = SmMask::range(3, 70);
        mask.insert(131);
        let d = LaunchDesc { grid: [4, 5, 6], begin: 7, count: 100, chunk: 4, cap: 3, seq: 9, mask, slots: 11 };
        let b = d.to_bytes();
        assert_eq!(&b[64..68], &11u32.to_le_bytes());
        assert!(crate::transform::PRELUDE.contains(
            "unsigned long long sm_mask[4];   // SMs this launch may run on (bit i = SM i)\n    unsigned int slots;"
        ));
        assert_eq!(&b[0..4], &4u32.to_le_bytes());
        assert_eq!(&b[28..32], &9u32.to_le_bytes());
        assert_eq!(u64::from_le_bytes(b[32..40].try_into().unwrap_or_default()) & 0b1000, 0b1000);
        assert_eq!(u64::from_le_bytes(b[56..64].try_into().unwrap_or_default()), 0);
        let p = crate::transform::PRELUDE;
        assert!(p.contains("unsigned int seq;                // nonzero launch number"));
        assert!(p.contains("unsigned int sm_workers[256];"));
        // The host's offsets: claim word at 0 (retreat seq at +4), resume at 8,
        // results at 12..24, the exit word on the second 128-byte line.
        let fields: Vec<&str> = p
            .lines()
            .skip_while(|l| !l.starts_with("struct gmx_ctl_t"))
            .take_while(|l| !l.starts_with("};"))
            .filter_map(|l| l.trim().strip_suffix(';').or_else(|| l.trim().split(';').next()))
            .filter(|l| l.starts_with("unsigned"))
            .collect();
        assert_eq!(
            fields,
            vec![
                "unsigned long long claim",
                "unsigned int resume",
                "unsigned int result_next",
                "unsigned int result_workers",
                "unsigned int result_seq",
                "unsigned int pad0[26]",
                "unsigned long long exit_word",
                "unsigned int gone[16]",
                "unsigned long long host_result",
                "unsigned int pad1[12]",
                "unsigned int sm_workers[256]",
            ]
        );
        assert_eq!(8 + 4 * 4 + 26 * 4, 128);
        assert_eq!(128 + 8 + 16 * 4 + 8 + 12 * 4, 256);
        assert_eq!(GONE_OFFSET, 128 + 8);
        assert_eq!(HOST_RESULT_OFFSET, 128 + 8 + 16 * 4);
        assert_eq!(HOST_RESULT_OFFSET % 8, 0);
        assert_eq!(CTL_BYTES, 256 + 256 * 4);
    }

    #[test]
    fn gone_words_tag_the_launch_and_hold_sixteen_sms_each() {
        let mut m = SmMask::empty();
        for sm in [0, 15, 16, 115, 131] {
            m.insert(sm);
        }
        assert_eq!(gone_word(&m, 0, 7), (7 << 16) | 0x8001);
        assert_eq!(gone_word(&m, 1, 7), (7 << 16) | 1);
        // SM 115 is bit 3 of word 7; SM 131 bit 3 of word 8.
        assert_eq!(gone_word(&m, 7, 0x1_0005), (5 << 16) | (1 << 3));
        assert_eq!(gone_word(&m, 8, 5), (5 << 16) | (1 << 3));
        assert_eq!(gone_word(&m, 15, 5) & 0xffff, 0);
        // The prelude reads the same layout.
        let p = crate::transform::PRELUDE;
        assert!(p.contains("(w >> 16) == (L.seq & 0xffffu) && ((w >> (s & 15u)) & 1u) != 0u"));
        assert!(p.contains("c->gone[s >> 4]"));
    }

    #[test]
    fn idle_record_has_no_resume_point() {
        let b = CtlHeader::idle_bytes(0xdead_beef_0000);
        let h = CtlHeader::from_bytes(&b).expect("header");
        assert_eq!(h.resume, NO_RESUME);
        assert_eq!(&b[HOST_RESULT_OFFSET..HOST_RESULT_OFFSET + 8], &0xdead_beef_0000u64.to_le_bytes());
        assert_eq!((h.claim, h.retreat_seq, h.result_next, h.result_seq), (0, 0, 0, 0));
    }

    #[test]
    fn masks() {
        let m = SmMask::range(0, 132);
        assert_eq!(m.count(), 132);
        assert!(m.contains(131) && !m.contains(132));
        assert_eq!(SmMask::range(5, 5).count(), 0);
    }
}

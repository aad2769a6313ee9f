//! The simulated GPU: an event-driven model in nanosecond virtual time.
//!
//! Per SM it tracks resident blocks against thread, block, register and
//! shared-memory capacity. Each SM has at most one *owner* launch that issues
//! new blocks to it; blocks of earlier owners may still be resident (leftover
//! execution). Preemption is per SM, by context switch, draining or flushing
//! (Tanasic 3.2). Memory bandwidth is shared: each SM draws at most its own
//! ceiling and all blocks share the device's DRAM bandwidth (`memory.rs`).
//! Two copy engines (H2D, D2H) move data over PCIe, FIFO; device-to-device
//! copies (and memsets) go through a third queue at device memory bandwidth
//! (each byte read and written once; they do not slow co-running blocks).

use crate::memory::{KernelMem, MemModel};
use crate::timing::{block_time, NoSimTiming};
use gpumux_engine::device::{
    Command, CopyDirection, Device, DeviceError, DeviceStats, Event, Mechanism, Message, ProtocolError, ReleaseCause,
    SavedBlock, TraceSpan,
};
use gpumux_engine::ids::{CopyId, KernelId, LaunchId, ProcessId, SmId};
use gpumux_engine::kernel::{DeviceInfo, KernelDesc, SimTiming};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::{later, ns_from_f64, Nanos, TimeOverflow};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

mod fast_forward;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[allow(clippy::enum_variant_names)] // each is something that finished
enum SimEvent {
    /// A resident block finished; `token` identifies it (stale if it was
    /// preempted meanwhile).
    BlockDone {
        sm: u16,
        token: u64,
    },
    /// A context save, or the fixed part of a preemption (`preempt_overhead_ns`),
    /// on an SM finished: the SM is free.
    SaveDone {
        sm: u16,
        launch: LaunchId,
    },
    CopyDone {
        engine: u8,
    },
}

#[derive(Clone, Copy, Debug)]
struct Resident {
    token: u64,
    launch: LaunchId,
    index: u64,
    end: Nanos,
}

#[derive(Default)]
struct SmModel {
    threads: u32,
    blocks: u32,
    regs: u64,
    smem: u64,
    resident: Vec<Resident>,
    owner: Option<LaunchId>,
    owner_since: Nanos,
    busy_since: Option<Nanos>,
    /// Saves in progress on this SM (the SM issues nothing while saving).
    saving: u32,
}

struct Launch {
    kernel: KernelId,
    process: ProcessId,
    desc: Arc<KernelDesc>,
    /// `desc`'s timing, checked present when the launch started.
    timing: SimTiming,
    time_key: u64,
    blocks: BlockRanges,
    restore: VecDeque<SavedBlock>,
    /// SMs it issues to.
    sms: SmSet,
    /// SMs it is being retreated from (draining or saving).
    leaving: SmSet,
    saved: Vec<SavedBlock>,
    resident: u64,
    completed: u64,
    exhausted: bool,
    bps: u32,
    mem: KernelMem,
    context_bytes: u64,
}

/// A block issued in the current instant whose time waits for the instant's
/// final bandwidth demand (see `memory.rs`, "Sampling").
#[derive(Clone, Copy, Debug)]
struct Pending {
    sm: u16,
    token: u64,
    /// Its time alone on the whole device.
    base: Nanos,
    mem: KernelMem,
}

struct CopyEngine {
    queue: VecDeque<(CopyId, ProcessId, u64)>,
    busy_until: Option<Nanos>,
    current: Option<(CopyId, ProcessId, Nanos)>,
}

/// The host link of a tuned device: bandwidth per direction (H2D, D2H), bytes/s, and latency.
#[derive(Clone, Copy, Debug)]
struct Link {
    bandwidth: [f64; 2],
    latency_ns: Nanos,
}

/// Parameters measured on a device (`gpumux calibrate`) that the simulator takes on top of
/// its preset. `Default` is the preset unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SimTuning {
    /// Host-to-device bandwidth, bytes/s (default: `DeviceInfo::pcie_bandwidth`).
    pub h2d_bandwidth: Option<f64>,
    /// Device-to-host bandwidth, bytes/s (default: `DeviceInfo::pcie_bandwidth`).
    pub d2h_bandwidth: Option<f64>,
    /// Fixed cost of one copy (default: `DeviceInfo::pcie_latency_ns`).
    pub link_latency_ns: Option<Nanos>,
    /// [`SimGpu::with_preempt_overhead`].
    pub preempt_overhead_ns: Nanos,
    /// Every retreat uses this mechanism (`None`: the policy's).
    pub mechanism: Option<Mechanism>,
    /// SMs are given back when a launch's last block ends, not when its last block is
    /// issued ([`SimGpu::with_tuning`]).
    #[serde(default)]
    pub release_at_end: bool,
    /// The memory model's saturation ratio κ (SMs' summed ceiling over DRAM bandwidth,
    /// `memory.rs`), where it was measured (`gpumux replay --probe`); `None`: the preset's.
    #[serde(default)]
    pub mem_ratio: Option<f64>,
}

/// A simulated GPU. Deterministic: the same commands at the same times with
/// the same seed give the same events.
pub struct SimGpu {
    info: DeviceInfo,
    seed: u64,
    now: Nanos,
    seq: u64,
    queue: BinaryHeap<Reverse<(Nanos, u64, SimEvent)>>,
    sms: Vec<SmModel>,
    launches: HashMap<LaunchId, Launch>,
    /// H2D, D2H (PCIe) and D2D (device memory).
    copies: [CopyEngine; 3],
    out: Vec<Event>,
    next_token: u64,
    /// Summed demand of resident blocks, in units of the device's bandwidth.
    mem_demand: f64,
    mem: MemModel,
    /// Fixed cost of each SM preemption beyond moving contexts (see
    /// [`SimGpu::with_preempt_overhead`]); 0 by default, as in Tanasic's model.
    preempt_overhead_ns: Nanos,
    /// Per-direction host link ([`SimGpu::with_tuning`]); `None`: the `DeviceInfo`'s one figure.
    /// Boxed: rarely set, and the simulator is moved by value.
    link: Option<Box<Link>>,
    /// Every retreat uses this mechanism whatever the policy asked ([`SimGpu::with_tuning`]).
    forced_mechanism: Option<Mechanism>,
    /// A launch keeps its SMs until its last block ends ([`SimTuning::release_at_end`]).
    release_at_end: bool,
    pending: Vec<Pending>,
    mem_stats: MemStats,
    stats: DeviceStats,
    trace: Option<Vec<TraceSpan>>,
    audit: Option<Audit>,
    /// The first time that did not fit in `Nanos`, found where no `Result`
    /// can be returned; `submit` and `advance` report it.
    fault: Option<TimeOverflow>,
    /// At most this many internal events per `advance` ([`SimGpu::with_event_budget`]).
    event_budget: Option<u64>,
    /// Waves of a lone grid of identical blocks are skipped in one step
    /// ([`SimGpu::with_fast_forward`]; `gpu/fast_forward.rs`).
    fast_forward: bool,
    /// Waves skipped so far ([`SimGpu::fast_forwarded`]).
    waves_skipped: u64,
    /// The fast forward's buffers and hint.
    ff: fast_forward::Scratch,
}

/// `at + plus`; when that overflows, records why in `fault` (first one
/// wins) and returns `Nanos::MAX`, which no event reaches before the run
/// stops with the error. A free function so callers can hold other fields.
fn checked_at(fault: &mut Option<TimeOverflow>, at: Nanos, plus: Nanos, what: impl FnOnce() -> String) -> Nanos {
    later(at, plus, what).unwrap_or_else(|e| {
        fault.get_or_insert(e);
        Nanos::MAX
    })
}

/// Whole nanoseconds of a modelled duration, or `Nanos::MAX` and a recorded
/// fault when it does not fit (huge copies on a slow link, say).
fn checked_ns(fault: &mut Option<TimeOverflow>, ns: f64, at: Nanos, what: impl FnOnce() -> String) -> Nanos {
    ns_from_f64(ns).unwrap_or_else(|| {
        fault.get_or_insert(TimeOverflow { what: what(), at, plus: Nanos::MAX });
        Nanos::MAX
    })
}

/// Nanoseconds, before rounding, to move `blocks` contexts of `context_bytes`
/// each between one SM and DRAM, at the SM's share of the device's bandwidth
/// (Tanasic's assumption; `tests/tanasic_save_time.rs` pins it): the cost of
/// a context save and of a restore.
fn context_move_ns(info: &DeviceInfo, blocks: u64, context_bytes: u64) -> f64 {
    blocks as f64 * context_bytes as f64 / info.per_sm_bandwidth() * 1e9
}

/// What the memory model did over a run (`SimGpu::mem_stats`): evidence for
/// how much DRAM contention shaped a result.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemStats {
    /// ∫ min(D, 1) dt: time-weighted DRAM utilisation (divide by the run's length).
    pub busy_ns: f64,
    /// Time with summed demand D > 1 (DRAM saturated).
    pub saturated_ns: f64,
    /// Σ of new blocks' times as issued: over `alone_ns`, the mean factor
    /// contention applied (< 1: faster than alone on the whole GPU, e.g. a
    /// memory-bound kernel on few SMs).
    pub issued_ns: f64,
    /// Σ of the same blocks' times had each run alone on the whole device.
    pub alone_ns: f64,
}

/// Every block issue and completion, for tests that check no block is lost
/// or run twice and that resumed kernels continue where they stopped.
#[derive(Clone, Debug, Default)]
pub struct Audit {
    /// (kernel, block index, restored from a saved context), in issue order.
    pub issued: Vec<(KernelId, u64, bool)>,
    /// (kernel, block index), in completion order.
    pub completed: Vec<(KernelId, u64)>,
}

impl SimGpu {
    /// When the simulator next has something to do: now if events wait to be
    /// reported or blocks issued at this instant wait for their times (an
    /// `advance` schedules their ends), else its earliest internal event
    /// (`None`: nothing runs). A driver that follows wall-clock time (the
    /// daemon) sleeps until then and calls `advance(Some(wall_now))`.
    pub fn next_event_at(&self) -> Option<Nanos> {
        if !self.out.is_empty() || !self.pending.is_empty() {
            return Some(self.now);
        }
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Moves time on towards `until` without letting anything happen: to
    /// `until`, or to one nanosecond before the next internal event if that
    /// comes first, processing no event (none is reported). The commands of
    /// the instant left behind are settled first (their blocks' times fixed),
    /// as [`Device::advance`] settles them. Returns the time reached.
    ///
    /// For a driver that follows wall-clock time and whose controller only
    /// learns of events at its polls (the daemon's simulated device): a
    /// command it submits after an idle stretch, or between polls, takes
    /// effect at its wall time, not at the last poll's, yet never after an
    /// event the controller has not seen (a `Grow` or `Retreat` of a launch
    /// that ended unseen would be refused). With events waiting to be
    /// reported it does nothing. A reproducible run (`gpumux run`) never
    /// calls it.
    pub fn catch_up(&mut self, until: Nanos) -> Nanos {
        if !self.out.is_empty() || until <= self.now {
            return self.now;
        }
        self.flush_pending();
        let to = match self.queue.peek() {
            Some(Reverse((t, _, _))) => until.min(t.saturating_sub(1)),
            None => until,
        };
        self.step_to(to);
        self.now
    }

    /// A simulated `info` with its preset's memory model ([`presets::memory_model`](crate::presets::memory_model)).
    pub fn new(info: DeviceInfo, seed: u64) -> Self {
        let n = info.num_sms as usize;
        let mem = crate::presets::memory_model(&info);
        let engine = || CopyEngine { queue: VecDeque::new(), busy_until: None, current: None };
        SimGpu {
            info,
            seed,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            sms: (0..n).map(|_| SmModel::default()).collect(),
            launches: HashMap::new(),
            copies: [engine(), engine(), engine()],
            out: Vec::new(),
            next_token: 0,
            mem_demand: 0.0,
            mem,
            preempt_overhead_ns: 0,
            link: None,
            forced_mechanism: None,
            release_at_end: false,
            pending: Vec::new(),
            mem_stats: MemStats::default(),
            stats: DeviceStats::default(),
            trace: None,
            audit: None,
            fault: None,
            event_budget: None,
            fast_forward: true,
            waves_skipped: 0,
            ff: fast_forward::Scratch::default(),
        }
    }

    /// Waves skipped in one step so far ([`SimGpu::with_fast_forward`]).
    pub fn fast_forwarded(&self) -> u64 {
        self.waves_skipped
    }

    /// Whether waves of a lone grid of identical blocks are skipped in one
    /// step, with the same results as event by event (the default: on;
    /// `gpu/fast_forward.rs` says when it applies). Off: every block end is
    /// simulated (what the equivalence tests compare it with).
    pub fn with_fast_forward(mut self, on: bool) -> Self {
        self.fast_forward = on;
        self
    }

    /// Bounds the work of one `advance`: it returns once it has processed
    /// `events` internal events (block ends, context saves, copies), at the
    /// instant it reached, even before `until`. For a driver that follows
    /// wall-clock time and must serve others between calls (the daemon): a
    /// grid of 2^31 short blocks otherwise held one call for minutes while
    /// simulated time chased the clock (issue 36, case 4). The device then
    /// runs behind the clock, which the driver sees from the time returned.
    /// Without it (the default) `advance` reaches `until`, as every
    /// reproducible run needs.
    pub fn with_event_budget(mut self, events: u64) -> Self {
        self.event_budget = Some(events.max(1));
        self
    }

    /// Replaces the memory model (devices that are not presets, cut-down copies).
    pub fn with_memory(mut self, mem: MemModel) -> Self {
        self.mem = mem;
        self
    }

    /// Charges every SM preemption a fixed `ns` on top of its mechanism: the SM
    /// issues nothing for `ns` after its context is saved (context switch), its
    /// last block finished (draining) or its blocks were dropped (flushing).
    /// Models what Tanasic et al.'s save-time model leaves out (pipeline drain
    /// and refill, TLB and cache state, the trap handler); the experiments'
    /// `--preempt-overhead-us` uses it to test how much of a result depends on
    /// preemption being cheap. The time counts as SM switch time.
    pub fn with_preempt_overhead(mut self, ns: Nanos) -> Self {
        self.preempt_overhead_ns = ns;
        self
    }

    /// Applies what `gpumux calibrate` measured on another device (docs/calibration.md):
    /// per-direction host-link bandwidth and latency, the fixed preemption cost, and the one
    /// mechanism that device has (a real GPU under gpumux drains at a chunk boundary whatever
    /// the policy asks, so a prediction of it must too), and when that device gives a launch's
    /// SMs back: gpumux's CUDA backend reports them when the launch's workers have all left,
    /// so the SMs of a grid's last wave stay its own until its last block ends, where a GPU's
    /// hardware scheduler (and this simulator by default) starts other kernels' blocks on them
    /// as soon as the grid has nothing left to issue. The default tuning changes nothing.
    pub fn with_tuning(mut self, t: &SimTuning) -> Self {
        if t.h2d_bandwidth.is_some() || t.d2h_bandwidth.is_some() || t.link_latency_ns.is_some() {
            self.link = Some(Box::new(Link {
                bandwidth: [
                    t.h2d_bandwidth.unwrap_or(self.info.pcie_bandwidth),
                    t.d2h_bandwidth.unwrap_or(self.info.pcie_bandwidth),
                ],
                latency_ns: t.link_latency_ns.unwrap_or(self.info.pcie_latency_ns),
            }));
        }
        self.preempt_overhead_ns = t.preempt_overhead_ns;
        self.forced_mechanism = t.mechanism;
        self.release_at_end = t.release_at_end;
        if let Some(k) = t.mem_ratio.filter(|k| k.is_finite() && *k > 0.0) {
            self.mem = MemModel { calibration_sms: self.mem.calibration_sms, ..MemModel::with_ratio(&self.info, k) };
        }
        self
    }

    /// Holds SM `sm` for the fixed preemption cost, then releases it to the
    /// engine (a `SaveDone`); false when there is no fixed cost.
    fn hold_for_overhead(&mut self, sm: usize, lid: LaunchId) -> bool {
        let ns = self.preempt_overhead_ns;
        if ns == 0 {
            return false;
        }
        self.sms[sm].saving += 1;
        self.stats.sm_switch_ns += ns as u128;
        let until = checked_at(&mut self.fault, self.now, ns, || format!("the preemption overhead on SM {sm}"));
        self.span(sm as u32, "preemption overhead".into(), "preempt", self.now, until, None);
        self.schedule(until, SimEvent::SaveDone { sm: sm as u16, launch: lid });
        true
    }

    /// The DRAM model this device runs with (its preset's, or one set by [`SimGpu::with_memory`]).
    pub fn memory(&self) -> &MemModel {
        &self.mem
    }

    /// What DRAM contention did so far, for reports that explain a result by it.
    pub fn mem_stats(&self) -> MemStats {
        self.mem_stats
    }

    /// Moves virtual time to `t`, integrating the DRAM counters over the step.
    fn step_to(&mut self, t: Nanos) {
        if t > self.now {
            let dt = (t - self.now) as f64;
            self.mem_stats.busy_ns += self.mem_demand.min(1.0) * dt;
            if self.mem_demand > 1.0 {
                self.mem_stats.saturated_ns += dt;
            }
            self.now = t;
        }
    }

    /// Starts recording every block issue and completion (tests).
    pub fn enable_audit(&mut self) {
        self.audit = Some(Audit::default());
    }

    /// Issues and completions recorded since [`SimGpu::enable_audit`], if it was called.
    pub fn audit(&self) -> Option<&Audit> {
        self.audit.as_ref()
    }

    /// Checks that no SM holds more than its capacity and that the
    /// bookkeeping agrees with the resident blocks (tests call it after every step).
    pub fn check_invariants(&self) -> Result<(), String> {
        for (i, s) in self.sms.iter().enumerate() {
            let lim = &self.info.sm;
            if s.threads > lim.max_threads
                || s.blocks > lim.max_blocks
                || s.regs > lim.registers as u64
                || s.smem > lim.smem_bytes as u64
            {
                return Err(format!(
                    "SM {i} over capacity: {} threads, {} blocks, {} regs, {} B smem",
                    s.threads, s.blocks, s.regs, s.smem
                ));
            }
            if s.blocks as usize != s.resident.len() {
                return Err(format!("SM {i} counts {} blocks but holds {}", s.blocks, s.resident.len()));
            }
            for r in &s.resident {
                let Some(l) = self.launches.get(&r.launch) else {
                    return Err(format!("SM {i} holds a block of ended launch {}", r.launch));
                };
                let mine = s.resident.iter().filter(|x| x.launch == r.launch).count() as u32;
                if mine > l.bps {
                    return Err(format!(
                        "SM {i} holds {mine} blocks of launch {}, occupancy allows {}",
                        r.launch, l.bps
                    ));
                }
            }
        }
        Ok(())
    }

    fn schedule(&mut self, at: Nanos, ev: SimEvent) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, ev)));
    }

    fn sm_ok(&self, sm: SmId) -> Result<usize, DeviceError> {
        let i = sm.0 as usize;
        if i < self.sms.len() {
            Ok(i)
        } else {
            Err(ProtocolError::NoSuchSm { sm, device: self.info.name.clone(), sms: self.sms.len() }.into())
        }
    }

    fn span(&mut self, lane: u32, name: String, category: &str, start: Nanos, end: Nanos, process: Option<ProcessId>) {
        if let Some(t) = self.trace.as_mut() {
            if end > start {
                t.push(TraceSpan { lane, name, category: category.into(), start_ns: start, end_ns: end, process });
            }
        }
    }

    fn set_owner(&mut self, sm: usize, owner: Option<LaunchId>) {
        let old = self.sms[sm].owner;
        if old == owner {
            return;
        }
        if let Some(l) = old {
            if self.trace.is_some() {
                let (name, proc_) =
                    self.launches.get(&l).map_or((String::from("?"), None), |x| (x.desc.name.clone(), Some(x.process)));
                let since = self.sms[sm].owner_since;
                self.span(sm as u32, name, "kernel", since, self.now, proc_);
            }
        }
        self.sms[sm].owner = owner;
        self.sms[sm].owner_since = self.now;
    }

    // ------------------------------------------------------------ block issue

    /// Whether one more block of `l` fits on SM `sm` now.
    fn fits(&self, sm: usize, lid: LaunchId, l: &Launch) -> bool {
        let s = &self.sms[sm];
        let d = &l.desc.shape;
        let mine = s.resident.iter().filter(|r| r.launch == lid).count() as u32;
        s.saving == 0
            && mine < l.bps
            && s.blocks < self.info.sm.max_blocks
            && s.threads + d.threads_per_block <= self.info.sm.max_threads
            && s.regs + d.regs_per_block() <= self.info.sm.registers as u64
            && s.smem + d.smem_per_block as u64 <= self.info.sm.smem_bytes as u64
    }

    /// Issues blocks of the SM's owner until it is full or the owner has none left.
    fn fill_sm(&mut self, sm: usize) {
        let Some(lid) = self.sms[sm].owner else { return };
        loop {
            let Some(l) = self.launches.get(&lid) else { return };
            if l.blocks.is_empty() && l.restore.is_empty() {
                break;
            }
            if !self.fits(sm, lid, l) {
                return;
            }
            let l = self.launches.get_mut(&lid).expect("checked above");
            // Preempted blocks first, keeping their number small (Tanasic 3.3, PTBQ).
            let restored = !l.restore.is_empty();
            // A restored block keeps the remaining time it was saved with
            // (already contended); a new one gets its time at the end of the instant.
            let (index, work) = if let Some(sb) = l.restore.pop_front() {
                let what = || format!("restoring block {} of kernel `{}` on SM {sm}", sb.index, l.desc.name);
                // Truncated, where a save rounds up: rounding up here too (the
                // consistent choice) moves every context-switching result by
                // a little, so it waits for a decision of its own.
                let restore_ns =
                    checked_ns(&mut self.fault, context_move_ns(&self.info, 1, l.context_bytes), self.now, what);
                self.stats.sm_switch_ns += restore_ns as u128;
                (sb.index, checked_at(&mut self.fault, restore_ns, sb.remaining_ns, what))
            } else {
                let Some(b) = l.blocks.pop_first() else { break };
                (b, block_time(&l.timing, self.seed, l.time_key, b))
            };
            l.resident += 1;
            if let Some(a) = self.audit.as_mut() {
                a.issued.push((l.kernel, index, restored));
            }
            let (d, mem) = (Arc::clone(&l.desc), l.mem);
            self.mem_demand += mem.demand_per_block;
            let token = self.next_token;
            self.next_token += 1;
            let s = &mut self.sms[sm];
            s.threads += d.shape.threads_per_block;
            s.blocks += 1;
            s.regs += d.shape.regs_per_block();
            s.smem += d.shape.smem_per_block as u64;
            if s.resident.is_empty() {
                s.busy_since = Some(self.now);
            }
            // Provisional end (what a context save in this same instant sees).
            let end = checked_at(&mut self.fault, self.now, work.max(1), || {
                format!("block {index} of kernel `{}` on SM {sm}", d.name)
            });
            s.resident.push(Resident { token, launch: lid, index, end });
            if restored {
                self.schedule(end, SimEvent::BlockDone { sm: sm as u16, token });
            } else {
                self.pending.push(Pending { sm: sm as u16, token, base: work, mem });
            }
        }
        self.check_exhausted(lid);
    }

    /// Fixes the times of the blocks issued in the current instant, now that
    /// the instant's demand is known, and schedules their completions.
    fn flush_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let demand = self.mem_demand;
        let mut pending = std::mem::take(&mut self.pending);
        for p in pending.drain(..) {
            let s = &mut self.sms[p.sm as usize];
            // Gone already: preempted in the same instant.
            let Some(r) = s.resident.iter_mut().find(|r| r.token == p.token) else { continue };
            let work = p.mem.block_time(p.base, demand).max(1);
            r.end = checked_at(&mut self.fault, self.now, work, || format!("block {} on SM {}", r.index, p.sm));
            let end = r.end;
            self.mem_stats.issued_ns += work as f64;
            self.mem_stats.alone_ns += p.base as f64;
            self.schedule(end, SimEvent::BlockDone { sm: p.sm, token: p.token });
        }
        self.pending = pending;
    }

    /// A launch with nothing left to issue gives all its SMs back (leftover
    /// execution: its resident blocks keep running).
    fn check_exhausted(&mut self, lid: LaunchId) {
        let Some(l) = self.launches.get_mut(&lid) else { return };
        if l.exhausted || !l.blocks.is_empty() || !l.restore.is_empty() {
            return;
        }
        l.exhausted = true;
        if self.release_at_end {
            // Its SMs go back with its last block (`check_ended`).
            self.check_ended(lid);
            return;
        }
        let sms = std::mem::take(&mut l.sms);
        for sm in sms.iter() {
            self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Exhausted });
            if self.sms[sm.0 as usize].owner == Some(lid) {
                self.set_owner(sm.0 as usize, None);
            }
        }
        self.check_ended(lid);
    }

    /// Ends a launch that holds nothing on the device any more.
    fn check_ended(&mut self, lid: LaunchId) {
        let Some(l) = self.launches.get(&lid) else { return };
        if !l.leaving.is_empty() || l.resident > 0 {
            return;
        }
        if !l.sms.is_empty() {
            // Released at the end (`release_at_end`): once nothing is left to issue and its
            // last block is done, the launch gives every SM back and ends.
            let done = self.release_at_end && l.exhausted && l.blocks.is_empty() && l.restore.is_empty();
            if !done {
                return;
            }
            let sms = std::mem::take(&mut self.launch_mut(lid).sms);
            for sm in sms.iter() {
                self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Exhausted });
                if self.sms[sm.0 as usize].owner == Some(lid) {
                    self.set_owner(sm.0 as usize, None);
                }
            }
        }
        let Some(mut l) = self.launches.remove(&lid) else { return };
        // Unissued saved blocks go back as saved contexts.
        let mut saved = std::mem::take(&mut l.saved);
        saved.extend(l.restore.drain(..));
        self.out.push(Event::LaunchEnded {
            launch: lid,
            remaining: std::mem::take(&mut l.blocks),
            saved,
            completed: l.completed,
        });
    }

    /// Removes a resident block from its SM's accounting.
    fn evict(&mut self, sm: usize, pos: usize) -> Resident {
        let r = self.sms[sm].resident.swap_remove(pos);
        if let Some(l) = self.launches.get_mut(&r.launch) {
            l.resident -= 1;
            self.mem_demand -= l.mem.demand_per_block;
            let d = &l.desc.shape;
            let s = &mut self.sms[sm];
            s.threads -= d.threads_per_block;
            s.blocks -= 1;
            s.regs -= d.regs_per_block();
            s.smem -= d.smem_per_block as u64;
        }
        if self.mem_demand < 1e-9 {
            self.mem_demand = 0.0; // keep float drift from accumulating
        }
        let s = &mut self.sms[sm];
        if s.resident.is_empty() {
            if let Some(since) = s.busy_since.take() {
                self.stats.sm_busy_ns += (self.now - since) as u128;
            }
        }
        r
    }

    fn on_block_done(&mut self, sm: usize, token: u64) {
        let Some(pos) = self.sms[sm].resident.iter().position(|r| r.token == token) else {
            return; // preempted before it finished
        };
        let r = self.evict(sm, pos);
        self.stats.blocks_completed += 1;
        let smid = SmId(sm as u16);
        let mut drained = false;
        if let Some(l) = self.launches.get_mut(&r.launch) {
            l.completed += 1;
            if let Some(a) = self.audit.as_mut() {
                a.completed.push((l.kernel, r.index));
            }
            // A drained SM is free once its last block of the launch is done.
            drained = l.leaving.contains(smid)
                && !self.sms[sm].resident.iter().any(|x| x.launch == r.launch)
                && self.sms[sm].saving == 0;
        }
        // With a fixed preemption cost the SM stays `leaving` until its SaveDone.
        if drained && !self.hold_for_overhead(sm, r.launch) {
            if let Some(l) = self.launches.get_mut(&r.launch) {
                l.leaving.remove(smid);
            }
            self.out.push(Event::SmReleased { launch: r.launch, sm: smid, cause: ReleaseCause::Retreated });
        }
        self.check_ended(r.launch);
        self.fill_sm(sm);
    }

    // ---------------------------------------------------------------- retreat

    fn retreat(&mut self, lid: LaunchId, sms: SmSet, mechanism: Mechanism) -> Result<(), DeviceError> {
        let Some(l) = self.launches.get_mut(&lid) else {
            return Err(ProtocolError::UnknownLaunch { launch: lid, by: Message::Retreat }.into());
        };
        // SMs it no longer holds (released on exhaustion meanwhile) are already free.
        let sms = sms.intersection(&l.sms);
        l.sms = l.sms.difference(&sms);
        let idempotent = l.desc.idempotent;
        let context_bytes = l.context_bytes;
        for sm in sms.iter() {
            let i = sm.0 as usize;
            if self.sms[i].owner == Some(lid) {
                self.set_owner(i, None);
            }
            let mine: Vec<usize> = self.sms[i]
                .resident
                .iter()
                .enumerate()
                .filter(|(_, r)| r.launch == lid)
                .map(|(p, _)| p)
                .rev()
                .collect();
            if mine.is_empty() {
                self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Retreated });
                continue;
            }
            match mechanism {
                Mechanism::Drain => {
                    self.launch_mut(lid).leaving.insert(sm);
                }
                Mechanism::Flush if idempotent => {
                    // Drop the blocks; they run again from the start later.
                    for p in mine {
                        let r = self.evict(i, p);
                        self.stats.blocks_rerun += 1;
                        self.launch_mut(lid).blocks.insert_block(r.index);
                    }
                    if self.hold_for_overhead(i, lid) {
                        self.launch_mut(lid).leaving.insert(sm);
                    } else {
                        self.out.push(Event::SmReleased { launch: lid, sm, cause: ReleaseCause::Retreated });
                    }
                }
                // A non-idempotent block cannot be dropped: it drains.
                Mechanism::Flush => {
                    self.launch_mut(lid).leaving.insert(sm);
                }
                Mechanism::ContextSwitch => {
                    let n = mine.len() as u64;
                    let what = || format!("a context save of {n} blocks on SM {sm}");
                    let save_ns = checked_ns(
                        &mut self.fault,
                        context_move_ns(&self.info, n, context_bytes).ceil(),
                        self.now,
                        what,
                    );
                    let save_ns = checked_at(&mut self.fault, save_ns, self.preempt_overhead_ns, what);
                    for p in mine {
                        let r = self.evict(i, p);
                        let remaining_ns = r.end.saturating_sub(self.now);
                        self.launch_mut(lid).saved.push(SavedBlock { index: r.index, remaining_ns });
                    }
                    self.stats.context_saves += n;
                    self.stats.sm_switch_ns += save_ns as u128;
                    self.sms[i].saving += 1;
                    self.launch_mut(lid).leaving.insert(sm);
                    let until = checked_at(&mut self.fault, self.now, save_ns, what);
                    self.span(i as u32, "save context".into(), "preempt", self.now, until, None);
                    self.schedule(until, SimEvent::SaveDone { sm: sm.0, launch: lid });
                }
            }
        }
        self.check_ended(lid);
        Ok(())
    }

    fn launch_mut(&mut self, lid: LaunchId) -> &mut Launch {
        self.launches.get_mut(&lid).expect("launch checked by caller")
    }

    fn on_save_done(&mut self, sm: usize, lid: LaunchId) {
        self.sms[sm].saving -= 1;
        if let Some(l) = self.launches.get_mut(&lid) {
            l.leaving.remove(SmId(sm as u16));
        }
        self.out.push(Event::SmReleased { launch: lid, sm: SmId(sm as u16), cause: ReleaseCause::Retreated });
        self.check_ended(lid);
        self.fill_sm(sm);
    }

    // ------------------------------------------------------------------ copies

    fn start_copy(&mut self, e: usize) {
        if self.copies[e].current.is_some() {
            return;
        }
        let Some((id, p, bytes)) = self.copies[e].queue.pop_front() else { return };
        let what = || format!("a copy of {bytes} bytes for process {p}");
        let ns = if e == 2 {
            // Read and write every byte in device memory; no link latency.
            checked_ns(&mut self.fault, 2.0 * bytes as f64 / self.info.mem_bandwidth * 1e9, self.now, what)
        } else {
            let (bandwidth, latency) = match &self.link {
                Some(l) => (l.bandwidth[e], l.latency_ns),
                None => (self.info.pcie_bandwidth, self.info.pcie_latency_ns),
            };
            let transfer = checked_ns(&mut self.fault, bytes as f64 / bandwidth * 1e9, self.now, what);
            checked_at(&mut self.fault, latency, transfer, what)
        };
        let end = checked_at(&mut self.fault, self.now, ns, what);
        self.copies[e].current = Some((id, p, self.now));
        self.copies[e].busy_until = Some(end);
        // Saturating: a copy too large for the clock is a fault, not a panic of the sum.
        self.stats.bytes_copied = self.stats.bytes_copied.saturating_add(bytes);
        self.schedule(end, SimEvent::CopyDone { engine: e as u8 });
    }

    fn on_copy_done(&mut self, e: usize) {
        if let Some((id, p, start)) = self.copies[e].current.take() {
            let lane = self.info.num_sms as u32 + e as u32;
            let name = ["H2D", "D2H", "D2D"][e];
            self.span(lane, name.into(), "copy", start, self.now, Some(p));
            self.out.push(Event::CopyDone { copy: id });
        }
        self.copies[e].busy_until = None;
        self.start_copy(e);
    }
}

impl Device for SimGpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, now: Nanos, command: Command) -> Result<(), DeviceError> {
        if now > self.now {
            return Err(ProtocolError::AheadOfDevice { at: now, device_now: self.now }.into());
        }
        match command {
            Command::Launch { launch, kernel, process, op: _, priority: _, desc, time_key, blocks, restore, sms } => {
                if self.launches.contains_key(&launch) {
                    return Err(ProtocolError::LaunchedTwice { launch }.into());
                }
                if sms.is_empty() {
                    return Err(ProtocolError::NoSms { launch, kernel: desc.name.clone() }.into());
                }
                for sm in sms.iter() {
                    let i = self.sm_ok(sm)?;
                    if let Some(o) = self.sms[i].owner {
                        return Err(ProtocolError::SmOwned { launch, sm, owner: o, by: Message::Launch }.into());
                    }
                }
                let Some(timing) = desc.sim_timing else {
                    return Err(DeviceError::backend(
                        format!("launch {launch} of `{}`", desc.name),
                        NoSimTiming { kernel: desc.name.clone() },
                    ));
                };
                let bps = self.info.blocks_per_sm(&desc).map_err(ProtocolError::from)?;
                let mem = KernelMem::new(timing.mem_intensity, desc.shape.blocks, bps, &self.info, &self.mem);
                let context_bytes = desc.shape.context_bytes();
                self.launches.insert(
                    launch,
                    Launch {
                        kernel,
                        process,
                        desc,
                        timing,
                        time_key,
                        blocks,
                        restore: restore.into(),
                        sms,
                        leaving: SmSet::EMPTY,
                        saved: Vec::new(),
                        resident: 0,
                        completed: 0,
                        exhausted: false,
                        bps,
                        mem,
                        context_bytes,
                    },
                );
                for sm in sms.iter() {
                    self.set_owner(sm.0 as usize, Some(launch));
                }
                for sm in sms.iter() {
                    self.fill_sm(sm.0 as usize);
                }
                self.check_exhausted(launch);
            }
            Command::Grow { launch, sms } => {
                let Some(l) = self.launches.get_mut(&launch) else {
                    return Err(ProtocolError::UnknownLaunch { launch, by: Message::Grow }.into());
                };
                if l.exhausted {
                    // Nothing left to issue: the SMs were never taken, hand them straight back.
                    for sm in sms.iter() {
                        self.out.push(Event::SmReleased { launch, sm, cause: ReleaseCause::Exhausted });
                    }
                    return Ok(());
                }
                l.sms = l.sms.union(&sms);
                for sm in sms.iter() {
                    let i = self.sm_ok(sm)?;
                    if let Some(o) = self.sms[i].owner {
                        return Err(ProtocolError::SmOwned { launch, sm, owner: o, by: Message::Grow }.into());
                    }
                    self.set_owner(i, Some(launch));
                }
                for sm in sms.iter() {
                    self.fill_sm(sm.0 as usize);
                }
            }
            Command::Retreat { launch, sms, mechanism } => {
                self.retreat(launch, sms, self.forced_mechanism.unwrap_or(mechanism))?
            }
            Command::Copy { copy, op: _, process, direction, bytes } => {
                let e = match direction {
                    CopyDirection::HostToDevice => 0,
                    CopyDirection::DeviceToHost => 1,
                    CopyDirection::DeviceToDevice => 2,
                };
                self.copies[e].queue.push_back((copy, process, bytes));
                self.start_copy(e);
            }
        }
        self.fault.take().map_or(Ok(()), |e| Err(e.into()))
    }

    fn advance(&mut self, until: Option<Nanos>, events: &mut Vec<Event>) -> Result<Nanos, DeviceError> {
        let spent_before = self.stats.events;
        loop {
            if let Some(e) = self.fault.take() {
                return Err(e.into());
            }
            if self.event_budget.is_some_and(|b| self.stats.events - spent_before >= b) && self.out.is_empty() {
                return Ok(self.now);
            }
            if !self.out.is_empty() {
                events.append(&mut self.out);
                return Ok(self.now);
            }
            // The caller has submitted everything for this instant: time moves on.
            self.flush_pending();
            if let Some(e) = self.fault.take() {
                return Err(e.into());
            }
            let next = self.queue.peek().map(|Reverse((t, _, _))| *t);
            match (next, until) {
                (None, None) => return Err(DeviceError::Stalled { now: self.now }),
                (None, Some(u)) => {
                    self.step_to(u);
                    return Ok(self.now);
                }
                (Some(t), Some(u)) if u < t => {
                    self.step_to(u);
                    return Ok(self.now);
                }
                _ => {}
            }
            // A lone grid's waves up to `until`, at once where it can.
            if self.fast_forward(until) {
                continue;
            }
            // Process every internal event at the next instant, then report.
            let Some(Reverse((t, _, _))) = self.queue.peek().copied() else { continue };
            self.step_to(t);
            while let Some(Reverse((t2, _, ev))) = self.queue.peek().copied() {
                if t2 != t {
                    break;
                }
                self.queue.pop();
                self.stats.events += 1;
                match ev {
                    SimEvent::BlockDone { sm, token } => self.on_block_done(sm as usize, token),
                    SimEvent::SaveDone { sm, launch } => self.on_save_done(sm as usize, launch),
                    SimEvent::CopyDone { engine } => self.on_copy_done(engine as usize),
                }
            }
        }
    }

    fn stats(&self) -> DeviceStats {
        self.stats.clone()
    }

    fn enable_trace(&mut self) {
        self.trace = Some(Vec::new());
    }

    fn take_trace(&mut self) -> Vec<TraceSpan> {
        // Close the spans still open.
        for sm in 0..self.sms.len() {
            if self.sms[sm].owner.is_some() {
                self.set_owner(sm, None);
            }
        }
        self.trace.take().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_engine::ids::OpId;
    use gpumux_engine::kernel::KernelShape;

    #[test]
    fn a_kernel_without_timing_is_refused_at_launch_with_its_name() {
        let mut gpu = SimGpu::new(crate::presets::k20c(), 1);
        let desc = Arc::new(KernelDesc::new("cuda-only", KernelShape::new(10, 128, 32)));
        let launch = Command::Launch {
            launch: LaunchId(0),
            kernel: KernelId(0),
            op: OpId(0),
            process: ProcessId(0),
            priority: 0,
            desc: Arc::clone(&desc),
            time_key: 0,
            blocks: BlockRanges::full(desc.shape.blocks),
            restore: Vec::new(),
            sms: SmSet::range(0, 13),
        };
        let err = gpu.submit(0, launch).expect_err("no timing");
        // The error says what the device was doing; its source, why.
        assert!(err.to_string().contains("of `cuda-only`"), "{err}");
        let why = std::error::Error::source(&err).map(|e| e.to_string()).unwrap_or_default();
        assert!(why.contains("kernel `cuda-only` has no simulator timing"), "{err}: {why}");
        // Nothing was started: the device holds no launch and no SM owner.
        assert!(gpu.launches.is_empty() && gpu.sms.iter().all(|s| s.owner.is_none()));
    }

    /// A 2-block kernel of one thread with `context_bytes` of registers, one
    /// block resident per SM, 10 µs blocks, on SM 0 of a K20c (16 GB/s per SM:
    /// 16 bytes a nanosecond).
    fn switching(context_bytes: u32) -> (SimGpu, Arc<KernelDesc>) {
        let shape = KernelShape::new(2, 1, context_bytes / 4).with_max_blocks_per_sm(1);
        let desc = Arc::new(KernelDesc::new("k", shape).with_sim_timing(SimTiming::new(10_000)));
        (SimGpu::new(crate::presets::k20c(), 1), desc)
    }

    fn launch(id: u64, desc: &Arc<KernelDesc>, blocks: BlockRanges, restore: Vec<SavedBlock>) -> Command {
        Command::Launch {
            launch: LaunchId(id),
            kernel: KernelId(0),
            op: OpId(0),
            process: ProcessId(0),
            priority: 0,
            desc: Arc::clone(desc),
            time_key: 0,
            blocks,
            restore,
            sms: SmSet::range(0, 1),
        }
    }

    /// `catch_up` moves time up to one nanosecond before the next event and
    /// no further, reports nothing, and changes nothing a later `advance`
    /// reports: the same events at the same times as without it.
    #[test]
    fn catching_up_stops_before_the_next_event_and_changes_no_event() {
        let run = |catch_up: &[Nanos]| {
            let (mut gpu, desc) = switching(64);
            gpu.submit(0, launch(0, &desc, BlockRanges::full(2), Vec::new())).expect("launch");
            let reached: Vec<Nanos> = catch_up.iter().map(|&t| gpu.catch_up(t)).collect();
            let mut events = Vec::new();
            let mut times = Vec::new();
            while gpu.next_event_at().is_some() {
                let before = events.len();
                let t = gpu.advance(Some(50_000), &mut events).expect("run");
                times.extend(std::iter::repeat_n(t, events.len() - before));
            }
            (reached, format!("{events:?}"), times)
        };
        let (reached, events, times) = run(&[4_000, 50_000, 60_000]);
        // Block 0 ends at 10 µs: time stops just before it, however far the clock is.
        assert_eq!(reached, vec![4_000, 9_999, 9_999]);
        let (_, plain_events, plain_times) = run(&[]);
        assert_eq!((events, times), (plain_events, plain_times));
        // An idle device follows the clock; one with events to report stays.
        let mut idle = SimGpu::new(crate::presets::k20c(), 1);
        assert_eq!(idle.catch_up(7_000), 7_000);
        let (mut gpu, desc) = switching(64);
        gpu.submit(0, launch(0, &desc, BlockRanges::full(1), Vec::new())).expect("launch");
        assert_eq!(gpu.catch_up(7_000), 0, "its SM released on exhaustion waits to be reported");
    }

    /// Saves block 0 at 5 µs, restores it at once; returns the save's
    /// length and when the relaunch ends.
    fn save_and_restore(context_bytes: u32) -> (Nanos, Nanos, DeviceStats) {
        let (mut gpu, desc) = switching(context_bytes);
        let mut events = Vec::new();
        gpu.submit(0, launch(0, &desc, BlockRanges::full(2), Vec::new())).expect("launch");
        assert_eq!(gpu.advance(Some(5_000), &mut events).expect("run"), 5_000);
        let retreat =
            Command::Retreat { launch: LaunchId(0), sms: SmSet::range(0, 1), mechanism: Mechanism::ContextSwitch };
        gpu.submit(5_000, retreat).expect("retreat");
        let mut saved = None;
        let mut t = 5_000;
        while saved.is_none() {
            t = gpu.advance(None, &mut events).expect("save");
            for e in events.drain(..) {
                if let Event::LaunchEnded { saved: s, remaining, .. } = e {
                    assert_eq!(
                        (remaining.len(), remaining.ranges().first()),
                        (1, Some(&(1..2))),
                        "block 1 never issued"
                    );
                    saved = Some(s);
                }
            }
        }
        let saved = saved.unwrap_or_default();
        assert_eq!(saved, vec![SavedBlock { index: 0, remaining_ns: 5_000 }]);
        let save_ns = t - 5_000;
        let mut rest = BlockRanges::new();
        rest.insert(1..2);
        gpu.submit(t, launch(1, &desc, rest, saved)).expect("relaunch");
        loop {
            let now = gpu.advance(None, &mut events).expect("rest");
            if events.drain(..).any(|e| matches!(e, Event::LaunchEnded { .. })) {
                return (save_ns, now, gpu.stats());
            }
        }
    }

    #[test]
    fn a_restore_costs_what_a_save_of_one_block_costs() {
        // 16 000 bytes at 16 bytes/ns: 1 000 ns each way, no rounding.
        let (save_ns, end, stats) = save_and_restore(16_000);
        assert_eq!(save_ns, 1_000);
        // Relaunch at 6 000: restore 1 000 + the 5 000 left, then block 1's 10 000.
        assert_eq!(end, 6_000 + 1_000 + 5_000 + 10_000);
        assert_eq!((stats.sm_switch_ns, stats.context_saves), (2_000, 1));
    }

    #[test]
    fn a_fractional_move_is_rounded_up_when_saved_and_down_when_restored() {
        // 16 008 bytes: 1 000.5 ns. The save takes 1 001, the restore 1 000
        // (kept as it was; see the comment in `fill_sm`).
        let (save_ns, end, stats) = save_and_restore(16_008);
        assert_eq!(save_ns, 1_001);
        assert_eq!(end, 6_001 + 1_000 + 5_000 + 10_000);
        assert_eq!(stats.sm_switch_ns, 2_001);
    }

    #[test]
    fn a_tuning_sets_the_saturation_ratio() {
        let info = crate::presets::h200();
        let tuned =
            SimGpu::new(info.clone(), 1).with_tuning(&SimTuning { mem_ratio: Some(4.0), ..SimTuning::default() });
        assert!((tuned.memory().saturation_ratio(&info) - 4.0).abs() < 1e-9);
        let plain = SimGpu::new(info.clone(), 1).with_tuning(&SimTuning::default());
        assert_eq!(plain.memory(), &crate::presets::h200_memory());
    }

    #[test]
    fn a_tuning_sets_each_link_direction_and_forces_the_mechanism() {
        let tuning = SimTuning {
            h2d_bandwidth: Some(1e9),
            d2h_bandwidth: Some(2e9),
            link_latency_ns: Some(3_000),
            preempt_overhead_ns: 0,
            mechanism: Some(Mechanism::Drain),
            release_at_end: false,
            mem_ratio: None,
        };
        let mut gpu = SimGpu::new(crate::presets::k20c(), 1).with_tuning(&tuning);
        let mut events = Vec::new();
        let mut copy = |gpu: &mut SimGpu, id: u64, direction: CopyDirection, at: Nanos| {
            let cmd =
                Command::Copy { copy: CopyId(id), op: OpId(id), process: ProcessId(0), direction, bytes: 1_000_000 };
            gpu.submit(at, cmd).expect("copy");
            gpu.advance(None, &mut events).expect("copy runs")
        };
        // 1 MB at 1 GB/s: 1 ms, plus 3 µs; at 2 GB/s: 0.5 ms plus 3 µs.
        let t = copy(&mut gpu, 0, CopyDirection::HostToDevice, 0);
        assert_eq!(t, 1_003_000);
        assert_eq!(copy(&mut gpu, 1, CopyDirection::DeviceToHost, t) - t, 503_000);

        // A context switch asked for is a drain: the block finishes, nothing is saved.
        let (_, desc) = switching(16_000);
        let mut gpu = SimGpu::new(crate::presets::k20c(), 1).with_tuning(&tuning);
        gpu.submit(0, launch(0, &desc, BlockRanges::full(2), Vec::new())).expect("launch");
        assert_eq!(gpu.advance(Some(5_000), &mut events).expect("run"), 5_000);
        let retreat =
            Command::Retreat { launch: LaunchId(0), sms: SmSet::range(0, 1), mechanism: Mechanism::ContextSwitch };
        gpu.submit(5_000, retreat).expect("retreat");
        loop {
            let now = gpu.advance(None, &mut events).expect("drain");
            if let Some(Event::LaunchEnded { saved, remaining, .. }) =
                events.drain(..).find(|e| matches!(e, Event::LaunchEnded { .. }))
            {
                assert!(saved.is_empty());
                assert_eq!(remaining.len(), 1, "block 1 never issued");
                assert_eq!(now, 10_000, "block 0 ran to its end");
                break;
            }
        }
        assert_eq!(gpu.stats().context_saves, 0);
    }

    /// Three 10 µs blocks, one per SM, on two SMs: the third is issued at 10 µs on the SM
    /// that freed first. By default both SMs go back then (nothing left to issue: the idle one
    /// is free for another launch); released at the end, both go back at 20 µs, with the
    /// launch's end.
    #[test]
    fn released_at_end_a_launch_keeps_its_sms_until_its_last_block_ends() {
        let (_, desc) = switching(16);
        let released = |release_at_end: bool| {
            let tuning = SimTuning { release_at_end, ..SimTuning::default() };
            let mut gpu = SimGpu::new(crate::presets::k20c(), 1).with_tuning(&tuning);
            let mut cmd = launch(0, &desc, BlockRanges::full(3), Vec::new());
            if let Command::Launch { sms, .. } = &mut cmd {
                *sms = SmSet::range(0, 2);
            }
            gpu.submit(0, cmd).expect("launch");
            let mut events = Vec::new();
            let mut seen = Vec::new();
            for until in [5_000, 15_000, 25_000] {
                gpu.advance(Some(until), &mut events).expect("run");
                for e in events.drain(..) {
                    match e {
                        Event::SmReleased { sm, .. } => seen.push((until, format!("sm{}", sm.0))),
                        Event::LaunchEnded { completed, .. } => seen.push((until, format!("end{completed}"))),
                        _ => {}
                    }
                }
            }
            seen
        };
        let at = |seen: &[(Nanos, String)], what: &str| seen.iter().find(|(_, w)| w == what).map(|(t, _)| *t);
        let by_issue = released(false);
        assert_eq!(at(&by_issue, "sm0"), Some(15_000), "{by_issue:?}");
        assert_eq!(at(&by_issue, "sm1"), Some(15_000), "{by_issue:?}");
        assert_eq!(at(&by_issue, "end3"), Some(25_000), "{by_issue:?}");
        let by_end = released(true);
        assert_eq!(at(&by_end, "sm0"), Some(25_000), "{by_end:?}");
        assert_eq!(at(&by_end, "sm1"), Some(25_000), "{by_end:?}");
        assert_eq!(at(&by_end, "end3"), Some(25_000), "{by_end:?}");
    }
}

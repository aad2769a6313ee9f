//! The scheduling engine: a deterministic state machine with no I/O.
//!
//! It runs the processes of a workload (their streams of copies and kernels and
//! their host time), keeps the SM status table and the active kernels, asks the
//! policy for decisions whenever something changes, and turns those into
//! device commands. A driver (`crate::driver`) moves commands to a device and
//! events back, at the times the device reports.

use crate::active::ActiveList;
use crate::device::{Command, CopyDirection, Event, ReleaseCause, SavedBlock};
use crate::ids::{CopyId, KernelId, LaunchId, ProcessId, SmId};
use crate::kernel::{DeviceInfo, DoesNotFit};
use crate::model::{Op, ProcessSpec, Workload};
use crate::policy::{position_of, ActiveKernel, Decision, Policy, SchedView, SmState};
use crate::ranges::BlockRanges;
use crate::record::{PreemptionSample, ProcessRecord, RunRecord, RunSpan};
use crate::smset::SmSet;
use crate::time::{later, Nanos, TimeOverflow};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

/// Scheduling rounds allowed at one instant before the engine calls it a livelock.
const MAX_POLICY_RUNS_PER_INSTANT: u32 = 100_000;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    #[error("policy `{policy}` made an invalid decision: {what}")]
    Policy { policy: String, what: String },
    #[error("device broke the protocol: {0}")]
    Protocol(String),
    #[error("the workload has no processes")]
    Empty,
    #[error("device has {have} SMs, more than the {max} gpumux supports")]
    TooManySms { have: u16, max: usize },
    #[error(transparent)]
    TimeOverflow(#[from] TimeOverflow),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Arrival(ProcessId),
    HostDone(ProcessId),
}

struct ProcState {
    spec: Arc<ProcessSpec>,
    name: Arc<str>,
    arrived: bool,
    finished: bool,
    runs_started: u32,
    op_idx: usize,
    host_busy: bool,
    /// GPU operations queued on the stream (index into `spec.ops`, when the
    /// host issued it); the head is in flight.
    stream: VecDeque<(usize, Nanos)>,
    run_start: Nanos,
    runs: Vec<RunSpan>,
}

/// Engine-private bookkeeping of an active kernel (what policies need not see).
struct KernelWork {
    pending: BlockRanges,
    saved: Vec<SavedBlock>,
    launches: Vec<LaunchId>,
    time_key: u64,
}

struct LaunchState {
    kernel: KernelId,
    sms: SmSet,
    exhausted: bool,
}

pub struct Engine {
    device: DeviceInfo,
    policy: Box<dyn Policy>,
    now: Nanos,
    procs: Vec<ProcState>,
    /// Workload process id of each slot of `procs`.
    proc_ids: Vec<ProcessId>,
    replay_min_runs: Option<u32>,
    /// With `replay_min_runs`: processes that have completed fewer runs
    /// (kept as a count so ending a run does not scan every process).
    short_of_min_runs: usize,
    /// Processes not finished yet (`is_finished` is asked after every event).
    unfinished: usize,
    kernels: ActiveList,
    work: BTreeMap<KernelId, KernelWork>,
    launches: HashMap<LaunchId, LaunchState>,
    copies: HashMap<CopyId, ProcessId>,
    sms: Vec<SmState>,
    /// When each reserved SM was asked for, for preemption latency.
    reserved_at: Vec<Nanos>,
    out: VecDeque<Command>,
    timers: BinaryHeap<Reverse<(Nanos, u64, Timer)>>,
    timer_seq: u64,
    dirty: bool,
    next_kernel: u64,
    next_launch: u64,
    next_copy: u64,
    decisions: Vec<Decision>,
    policy_runs_at: Nanos,
    policy_runs_here: u32,
    preemptions: Vec<PreemptionSample>,
    kernels_completed: u64,
    arrival_order: ArrivalOrder,
    /// Operations the processes' hosts have issued (progress displays).
    ops_issued: u64,
    /// An error found where no `Result` can be returned (a timer that does
    /// not fit in `Nanos`); `poll_command` reports it.
    fault: Option<EngineError>,
}

/// What time orders the active kernels (`ActiveKernel::arrival`, the order an
/// in-order policy such as FCFS serves them in). The two differ only for
/// processes that issue ahead of their stream (`async_depth > 0`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ArrivalOrder {
    /// When the kernel reaches the head of its process's stream, i.e. when the
    /// operation before it completed. The default.
    #[default]
    HeadOfStream,
    /// When the host issued it: one queue in submission order. A kernel that
    /// waits in its stream behind an unfinished operation keeps its place in
    /// line, and in-order policies give no SM to kernels issued after it
    /// (`SchedView::in_order_barrier`) until it can start. Models a hardware
    /// queue fed by asynchronous launches (Tanasic et al.'s applications
    /// "asynchronously enqueue many kernel invocations").
    Submission,
}

impl Engine {
    /// An engine for `workload` on `device`; `only` restricts it to one
    /// process (the isolated runs that NTT is normalised by).
    pub fn new(
        workload: &Workload,
        device: DeviceInfo,
        policy: Box<dyn Policy>,
        only: Option<ProcessId>,
    ) -> Result<Self, EngineError> {
        if device.num_sms as usize > crate::smset::MAX_SMS {
            return Err(EngineError::TooManySms { have: device.num_sms, max: crate::smset::MAX_SMS });
        }
        // Only the processes this run has: an isolated run must not cost
        // O(all processes), or a workload's N isolated runs cost O(N²).
        let specs: &[ProcessSpec] = match only {
            Some(o) => workload.processes.get(o.0 as usize).map(std::slice::from_ref).unwrap_or_default(),
            None => &workload.processes,
        };
        // Refuse up front a kernel that can never run, rather than hang later.
        for p in specs {
            for op in &p.ops {
                if let Op::Kernel(k) = op {
                    device.blocks_per_sm(k)?;
                }
            }
        }
        let procs: Vec<ProcState> = specs
            .iter()
            .map(|p| ProcState {
                spec: Arc::new(p.clone()),
                name: Arc::from(p.name.as_str()),
                arrived: false,
                finished: false,
                runs_started: 0,
                op_idx: 0,
                host_busy: false,
                stream: VecDeque::new(),
                run_start: 0,
                runs: Vec::new(),
            })
            .collect();
        if procs.is_empty() {
            return Err(EngineError::Empty);
        }
        let ids: Vec<ProcessId> = match only {
            Some(o) => vec![o],
            None => (0..procs.len() as u32).map(ProcessId).collect(),
        };
        let n = device.num_sms as usize;
        let unfinished = procs.len();
        let short_of_min_runs = match workload.replay_min_runs {
            Some(min) if min > 0 => procs.len(),
            _ => 0,
        };
        let mut e = Engine {
            device,
            policy,
            now: 0,
            procs,
            proc_ids: ids,
            replay_min_runs: workload.replay_min_runs,
            short_of_min_runs,
            unfinished,
            kernels: ActiveList::new(),
            work: BTreeMap::new(),
            launches: HashMap::new(),
            copies: HashMap::new(),
            sms: vec![SmState::Idle; n],
            reserved_at: vec![0; n],
            out: VecDeque::new(),
            timers: BinaryHeap::new(),
            timer_seq: 0,
            dirty: false,
            next_kernel: 0,
            next_launch: 0,
            next_copy: 0,
            decisions: Vec::new(),
            policy_runs_at: 0,
            policy_runs_here: 0,
            preemptions: Vec::new(),
            kernels_completed: 0,
            arrival_order: ArrivalOrder::default(),
            ops_issued: 0,
            fault: None,
        };
        for slot in 0..e.procs.len() {
            let at = e.procs[slot].spec.arrival_ns;
            e.push_timer(at, Timer::Arrival(ProcessId(slot as u32)));
        }
        Ok(e)
    }

    /// Orders active kernels by `order` (default: head of stream).
    pub fn with_arrival_order(mut self, order: ArrivalOrder) -> Self {
        self.arrival_order = order;
        self
    }

    pub fn policy_name(&self) -> String {
        self.policy.name()
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// Next command for the device. Runs the policy first if anything changed.
    pub fn poll_command(&mut self) -> Result<Option<Command>, EngineError> {
        if let Some(e) = self.fault.take() {
            return Err(e);
        }
        if self.out.is_empty() && self.dirty {
            self.dirty = false;
            self.run_policy()?;
        }
        Ok(self.out.pop_front())
    }

    /// When the engine next needs to be woken with `handle_timeout`.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let t = self.timers.peek().map(|Reverse((t, _, _))| *t);
        match (t, self.policy.wake_at()) {
            (Some(a), Some(b)) => Some(a.min(b.max(self.now))),
            (a, b) => a.or(b.map(|b| b.max(self.now))),
        }
    }

    pub fn is_finished(&self) -> bool {
        self.unfinished == 0
    }

    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Operations (kernels, copies, host ops, syncs) issued so far, over all
    /// runs of all processes.
    pub fn ops_issued(&self) -> u64 {
        self.ops_issued
    }

    pub fn handle_timeout(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        while let Some(Reverse((t, _, timer))) = self.timers.peek().copied() {
            if t > self.now {
                break;
            }
            self.timers.pop();
            match timer {
                Timer::Arrival(slot) => {
                    let p = &mut self.procs[slot.0 as usize];
                    p.arrived = true;
                    self.start_run(slot.0 as usize);
                }
                Timer::HostDone(slot) => {
                    self.procs[slot.0 as usize].host_busy = false;
                    self.step_host(slot.0 as usize);
                }
            }
        }
        // A policy timer (slice end) also lands here.
        self.dirty = true;
    }

    pub fn handle_event(&mut self, now: Nanos, event: Event) -> Result<(), EngineError> {
        self.now = self.now.max(now);
        self.dirty = true;
        match event {
            Event::SmReleased { launch, sm, cause } => self.on_sm_released(launch, sm, cause),
            Event::LaunchEnded { launch, remaining, saved, completed: _ } => {
                self.on_launch_ended(launch, remaining, saved)
            }
            Event::CopyDone { copy } => {
                let slot = self
                    .copies
                    .remove(&copy)
                    .ok_or_else(|| EngineError::Protocol(format!("copy {copy} finished but was never started")))?;
                self.stream_head_done(slot.0 as usize);
                Ok(())
            }
        }
    }

    // ---------------------------------------------------------------- processes

    fn push_timer(&mut self, at: Nanos, t: Timer) {
        self.timer_seq += 1;
        self.timers.push(Reverse((at, self.timer_seq, t)));
    }

    fn start_run(&mut self, slot: usize) {
        let p = &mut self.procs[slot];
        p.runs_started += 1;
        p.op_idx = 0;
        p.run_start = self.now;
        self.step_host(slot);
    }

    /// Whether a process that just completed a run should start another.
    fn wants_another_run(&self, slot: usize) -> bool {
        let p = &self.procs[slot];
        match self.replay_min_runs {
            // Keep replaying while anyone (this process included) is short of runs.
            Some(_) => self.short_of_min_runs > 0,
            None => p.runs_started < p.spec.repetitions.max(1),
        }
    }

    /// Records a completed run of the process in `slot`.
    fn end_run(&mut self, slot: usize) {
        let span = RunSpan { start_ns: self.procs[slot].run_start, end_ns: self.now };
        let runs = &mut self.procs[slot].runs;
        runs.push(span);
        if self.replay_min_runs.is_some_and(|min| runs.len() == min as usize) {
            self.short_of_min_runs -= 1;
        }
    }

    /// Moves the host thread of a process as far as it can go now.
    fn step_host(&mut self, slot: usize) {
        loop {
            let p = &self.procs[slot];
            if p.finished || !p.arrived || p.host_busy {
                return;
            }
            let depth = p.spec.async_depth as usize;
            if p.op_idx == p.spec.ops.len() {
                // End of a run: the host synchronises with its stream.
                if !p.stream.is_empty() {
                    return;
                }
                self.end_run(slot);
                if self.wants_another_run(slot) {
                    let p = &mut self.procs[slot];
                    p.runs_started += 1;
                    p.op_idx = 0;
                    p.run_start = self.now;
                    continue;
                }
                self.procs[slot].finished = true;
                self.unfinished -= 1;
                return;
            }
            // The host may run ahead of its stream by at most `depth` operations.
            if p.stream.len() > depth {
                return;
            }
            let op_idx = p.op_idx;
            let spec = Arc::clone(&p.spec);
            if matches!(spec.ops[op_idx], Op::Sync) {
                if !self.procs[slot].stream.is_empty() {
                    return; // `stream_head_done` steps the host again
                }
                self.procs[slot].op_idx += 1;
                self.ops_issued += 1;
                continue;
            }
            self.procs[slot].op_idx += 1;
            self.ops_issued += 1;
            if let Op::Cpu { ns } = spec.ops[op_idx] {
                self.procs[slot].host_busy = true;
                let what = || format!("host (cpu) operation {} of process `{}`", op_idx + 1, spec.name);
                match later(self.now, ns, what) {
                    Ok(at) => self.push_timer(at, Timer::HostDone(ProcessId(slot as u32))),
                    // The host stays busy: the run stops at the next `poll_command`.
                    Err(e) => {
                        self.fault.get_or_insert(e.into());
                    }
                }
                return;
            }
            self.procs[slot].stream.push_back((op_idx, self.now));
            if self.procs[slot].stream.len() == 1 {
                self.start_stream_head(slot);
            }
        }
    }

    fn start_stream_head(&mut self, slot: usize) {
        let Some(&(op_idx, submitted)) = self.procs[slot].stream.front() else { return };
        let spec = Arc::clone(&self.procs[slot].spec);
        let pid = self.proc_ids[slot];
        match &spec.ops[op_idx] {
            Op::CopyToDevice { bytes } | Op::CopyToHost { bytes } => {
                let direction = if matches!(spec.ops[op_idx], Op::CopyToDevice { .. }) {
                    CopyDirection::HostToDevice
                } else {
                    CopyDirection::DeviceToHost
                };
                let copy = CopyId(self.next_copy);
                self.next_copy += 1;
                self.copies.insert(copy, ProcessId(slot as u32));
                self.out.push_back(Command::Copy { copy, process: pid, direction, bytes: *bytes });
            }
            Op::Kernel(desc) => {
                let id = KernelId(self.next_kernel);
                self.next_kernel += 1;
                // Already checked in `new`; a device cannot change under us.
                let blocks_per_sm = self.device.blocks_per_sm(desc).unwrap_or(1);
                // Same block times for this operation under every policy and alone.
                let time_key = ((pid.0 as u64) << 40) ^ (op_idx as u64);
                self.work.insert(
                    id,
                    KernelWork {
                        pending: BlockRanges::full(desc.shape.blocks),
                        saved: Vec::new(),
                        launches: Vec::new(),
                        time_key,
                    },
                );
                let arrival = match self.arrival_order {
                    ArrivalOrder::HeadOfStream => self.now,
                    ArrivalOrder::Submission => submitted,
                };
                // `kernels` stays in arrival order (ties: the one already there first).
                let at = self.kernels.partition_point(|k| k.arrival <= arrival);
                self.kernels.insert(
                    at,
                    ActiveKernel {
                        id,
                        process: pid,
                        process_name: Arc::clone(&self.procs[slot].name),
                        priority: spec.priority,
                        weight: spec.weight,
                        arrival,
                        desc: Arc::clone(desc),
                        blocks_per_sm,
                        pending_blocks: desc.shape.blocks,
                        saved_blocks: 0,
                        running: SmSet::EMPTY,
                        leaving: SmSet::EMPTY,
                        incoming: 0,
                        live_launch: None,
                        live_launch_blocks: 0,
                    },
                );
                self.dirty = true;
                if desc.shape.blocks == 0 {
                    // An empty grid completes at once, as on a real GPU.
                    self.finish_kernel(id);
                }
            }
            Op::Cpu { .. } | Op::Sync => unreachable!("host operations never enter the stream"),
        }
    }

    fn stream_head_done(&mut self, slot: usize) {
        self.procs[slot].stream.pop_front();
        self.start_stream_head(slot);
        // Only this process can move: another one's host is waiting on its
        // own stream or timer, or it is at the end of a run, where it decides
        // at once whether to replay (no process waits for others' runs to
        // count), so stepping every process here was O(processes) for nothing.
        self.step_host(slot);
    }

    // ------------------------------------------------------------------ kernels

    fn kernel_index(&self, id: KernelId) -> Option<usize> {
        position_of(&self.kernels, id)
    }

    /// The `procs` slot of a workload process (`proc_ids` is ascending).
    fn slot_of(&self, id: ProcessId) -> Option<usize> {
        self.proc_ids.binary_search(&id).ok()
    }

    fn finish_kernel(&mut self, id: KernelId) {
        let Some(i) = self.kernel_index(id) else { return };
        let k = self.kernels.remove(i);
        self.work.remove(&id);
        self.kernels_completed += 1;
        // Stale reservations for this kernel turn into plain preemptions.
        for s in self.sms.iter_mut() {
            if let SmState::Reserved { next, .. } = s {
                if *next == Some(id) {
                    *next = None;
                }
            }
        }
        let slot = self.slot_of(k.process).unwrap_or(0);
        self.stream_head_done(slot);
    }

    fn on_sm_released(&mut self, launch: LaunchId, sm: SmId, cause: ReleaseCause) -> Result<(), EngineError> {
        let l = self
            .launches
            .get_mut(&launch)
            .ok_or_else(|| EngineError::Protocol(format!("SM {sm} released by unknown launch {launch}")))?;
        if !l.sms.contains(sm) {
            return Err(EngineError::Protocol(format!("launch {launch} released SM {sm}, which it did not hold")));
        }
        l.sms.remove(sm);
        let kernel = l.kernel;
        if cause == ReleaseCause::Exhausted {
            l.exhausted = true;
        }
        let ki = self.kernel_index(kernel);
        if let Some(ki) = ki {
            let k = &mut self.kernels[ki];
            k.running.remove(sm);
            k.leaving.remove(sm);
            if cause == ReleaseCause::Exhausted && k.live_launch == Some(launch) {
                k.live_launch = None;
                k.live_launch_blocks = 0;
            }
        }
        let state = self.sms.get(sm.0 as usize).copied();
        match state {
            Some(SmState::Running { launch: l2, .. }) if l2 == launch => {
                self.sms[sm.0 as usize] = SmState::Idle;
            }
            Some(SmState::Reserved { launch: l2, next, .. }) if l2 == launch => {
                self.sms[sm.0 as usize] = SmState::Idle;
                if cause == ReleaseCause::Retreated {
                    self.preemptions.push(PreemptionSample {
                        at_ns: self.reserved_at[sm.0 as usize],
                        latency_ns: self.now - self.reserved_at[sm.0 as usize],
                    });
                }
                if let Some(n) = next {
                    if let Some(ni) = self.kernel_index(n) {
                        self.kernels[ni].incoming = self.kernels[ni].incoming.saturating_sub(1);
                        // Tanasic's SMST `next` only books the SM while it is being
                        // freed; once idle, the policy hands it out again with what it
                        // knows now (the kernel may have finished or fallen behind).
                    }
                }
            }
            _ => {
                return Err(EngineError::Protocol(format!(
                    "launch {launch} released SM {sm}, but the engine has it as {state:?}"
                )))
            }
        }
        Ok(())
    }

    fn on_launch_ended(
        &mut self,
        launch: LaunchId,
        remaining: BlockRanges,
        saved: Vec<SavedBlock>,
    ) -> Result<(), EngineError> {
        let l = self
            .launches
            .remove(&launch)
            .ok_or_else(|| EngineError::Protocol(format!("unknown launch {launch} ended")))?;
        if !l.sms.is_empty() {
            return Err(EngineError::Protocol(format!("launch {launch} ended still holding SMs {:?}", l.sms)));
        }
        let Some(w) = self.work.get_mut(&l.kernel) else {
            return Err(EngineError::Protocol(format!("launch {launch} ended for a finished kernel")));
        };
        w.launches.retain(|&x| x != launch);
        for r in remaining.ranges() {
            w.pending.try_insert(r.clone()).map_err(|r| {
                EngineError::Protocol(format!("launch {launch} handed back blocks {r:?} that were not its own"))
            })?;
        }
        w.saved.extend(saved);
        let done = w.pending.is_empty() && w.saved.is_empty() && w.launches.is_empty();
        let (pending, saved_n) = (w.pending.len(), w.saved.len() as u64);
        if let Some(ki) = self.kernel_index(l.kernel) {
            let k = &mut self.kernels[ki];
            k.pending_blocks = pending;
            k.saved_blocks = saved_n;
            if k.live_launch == Some(launch) {
                k.live_launch = None;
                k.live_launch_blocks = 0;
            }
        }
        if done {
            self.finish_kernel(l.kernel);
        }
        Ok(())
    }

    // ------------------------------------------------------------------ policy

    fn run_policy(&mut self) -> Result<(), EngineError> {
        // A policy that keeps taking SMs back and forth at one instant would
        // spin forever without simulated time moving: stop it with an error.
        if self.now == self.policy_runs_at {
            self.policy_runs_here += 1;
            if self.policy_runs_here > MAX_POLICY_RUNS_PER_INSTANT {
                return Err(self.policy_error(format!(
                    "livelock: {MAX_POLICY_RUNS_PER_INSTANT} scheduling rounds at {} ns without time advancing",
                    self.now
                )));
            }
        } else {
            self.policy_runs_at = self.now;
            self.policy_runs_here = 0;
        }
        let view = SchedView {
            now: self.now,
            device: &self.device,
            sms: &self.sms,
            kernels: &self.kernels,
            in_order_barrier: self.in_order_barrier(),
        };
        let mut decisions = std::mem::take(&mut self.decisions);
        self.policy.schedule(&view, &mut decisions);
        self.decisions = decisions;
        self.apply_decisions()
    }

    /// Submission order only: the earliest issue time of a kernel still
    /// waiting in its stream behind an unfinished operation.
    fn in_order_barrier(&self) -> Option<Nanos> {
        if self.arrival_order != ArrivalOrder::Submission {
            return None;
        }
        self.procs
            .iter()
            .filter_map(|p| {
                p.stream.iter().skip(1).find(|(op, _)| matches!(p.spec.ops[*op], Op::Kernel(_))).map(|&(_, at)| at)
            })
            .min()
    }

    fn policy_error(&self, what: String) -> EngineError {
        EngineError::Policy { policy: self.policy.name(), what }
    }

    fn apply_decisions(&mut self) -> Result<(), EngineError> {
        // Group assignments by kernel so one launch covers all its new SMs.
        let mut grants: Vec<(KernelId, SmSet, Option<u64>)> = Vec::new();
        let mut retreats: Vec<(LaunchId, crate::device::Mechanism, SmSet)> = Vec::new();
        let decisions = std::mem::take(&mut self.decisions);
        for d in &decisions {
            match *d {
                Decision::Assign { sm, kernel, slice } => {
                    match self.sms.get(sm.0 as usize) {
                        Some(SmState::Idle) => {}
                        other => {
                            return Err(
                                self.policy_error(format!("assigned SM {sm} to kernel {kernel}, but it is {other:?}"))
                            )
                        }
                    }
                    if self.kernel_index(kernel).is_none() {
                        return Err(
                            self.policy_error(format!("assigned SM {sm} to kernel {kernel}, which is not active"))
                        );
                    }
                    // Mark it taken now so a second decision for it is caught.
                    self.sms[sm.0 as usize] = SmState::Reserved { kernel, launch: LaunchId(u64::MAX), next: None };
                    match grants.iter_mut().find(|g| g.0 == kernel) {
                        Some(g) => g.1.insert(sm),
                        None => grants.push((kernel, SmSet::single(sm), slice)),
                    }
                }
                Decision::Preempt { sm, mechanism, next } => {
                    let Some(&SmState::Running { kernel, launch }) = self.sms.get(sm.0 as usize) else {
                        return Err(self.policy_error(format!("preempted SM {sm}, which is not running a kernel")));
                    };
                    if let Some(n) = next {
                        let Some(ni) = self.kernel_index(n) else {
                            return Err(
                                self.policy_error(format!("reserved SM {sm} for kernel {n}, which is not active"))
                            );
                        };
                        self.kernels[ni].incoming += 1;
                    }
                    self.sms[sm.0 as usize] = SmState::Reserved { kernel, launch, next };
                    self.reserved_at[sm.0 as usize] = self.now;
                    if let Some(ki) = self.kernel_index(kernel) {
                        self.kernels[ki].running.remove(sm);
                        self.kernels[ki].leaving.insert(sm);
                    }
                    match retreats.iter_mut().find(|r| r.0 == launch && r.1 == mechanism) {
                        Some(r) => r.2.insert(sm),
                        None => retreats.push((launch, mechanism, SmSet::single(sm))),
                    }
                }
            }
        }
        let mut decisions = decisions;
        decisions.clear();
        self.decisions = decisions;

        // Grants go first: a launch that is growing onto new SMs while losing
        // all its old ones must not end (on a device that frees SMs at once)
        // before the Grow reaches it.
        for (kernel, sms, slice) in grants {
            self.grant(kernel, sms, slice);
        }
        for (launch, mechanism, sms) in retreats {
            self.out.push_back(Command::Retreat { launch, sms, mechanism });
        }
        Ok(())
    }

    /// Gives SMs to a kernel: grows its live launch or starts a new one.
    fn grant(&mut self, kernel: KernelId, sms: SmSet, slice: Option<u64>) {
        let Some(ki) = self.kernel_index(kernel) else { return };
        let launch = match self.kernels[ki].live_launch {
            Some(l) => {
                self.out.push_back(Command::Grow { launch: l, sms });
                l
            }
            None => {
                let Some(w) = self.work.get_mut(&kernel) else { return };
                let blocks = match slice {
                    Some(n) => w.pending.take_prefix(n.max(1)),
                    None => std::mem::take(&mut w.pending),
                };
                let restore = std::mem::take(&mut w.saved);
                if blocks.is_empty() && restore.is_empty() {
                    // Nothing to run (its last blocks are finishing elsewhere): leave the SMs idle.
                    for sm in sms.iter() {
                        self.sms[sm.0 as usize] = SmState::Idle;
                    }
                    self.dirty = true;
                    return;
                }
                let id = LaunchId(self.next_launch);
                self.next_launch += 1;
                w.launches.push(id);
                let n_blocks = blocks.len() + restore.len() as u64;
                let time_key = w.time_key;
                let (pending, saved) = (w.pending.len(), w.saved.len() as u64);
                let k = &mut self.kernels[ki];
                k.pending_blocks = pending;
                k.saved_blocks = saved;
                k.live_launch = Some(id);
                k.live_launch_blocks = n_blocks;
                self.launches.insert(id, LaunchState { kernel, sms: SmSet::EMPTY, exhausted: false });
                self.out.push_back(Command::Launch {
                    launch: id,
                    kernel,
                    process: k.process,
                    priority: k.priority,
                    desc: Arc::clone(&k.desc),
                    time_key,
                    blocks,
                    restore,
                    sms,
                });
                id
            }
        };
        if let Some(l) = self.launches.get_mut(&launch) {
            l.sms = l.sms.union(&sms);
        }
        let k = &mut self.kernels[ki];
        k.running = k.running.union(&sms);
        for sm in sms.iter() {
            self.sms[sm.0 as usize] = SmState::Running { kernel, launch };
        }
    }

    // ----------------------------------------------------------------- records

    /// What happened, for metrics. Call when `is_finished()`.
    pub fn record(&self) -> RunRecord {
        RunRecord {
            policy: self.policy.name(),
            makespan_ns: self.now,
            processes: self
                .procs
                .iter()
                .zip(&self.proc_ids)
                .map(|(p, &id)| ProcessRecord {
                    id,
                    name: p.spec.name.clone(),
                    priority: p.spec.priority,
                    arrival_ns: p.spec.arrival_ns,
                    runs: p.runs.clone(),
                })
                .collect(),
            preemptions: self.preemptions.clone(),
            kernels_completed: self.kernels_completed,
        }
    }
}

//! The scheduling engine: a deterministic state machine with no I/O, driven
//! by a front-end on one side and a device on the other.
//!
//! Front-end side (the live interface): processes are added and removed
//! while it runs ([`Engine::add_process`], [`Engine::remove_process`]), their
//! priority and weight can change ([`Engine::set_priority`],
//! [`Engine::set_weight`]), operations are submitted to their streams
//! ([`Engine::submit`]) and each one's end is reported
//! ([`Engine::poll_completion`]). [`Replay`](crate::Replay) is one front-end
//! (workload files); a daemon serving real processes is meant to be another.
//!
//! Device side: [`Engine::poll_command`] hands out commands,
//! [`Engine::handle_event`] takes the device's events, [`Engine::poll_timeout`]
//! and [`Engine::handle_timeout`] wake it for policy timers. Every input says
//! what time it is; the engine never reads a clock.
//!
//! In between, it keeps the SM table and the active kernels, asks the policy
//! for decisions whenever something changed, and turns them into commands.

use crate::active::{ActiveList, KernelState, Launches, LiveLaunch};
use crate::device::{Command, Event, Mechanism, Message, ProtocolError, ReleaseCause, SavedBlock};
use crate::ids::{CopyId, KernelId, LaunchId, OpId, Slot, SmId};
use crate::kernel::{DeviceInfo, DoesNotFit};
use crate::launch_map::LaunchMap;
use crate::policy::{Decision, Policy};
use crate::process::{Completion, OpOutcome, ProcessInfo, ProcessTable, Queued, StreamOp, Work};
use crate::ranges::BlockRanges;
use crate::record::PreemptionSample;
use crate::smset::SmSet;
use crate::time::{Nanos, TimeOverflow};
use crate::view::{position_of, SchedView, SmHoldings, SmState};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Scheduling rounds allowed at one instant before the engine calls it a livelock.
const MAX_POLICY_RUNS_PER_INSTANT: u32 = 100_000;

/// How a removed process's running kernels give their SMs back: idempotent
/// blocks are dropped at once, the others run to their end (no device can
/// stop a block part-way without saving it, and its work is thrown away).
const REMOVAL_MECHANISM: Mechanism = Mechanism::Flush;

/// Why the engine stopped, or refused a request.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A kernel that can never run on the device.
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    /// The policy asked for something impossible.
    #[error("policy `{policy}` made an invalid decision: {what}")]
    Policy {
        /// The policy's name.
        policy: String,
        /// What it did wrong.
        what: String,
    },
    /// The device broke the engine-device contract.
    #[error("the device broke the protocol")]
    Protocol(#[from] ProtocolError),
    /// A workload with nothing to replay.
    #[error("the workload has no processes")]
    Empty,
    /// A device larger than an `SmSet` holds.
    #[error("device has {have} SMs, more than the {max} gpumux supports")]
    TooManySms {
        /// The device's SMs.
        have: u16,
        /// The most gpumux supports.
        max: usize,
    },
    /// A request for a process that is not live (never added, or removed).
    #[error("no live process in slot {0}")]
    UnknownSlot(Slot),
    /// A weight that is not a finite number >= 0 (proportional shares
    /// would be meaningless).
    #[error("a process's weight must be a finite number >= 0, not {0}")]
    BadWeight(f64),
    /// Time would overflow.
    #[error(transparent)]
    TimeOverflow(#[from] TimeOverflow),
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

fn check_weight(weight: f64) -> Result<(), EngineError> {
    if weight.is_finite() && weight >= 0.0 {
        Ok(())
    } else {
        Err(EngineError::BadWeight(weight))
    }
}

/// Whose a device launch is.
#[derive(Clone, Copy, Debug)]
enum LaunchOwner {
    /// An active kernel's.
    Kernel(KernelId),
    /// A kernel of a removed process: its SMs are being taken back and what
    /// it hands back is thrown away.
    Orphan,
}

/// The scheduler (see the module doc).
pub struct Engine {
    device: DeviceInfo,
    policy: Box<dyn Policy>,
    arrival_order: ArrivalOrder,
    now: Nanos,
    processes: ProcessTable,
    /// Active kernels in arrival order.
    kernels: ActiveList<KernelState>,
    // Few live entries each, looked up per device event: ordered by id
    // (comparing ids is cheaper than SipHashing them). Launches in flight
    // are a sorted list (`LaunchMap`): a launch's insert and remove in a
    // `BTreeMap` were ~300 instructions (issue 35).
    launches: LaunchMap<LaunchOwner>,
    /// Copies on the device: their process and operation.
    copies: BTreeMap<CopyId, (Slot, OpId)>,
    /// Who holds each SM: the one record of it.
    sms: Vec<SmState>,
    /// The SMs of `sms` that are not idle, kept with every write to it: a
    /// chain's short kernels hold one or a few SMs of 132, and the scans of
    /// a kernel's end, a launch's end and a scheduling round walk these
    /// instead of the whole table (issue 35, callgrind).
    busy: SmSet,
    /// When each reserved SM was asked for, for preemption latency.
    reserved_at: Vec<Nanos>,
    out: VecDeque<Command>,
    completions: VecDeque<Completion>,
    /// Something changed since the policy last ran.
    dirty: bool,
    next_kernel: u64,
    next_launch: u64,
    next_copy: u64,
    next_op: u64,
    /// Scratch of a scheduling round, kept so a round allocates nothing.
    decisions: Vec<Decision>,
    /// A round's grants by kernel, kept like `decisions` (a chain's round
    /// per kernel allocated it afresh: issue 35's callgrind).
    grants: Vec<(KernelId, SmSet, Option<u64>)>,
    holdings: SmHoldings,
    policy_runs_at: Nanos,
    policy_runs_here: u32,
    preemptions: Vec<PreemptionSample>,
    kernels_completed: u64,
    /// The device frees a retreat's SMs in the command itself
    /// ([`Engine::with_retreats_freeing_at_once`]).
    retreats_free_at_once: bool,
    /// SMs freed when their retreat was sent, whose `SmReleased` is still to come.
    released_early: Vec<(LaunchId, SmId)>,
    /// Streams whose head is a [`StreamOp::WaitFor`] still waiting: the
    /// operation waited for, and the waiting process. Empty unless a front-end
    /// orders streams after each other, so an operation's end costs one
    /// `is_empty` check otherwise.
    blocked: Vec<(OpId, Slot)>,
    /// Streams whose next copy could not go ahead of a [`StreamOp::WaitFor`]
    /// still waiting ([`Engine::copy_ahead`]): the operation waited for, and
    /// the stream, tried again when that operation ends.
    copy_blocked: Vec<(OpId, Slot)>,
}

impl Engine {
    /// An engine with no process yet, for `device`, scheduling with `policy`.
    pub fn new(device: DeviceInfo, policy: Box<dyn Policy>) -> Result<Self, EngineError> {
        if device.num_sms as usize > crate::smset::MAX_SMS {
            return Err(EngineError::TooManySms { have: device.num_sms, max: crate::smset::MAX_SMS });
        }
        let n = device.num_sms as usize;
        Ok(Engine {
            device,
            policy,
            arrival_order: ArrivalOrder::default(),
            now: 0,
            processes: ProcessTable::default(),
            kernels: ActiveList::default(),
            launches: LaunchMap::default(),
            copies: BTreeMap::new(),
            sms: vec![SmState::Idle; n],
            busy: SmSet::EMPTY,
            reserved_at: vec![0; n],
            out: VecDeque::new(),
            completions: VecDeque::new(),
            dirty: false,
            next_kernel: 0,
            next_launch: 0,
            next_copy: 0,
            next_op: 0,
            decisions: Vec::new(),
            grants: Vec::new(),
            holdings: SmHoldings::default(),
            policy_runs_at: 0,
            policy_runs_here: 0,
            preemptions: Vec::new(),
            kernels_completed: 0,
            retreats_free_at_once: false,
            released_early: Vec::new(),
            blocked: Vec::new(),
            copy_blocked: Vec::new(),
        })
    }

    /// For a device that announces a retreat's SMs released in the command
    /// itself (`SmReleased` with `Retreated` before it looks at anything
    /// else), as the CUDA device does: its workers leave those SMs after the
    /// block they are running while whatever is launched there next waits
    /// for their places in the hardware. The engine then frees the SMs when
    /// it sends the retreat and gives each to the kernel the policy took it
    /// for, in the same round: an urgent kernel's launch follows the retreat
    /// that makes room for it in one exchange with the device instead of two,
    /// and without a second scheduling round before it.
    /// The device's `SmReleased` for those SMs, when it comes, is taken as
    /// already applied. Off by default (the simulator frees SMs as the
    /// mechanism allows, and its golden results stay as they are).
    pub fn with_retreats_freeing_at_once(mut self, on: bool) -> Self {
        self.retreats_free_at_once = on;
        self
    }

    /// Orders active kernels by `order` (default: head of stream).
    pub fn with_arrival_order(mut self, order: ArrivalOrder) -> Self {
        self.arrival_order = order;
        self
    }

    /// The policy's name, e.g. `ppq-excl-cs`.
    pub fn policy_name(&self) -> String {
        self.policy.name()
    }

    /// The device scheduled.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// The time of the latest input.
    pub fn now(&self) -> Nanos {
        self.now
    }

    /// Kernels that ran to the end so far.
    pub fn kernels_completed(&self) -> u64 {
        self.kernels_completed
    }

    /// How long each SM taken back so far took to be freed.
    pub fn preemptions(&self) -> &[PreemptionSample] {
        &self.preemptions
    }

    fn advance_to(&mut self, now: Nanos) {
        self.now = self.now.max(now);
    }

    // -------------------------------------------------------------- processes

    /// Adds a process with an empty stream; the policy sees it once it has
    /// a kernel.
    pub fn add_process(&mut self, info: ProcessInfo) -> Result<Slot, EngineError> {
        check_weight(info.weight)?;
        Ok(self.processes.insert(info))
    }

    /// What the engine knows of the process in `slot`, if it is live.
    pub fn process(&self, slot: Slot) -> Option<&ProcessInfo> {
        self.processes.info(slot)
    }

    /// Removes a process at `now`. Its running kernel gives its SMs back
    /// (retreated with [`Mechanism::Flush`]; the policy hands them to others
    /// once the device has freed them), and every operation still in its
    /// stream, the one on the device included, is reported as
    /// [`OpOutcome::Dropped`]. Nothing of another process's work is touched.
    pub fn remove_process(&mut self, now: Nanos, slot: Slot) -> Result<(), EngineError> {
        self.advance_to(now);
        let process = self.processes.remove(slot).ok_or(EngineError::UnknownSlot(slot))?;
        self.policy.process_removed(slot);
        if let Some(id) = process.stream.front().and_then(|q| q.kernel) {
            self.retire_kernel(id);
        }
        self.blocked.retain(|b| b.1 != slot);
        self.copy_blocked.retain(|b| b.1 != slot);
        // A copy on the device cannot be called back; its `CopyDone` is ignored.
        for q in process.stream {
            self.completions.push_back(Completion { slot, op: q.id, outcome: OpOutcome::Dropped });
            // A stream waiting for it goes on: what it waited for will never come.
            self.wake_waiters(q.id);
        }
        self.dirty = true;
        Ok(())
    }

    /// Takes an active kernel of a removed process out of the schedule: its
    /// launches become orphans and retreat from every SM they run on.
    fn retire_kernel(&mut self, id: KernelId) {
        let Some(i) = self.kernel_index(id) else { return };
        let k = self.kernels.remove(i);
        for l in k.launches.iter() {
            self.launches.insert(l, LaunchOwner::Orphan);
        }
        let mut retreats: Vec<(LaunchId, SmSet)> = Vec::new();
        for (i, s) in self.sms.iter_mut().enumerate() {
            match *s {
                SmState::Running { kernel, launch } if kernel == id => {
                    *s = SmState::Reserved { kernel, launch, next: None };
                    self.reserved_at[i] = self.now;
                    let sm = SmId(i as u16);
                    match retreats.iter_mut().find(|r| r.0 == launch) {
                        Some(r) => r.1.insert(sm),
                        None => retreats.push((launch, SmSet::single(sm))),
                    }
                }
                SmState::Reserved { ref mut next, .. } if *next == Some(id) => *next = None,
                _ => {}
            }
        }
        for (launch, sms) in retreats {
            self.out.push_back(Command::Retreat { launch, sms, mechanism: REMOVAL_MECHANISM });
        }
    }

    /// Gives a process a new priority; the next scheduling round uses it
    /// (and later launches pass it to the device).
    pub fn set_priority(&mut self, slot: Slot, priority: i32) -> Result<(), EngineError> {
        self.processes.get_mut(slot).ok_or(EngineError::UnknownSlot(slot))?.info.priority = priority;
        self.dirty = true;
        Ok(())
    }

    /// Gives a process a new weight; the next scheduling round uses it.
    pub fn set_weight(&mut self, slot: Slot, weight: f64) -> Result<(), EngineError> {
        check_weight(weight)?;
        self.processes.get_mut(slot).ok_or(EngineError::UnknownSlot(slot))?.info.weight = weight;
        self.dirty = true;
        Ok(())
    }

    /// Appends `op` to the stream of the process in `slot` at `now`; it
    /// starts once every operation before it has completed. A kernel that
    /// cannot fit one block on an SM is refused here, not left to hang.
    pub fn submit(&mut self, now: Nanos, slot: Slot, op: StreamOp) -> Result<OpId, EngineError> {
        self.advance_to(now);
        let work = match op {
            StreamOp::Kernel { desc, time_key } => {
                let blocks_per_sm = self.device.blocks_per_sm(&desc)?;
                Work::Kernel { desc, time_key, blocks_per_sm }
            }
            StreamOp::Copy { direction, bytes } => Work::Copy { direction, bytes },
            StreamOp::Sync => Work::Sync,
            StreamOp::WaitFor { slot, op } => Work::WaitFor { slot, op },
            StreamOp::Hold => Work::Hold { released: false },
        };
        let p = self.processes.get_mut(slot).ok_or(EngineError::UnknownSlot(slot))?;
        let id = OpId(self.next_op);
        self.next_op += 1;
        p.stream.push_back(Queued { id, submitted: self.now, work, kernel: None, issued: false, done_early: false });
        if p.stream.len() == 1 {
            self.start_head(slot);
        } else {
            self.copy_ahead(slot);
        }
        Ok(id)
    }

    /// The next operation that ended, if any, in the order they ended.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    /// Whether [`Engine::poll_completion`] has one to give.
    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Starts the operation at the head of `slot`'s stream; one that ends at
    /// once (a sync, an empty grid) is completed and the next one started.
    fn start_head(&mut self, slot: Slot) {
        loop {
            let Some(p) = self.processes.get_mut(slot) else { return };
            let Some(head) = p.stream.front_mut() else { return };
            match &head.work {
                Work::Copy { .. } if !head.done_early => {
                    if !head.issued {
                        self.issue_copy(slot, 0);
                    }
                    self.copy_ahead(slot);
                    return;
                }
                // Queued ahead and done before it got here: it ends now.
                Work::Copy { .. } => {}
                Work::Kernel { desc, time_key, blocks_per_sm } => {
                    let id = KernelId(self.next_kernel);
                    self.next_kernel += 1;
                    head.kernel = Some(id);
                    self.dirty = true;
                    if desc.shape.blocks == 0 {
                        // An empty grid completes at once, as on a real GPU.
                        self.kernels_completed += 1;
                    } else {
                        let arrival = match self.arrival_order {
                            ArrivalOrder::HeadOfStream => self.now,
                            ArrivalOrder::Submission => head.submitted,
                        };
                        let k = KernelState {
                            id,
                            op: head.id,
                            slot,
                            arrival,
                            desc: Arc::clone(desc),
                            blocks_per_sm: *blocks_per_sm,
                            time_key: *time_key,
                            pending: BlockRanges::full(desc.shape.blocks),
                            saved: Vec::new(),
                            launches: Launches::default(),
                            live: None,
                        };
                        // `kernels` stays in arrival order (ties: the one already there first).
                        let at = self.kernels.partition_point(|k| k.arrival <= arrival);
                        self.kernels.insert(at, k);
                        return;
                    }
                }
                Work::Sync => {}
                &Work::WaitFor { slot: awaited, op } => {
                    if self.is_queued(awaited, op) {
                        // Woken by `wake_waiters` when `op` ends.
                        self.blocked.push((op, slot));
                        return;
                    }
                }
                Work::Hold { released: false } => return,
                Work::Hold { released: true } => {}
            }
            let Some(p) = self.processes.get_mut(slot) else { return };
            let done = p.stream.pop_front().map(|q| q.id);
            if let Some(op) = done {
                self.completions.push_back(Completion { slot, op, outcome: OpOutcome::Completed });
                self.wake_waiters(op);
            }
        }
    }

    /// Sends the command of the copy at `index` in `slot`'s stream.
    fn issue_copy(&mut self, slot: Slot, index: usize) {
        let Some(p) = self.processes.get_mut(slot) else { return };
        let process = p.info.id;
        let Some(q) = p.stream.get_mut(index) else { return };
        let Work::Copy { direction, bytes } = q.work else { return };
        q.issued = true;
        let copy = CopyId(self.next_copy);
        self.next_copy += 1;
        self.copies.insert(copy, (slot, q.id));
        self.out.push_back(Command::Copy { copy, op: q.id, process, direction, bytes });
    }

    /// Queues the stream's next copy on the device behind the one at its
    /// head, when nothing but markers (recorded events, syncs: they order
    /// nothing on the device) lies between them and both go the same way: a
    /// device's copies of one direction run in the order they came (one
    /// copy engine, one queue per direction), so the next one starts as the
    /// head's ends instead of an engine round later (the device's end seen,
    /// the next command sent). That round was a gap on the copy engine per
    /// chunk of issue 40's pipeline. One copy ahead at most per stream, so
    /// a client's queued copies take turns with other clients' (each device
    /// queue is first come, first served).
    ///
    /// A wait for an operation that has ended orders nothing either: the
    /// pipeline's copy-out stream is a wait for each chunk's kernel, then
    /// its copy, and the kernel of chunk c + 1 ends while chunk c's copy
    /// runs. A wait still waiting stops the look (nothing goes ahead of it),
    /// and the stream is looked at again when what it waits for ends
    /// (`copy_blocked`), so that the copy behind it still goes out before
    /// the head's ends.
    fn copy_ahead(&mut self, slot: Slot) {
        let Some(p) = self.processes.get(slot) else { return };
        let Some(Work::Copy { direction: first, .. }) = p.stream.front().filter(|q| q.issued).map(|q| &q.work) else {
            return;
        };
        let first = *first;
        let mut waiting = None;
        let next = p.stream.iter().enumerate().skip(1).find(|(_, q)| match q.work {
            Work::Sync => false,
            Work::WaitFor { slot: awaited, op } if !self.is_queued(awaited, op) => false,
            Work::WaitFor { op, .. } => {
                waiting = Some(op);
                true
            }
            _ => true,
        });
        let issue = match next {
            Some((i, q)) if !q.issued && matches!(q.work, Work::Copy { direction, .. } if direction == first) => {
                Some(i)
            }
            _ => None,
        };
        if let Some(op) = waiting {
            if !self.copy_blocked.contains(&(op, slot)) {
                self.copy_blocked.push((op, slot));
            }
        }
        if let Some(i) = issue {
            self.issue_copy(slot, i);
        }
    }

    /// The head of `slot`'s stream completed: report it and start the next.
    fn head_done(&mut self, slot: Slot) {
        let Some(p) = self.processes.get_mut(slot) else { return };
        if let Some(q) = p.stream.pop_front() {
            self.completions.push_back(Completion { slot, op: q.id, outcome: OpOutcome::Completed });
            self.wake_waiters(q.id);
        }
        self.start_head(slot);
    }

    /// Whether `op` is still in the stream of the process in `slot` (not
    /// ended). A stream's operations are in id order: a binary search.
    fn is_queued(&self, slot: Slot, op: OpId) -> bool {
        self.processes.get(slot).is_some_and(|p| p.stream.binary_search_by_key(&op, |q| q.id).is_ok())
    }

    /// `op` ended: the streams waiting for it at their head go on.
    fn wake_waiters(&mut self, op: OpId) {
        for slot in take_waiting(&mut self.copy_blocked, op) {
            self.copy_ahead(slot);
        }
        for slot in take_waiting(&mut self.blocked, op) {
            self.start_head(slot);
        }
    }

    /// Releases the [`StreamOp::Hold`] `op` of the process in `slot` at
    /// `now`: it completes at once if it is the stream's head (and the next
    /// operation starts), else when it gets there. `false`: no such hold is
    /// queued (it was released already, or its process removed).
    pub fn release(&mut self, now: Nanos, slot: Slot, op: OpId) -> Result<bool, EngineError> {
        self.advance_to(now);
        let p = self.processes.get_mut(slot).ok_or(EngineError::UnknownSlot(slot))?;
        let Ok(i) = p.stream.binary_search_by_key(&op, |q| q.id) else { return Ok(false) };
        let Work::Hold { released } = &mut p.stream[i].work else { return Ok(false) };
        if *released {
            return Ok(false);
        }
        *released = true;
        if i == 0 {
            self.start_head(slot);
            self.dirty = true;
        }
        Ok(true)
    }

    // ------------------------------------------------------------------ device

    /// Next command for the device. Runs the policy first if anything changed.
    pub fn poll_command(&mut self) -> Result<Option<Command>, EngineError> {
        if self.out.is_empty() && self.dirty {
            self.dirty = false;
            self.run_policy()?;
        }
        Ok(self.out.pop_front())
    }

    /// Whether [`Engine::poll_command`] may have a command now: one is queued,
    /// or something changed since the policy last ran. A front end that
    /// stops draining commands early (a bounded loop) must come back while
    /// this holds, or the device waits for commands the engine already owes it.
    pub fn has_commands_due(&self) -> bool {
        !self.out.is_empty() || self.dirty
    }

    /// When the engine next needs to be woken with `handle_timeout` (a
    /// policy's time slice), if ever.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        self.policy.wake_at().map(|t| t.max(self.now))
    }

    /// Time has reached `now`: the policy runs again at the next `poll_command`.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.advance_to(now);
        self.dirty = true;
    }

    /// Takes the release of every SM in `sms` by `launch` at `now`: what the
    /// device reports as one `SmReleased` per SM, handed over at once (the
    /// same as those events one after the other, in SM order; the policy
    /// runs at the next [`Engine::poll_command`] either way). A launch's end
    /// was one event per SM it held, each with its lookups (issue 35).
    pub fn handle_released(
        &mut self,
        now: Nanos,
        launch: LaunchId,
        sms: SmSet,
        cause: ReleaseCause,
    ) -> Result<(), EngineError> {
        self.advance_to(now);
        self.dirty = true;
        self.on_sms_released(launch, sms, cause)
    }

    /// Takes an event the device reported at `now`.
    pub fn handle_event(&mut self, now: Nanos, event: Event) -> Result<(), EngineError> {
        self.advance_to(now);
        self.dirty = true;
        match event {
            Event::SmReleased { launch, sm, cause } => self.on_sm_released(launch, sm, cause),
            Event::LaunchEnded { launch, remaining, saved, completed: _ } => {
                self.on_launch_ended(launch, remaining, saved)
            }
            Event::CopyDone { copy } => {
                let (slot, op) = self.copies.remove(&copy).ok_or(ProtocolError::UnknownCopy { copy })?;
                // The copy of a removed process was reported dropped already.
                let Some(p) = self.processes.get_mut(slot) else { return Ok(()) };
                match p.stream.iter().position(|q| q.id == op) {
                    Some(0) => self.head_done(slot),
                    // Queued ahead, and done before the copy before it was
                    // reported (a device that reports out of order): it ends
                    // when it reaches the head.
                    Some(i) => p.stream[i].done_early = true,
                    None => {}
                }
                Ok(())
            }
        }
    }

    fn kernel_index(&self, id: KernelId) -> Option<usize> {
        position_of(&self.kernels, id)
    }

    fn finish_kernel(&mut self, id: KernelId) {
        let Some(i) = self.kernel_index(id) else { return };
        let slot = self.kernels.remove(i).slot;
        self.kernels_completed += 1;
        // Stale reservations for this kernel turn into plain preemptions.
        for sm in self.busy {
            if let SmState::Reserved { next, .. } = &mut self.sms[sm.0 as usize] {
                if *next == Some(id) {
                    *next = None;
                }
            }
        }
        self.head_done(slot);
    }

    fn on_sm_released(&mut self, launch: LaunchId, sm: SmId, cause: ReleaseCause) -> Result<(), EngineError> {
        self.on_sms_released(launch, SmSet::single(sm), cause)
    }

    /// Every SM of `sms` released by `launch`, in SM order, as that many
    /// `SmReleased` events would be ([`Engine::handle_released`]), with the
    /// launch and its kernel looked up once.
    fn on_sms_released(&mut self, launch: LaunchId, sms: SmSet, cause: ReleaseCause) -> Result<(), EngineError> {
        let mut rest = sms;
        if cause == ReleaseCause::Retreated && !self.released_early.is_empty() {
            for sm in sms.iter() {
                if let Some(i) = self.released_early.iter().position(|&e| e == (launch, sm)) {
                    // Freed when the retreat was sent.
                    self.released_early.swap_remove(i);
                    rest.remove(sm);
                }
            }
        }
        if rest.is_empty() {
            return Ok(());
        }
        let owner =
            *self.launches.get(launch).ok_or(ProtocolError::UnknownLaunch { launch, by: Message::SmReleased })?;
        for sm in rest.iter() {
            let i = sm.0 as usize;
            let Some(&state) = self.sms.get(i) else {
                let (device, sms) = (self.device.name.clone(), self.sms.len());
                return Err(ProtocolError::NoSuchSm { sm, device, sms }.into());
            };
            match state {
                SmState::Running { launch: l, .. } if l == launch => {}
                SmState::Reserved { launch: l, .. } if l == launch => {
                    if cause == ReleaseCause::Retreated {
                        let at_ns = self.reserved_at[i];
                        self.preemptions.push(PreemptionSample { at_ns, latency_ns: self.now - at_ns });
                    }
                    // Tanasic's SMST `next` only books the SM while it is being
                    // freed; once idle, the policy hands it out again with what it
                    // knows now (the kernel may have finished or fallen behind).
                }
                _ => return Err(ProtocolError::SmNotHeld { launch, sm, state }.into()),
            }
            self.sms[i] = SmState::Idle;
            self.busy.remove(sm);
        }
        if let (ReleaseCause::Exhausted, LaunchOwner::Kernel(kernel)) = (cause, owner) {
            if let Some(ki) = self.kernel_index(kernel) {
                let k = &mut self.kernels[ki];
                if k.live.is_some_and(|l| l.id == launch) {
                    k.live = None;
                }
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
        let owner =
            self.launches.remove(launch).ok_or(ProtocolError::UnknownLaunch { launch, by: Message::LaunchEnded })?;
        // Every SM is released before the end: none of this launch's early ones is still to come.
        let unreleased: SmSet = self.released_early.iter().filter(|e| e.0 == launch).map(|e| e.1).collect();
        if !unreleased.is_empty() {
            return Err(ProtocolError::EndedHoldingSms { launch, sms: unreleased }.into());
        }
        let held: SmSet = self
            .busy
            .into_iter()
            .filter(|sm| matches!(self.sms[sm.0 as usize], SmState::Running { launch: l, .. } | SmState::Reserved { launch: l, .. } if l == launch))
            .collect();
        if !held.is_empty() {
            return Err(ProtocolError::EndedHoldingSms { launch, sms: held }.into());
        }
        // A removed process's work is thrown away.
        let LaunchOwner::Kernel(kernel) = owner else { return Ok(()) };
        let ki = self
            .kernel_index(kernel)
            .expect("a launch's kernel stays active until its last launch ends (or it becomes an orphan)");
        let k = &mut self.kernels[ki];
        k.launches.retain(|x| x != launch);
        for r in remaining.ranges() {
            k.pending.try_insert(r.clone()).map_err(|blocks| ProtocolError::ForeignBlocks { launch, blocks })?;
        }
        k.saved.extend(saved);
        if k.live.is_some_and(|l| l.id == launch) {
            k.live = None;
        }
        if k.pending.is_empty() && k.saved.is_empty() && k.launches.is_empty() {
            self.finish_kernel(kernel);
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
        debug_assert_eq!(
            self.busy,
            (0..self.sms.len()).filter(|&i| self.sms[i] != SmState::Idle).map(|i| SmId(i as u16)).collect(),
            "the busy set is the SM table's SMs that are not idle"
        );
        self.holdings.rebuild(&self.sms, self.busy);
        let view = SchedView::new(
            self.now,
            &self.device,
            &self.sms,
            &self.kernels,
            &self.processes,
            &self.holdings,
            self.in_order_barrier(),
        );
        let mut decisions = std::mem::take(&mut self.decisions);
        self.policy.schedule(&view, &mut decisions);
        let applied = self.apply_decisions(&decisions);
        decisions.clear();
        self.decisions = decisions;
        applied
    }

    /// Submission order only: the earliest issue time of a kernel still
    /// waiting in its stream behind an unfinished operation.
    fn in_order_barrier(&self) -> Option<Nanos> {
        if self.arrival_order != ArrivalOrder::Submission {
            return None;
        }
        self.processes
            .iter()
            .filter_map(|p| {
                p.stream.iter().skip(1).find(|q| matches!(q.work, Work::Kernel { .. })).map(|q| q.submitted)
            })
            .min()
    }

    fn policy_error(&self, what: String) -> EngineError {
        EngineError::Policy { policy: self.policy.name(), what }
    }

    fn apply_decisions(&mut self, decisions: &[Decision]) -> Result<(), EngineError> {
        // Group assignments by kernel so one launch covers all its new SMs.
        let mut grants = std::mem::take(&mut self.grants);
        grants.clear();
        let mut retreats: Vec<(LaunchId, Mechanism, SmSet)> = Vec::new();
        // SMs assigned in this round: they stay idle in the table until granted.
        let mut assigned = SmSet::EMPTY;
        for d in decisions {
            match *d {
                Decision::Assign { sm, kernel, slice } => {
                    match self.sms.get(sm.0 as usize) {
                        Some(SmState::Idle) if assigned.contains(sm) => {
                            return Err(self.policy_error(format!("assigned SM {sm} twice in one round")))
                        }
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
                    assigned.insert(sm);
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
                        if self.kernel_index(n).is_none() {
                            return Err(
                                self.policy_error(format!("reserved SM {sm} for kernel {n}, which is not active"))
                            );
                        }
                    }
                    self.sms[sm.0 as usize] = SmState::Reserved { kernel, launch, next };
                    self.reserved_at[sm.0 as usize] = self.now;
                    match retreats.iter_mut().find(|r| r.0 == launch && r.1 == mechanism) {
                        Some(r) => r.2.insert(sm),
                        None => retreats.push((launch, mechanism, SmSet::single(sm))),
                    }
                }
            }
        }
        // Grants go first: a launch that is growing onto new SMs while losing
        // all its old ones must not end (on a device that frees SMs at once)
        // before the Grow reaches it.
        for &(kernel, sms, slice) in &grants {
            self.grant(kernel, sms, slice);
        }
        self.grants = grants;
        // SMs freed in their retreat's command, by the kernel they were taken for.
        let mut handed: Vec<(KernelId, SmSet)> = Vec::new();
        for (launch, mechanism, sms) in retreats {
            self.out.push_back(Command::Retreat { launch, sms, mechanism });
            if self.retreats_free_at_once {
                // As the device will say in answer to the command: free now.
                for sm in sms.iter() {
                    if let SmState::Reserved { next: Some(k), .. } = self.sms[sm.0 as usize] {
                        match handed.iter_mut().find(|h| h.0 == k) {
                            Some(h) => h.1.insert(sm),
                            None => handed.push((k, SmSet::single(sm))),
                        }
                    }
                    self.sms[sm.0 as usize] = SmState::Idle;
                    self.busy.remove(sm);
                    self.preemptions.push(PreemptionSample { at_ns: self.now, latency_ns: 0 });
                    self.released_early.push((launch, sm));
                }
                self.dirty = true;
            }
        }
        // Freed at this instant, an SM goes to the kernel the policy took it
        // for, after the retreat that frees it: the policy would hand it out
        // the same way in another round (it knows nothing new: no time has
        // passed, no event came), and that round cost an urgent launch its
        // time on the way to the device (a round is a few µs on the H100's
        // host). Policies that preempt for a kernel give SMs without a time
        // slice; the engine's next round still runs (`dirty`) for the rest.
        for (kernel, sms) in handed {
            self.grant(kernel, sms, None);
        }
        Ok(())
    }

    /// Gives idle SMs to an active kernel: grows its live launch or starts a
    /// new one with (a slice of) what it has left.
    fn grant(&mut self, kernel: KernelId, sms: SmSet, slice: Option<u64>) {
        let Some(ki) = self.kernel_index(kernel) else { return };
        let k = &mut self.kernels[ki];
        let launch = match k.live {
            Some(l) => {
                self.out.push_back(Command::Grow { launch: l.id, sms });
                l.id
            }
            None => {
                let blocks = match slice {
                    Some(n) => k.pending.take_prefix(n.max(1)),
                    None => std::mem::take(&mut k.pending),
                };
                let restore = std::mem::take(&mut k.saved);
                if blocks.is_empty() && restore.is_empty() {
                    // Nothing to run (its last blocks are finishing elsewhere): the SMs stay idle.
                    self.dirty = true;
                    return;
                }
                let id = LaunchId(self.next_launch);
                self.next_launch += 1;
                k.launches.push(id);
                k.live = Some(LiveLaunch { id, blocks: blocks.len() + restore.len() as u64 });
                self.launches.insert(id, LaunchOwner::Kernel(kernel));
                let p = self.processes.info(k.slot).expect("an active kernel's process is live");
                self.out.push_back(Command::Launch {
                    launch: id,
                    kernel,
                    op: k.op,
                    process: p.id,
                    priority: p.priority,
                    desc: Arc::clone(&k.desc),
                    time_key: k.time_key,
                    blocks,
                    restore,
                    sms,
                });
                id
            }
        };
        for sm in sms.iter() {
            self.sms[sm.0 as usize] = SmState::Running { kernel, launch };
        }
        self.busy = self.busy.union(&sms);
    }
}

/// Takes the streams of `list` waiting for `op` out of it (`Engine::blocked`,
/// `Engine::copy_blocked`), in their order there. Most ops end with nothing
/// waiting for them: an empty list costs one check and no allocation.
fn take_waiting(list: &mut Vec<(OpId, Slot)>, op: OpId) -> Vec<Slot> {
    if list.is_empty() {
        return Vec::new();
    }
    let mut woken = Vec::new();
    list.retain(|&(awaited, slot)| {
        if awaited == op {
            woken.push(slot);
        }
        awaited != op
    });
    woken
}

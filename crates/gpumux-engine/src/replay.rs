//! Workload replay: the front-end that plays the hosts of a [`Workload`] on
//! the engine's live interface.
//!
//! Each workload process becomes an engine process. Its host thread walks
//! its operations: GPU operations go to its stream ([`Engine::submit`]),
//! host computation (`Op::Cpu`) keeps the host busy for a while, and `Sync`
//! and the end of a run wait for the stream to drain, which the host learns
//! from the engine's completions. The host may run ahead of its stream by
//! `async_depth` operations. A process arrives at its `arrival_ns`, runs its
//! operations `repetitions` times, or, with `replay_min_runs` (Tanasic 4.1),
//! replays until every process has completed that many runs. Run spans go
//! into the [`RunRecord`].
//!
//! [`Replay`] offers the driver the engine's device side unchanged
//! (`poll_command`, `handle_event`...), adding its own timers (arrivals, host
//! time) to `poll_timeout` and `handle_timeout`.

use crate::device::{Command, CopyDirection, Event};
use crate::engine::{ArrivalOrder, Engine, EngineError};
use crate::ids::OpId;
use crate::ids::{ProcessId, Slot};
use crate::kernel::DeviceInfo;
use crate::model::{Op, ProcessSpec, Workload};
use crate::policy::Policy;
use crate::process::{ProcessInfo, StreamOp};
use crate::record::{ProcessRecord, RunRecord, RunSpan};
use crate::time::{later, Nanos};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// A host's own timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The process arrives.
    Arrival(usize),
    /// The host's computation (`Op::Cpu`) ends.
    HostDone(usize),
}

/// The host thread of one workload process.
struct Host {
    spec: ProcessSpec,
    /// The workload's id for it.
    id: ProcessId,
    slot: Slot,
    arrived: bool,
    finished: bool,
    runs_started: u32,
    /// Next operation of the current run.
    op_idx: usize,
    /// Computing (`Op::Cpu`) until a `HostDone` timer.
    computing: bool,
    /// GPU operations submitted and not completed.
    in_flight: usize,
    run_start: Nanos,
    runs: Vec<RunSpan>,
    /// `WaitEvent`s issued so far, by event name (the next waits for that
    /// many recordings plus one).
    waits: HashMap<String, usize>,
    /// The event whose next recording the host waits for before it can
    /// issue its `WaitEvent`.
    blocked_on: Option<String>,
}

/// Replays a workload on an [`Engine`] (see the module doc).
pub struct Replay {
    engine: Engine,
    hosts: Vec<Host>,
    /// The host of each engine slot, by `Slot::index`.
    host_of_slot: Vec<usize>,
    replay_min_runs: Option<u32>,
    /// With `replay_min_runs`: processes that have completed fewer runs
    /// (kept as a count so ending a run does not scan every process).
    short_of_min_runs: usize,
    /// Processes not finished yet (`is_finished` is asked after every event).
    unfinished: usize,
    timers: BinaryHeap<Reverse<(Nanos, u64, Timer)>>,
    timer_seq: u64,
    /// Operations the hosts have issued (progress displays).
    ops_issued: u64,
    /// An error found where no `Result` can be returned (a host timer that
    /// does not fit in `Nanos`); `poll_command` reports it.
    fault: Option<EngineError>,
    /// Each event's recordings so far, in order: the marker's process and
    /// operation (`Op::Record`, `Op::WaitEvent`).
    recorded: HashMap<String, Vec<(Slot, OpId)>>,
    /// The events some process of this run records: a wait for any other
    /// orders nothing (an isolated run of a pipeline's stage, whose
    /// producer is not there, runs the stage's own work alone).
    recordable: std::collections::HashSet<String>,
    /// Hosts a recording unblocked, to step next.
    woken: Vec<usize>,
}

impl Replay {
    /// A replay of `workload` on `device` under `policy`; `only` restricts it
    /// to one process (the isolated runs that NTT is normalised by).
    pub fn new(
        workload: &Workload,
        device: DeviceInfo,
        policy: Box<dyn Policy>,
        only: Option<ProcessId>,
    ) -> Result<Self, EngineError> {
        let mut engine = Engine::new(device, policy)?;
        // Only the processes this run has: an isolated run must not cost
        // O(all processes), or a workload's N isolated runs cost O(N²).
        let (specs, first_id): (&[ProcessSpec], u32) = match only {
            Some(o) => (workload.processes.get(o.0 as usize).map(std::slice::from_ref).unwrap_or_default(), o.0),
            None => (&workload.processes, 0),
        };
        // Refuse up front a kernel that can never run, rather than fail mid-run.
        for p in specs {
            for op in &p.ops {
                if let Op::Kernel(k) = op {
                    engine.device().blocks_per_sm(k)?;
                }
            }
        }
        if specs.is_empty() {
            return Err(EngineError::Empty);
        }
        let mut hosts = Vec::with_capacity(specs.len());
        let mut host_of_slot = Vec::with_capacity(specs.len());
        for (i, spec) in specs.iter().enumerate() {
            let id = ProcessId(first_id + i as u32);
            let info = ProcessInfo::new(id, spec.name.as_str()).with_priority(spec.priority).with_weight(spec.weight);
            let slot = engine.add_process(info)?;
            let at = slot.index() as usize;
            if host_of_slot.len() <= at {
                host_of_slot.resize(at + 1, usize::MAX);
            }
            host_of_slot[at] = i;
            hosts.push(Host {
                spec: spec.clone(),
                id,
                slot,
                arrived: false,
                finished: false,
                runs_started: 0,
                op_idx: 0,
                computing: false,
                in_flight: 0,
                run_start: 0,
                runs: Vec::new(),
                waits: HashMap::new(),
                blocked_on: None,
            });
        }
        let short_of_min_runs = match workload.replay_min_runs {
            Some(min) if min > 0 => hosts.len(),
            _ => 0,
        };
        let mut r = Replay {
            engine,
            unfinished: hosts.len(),
            hosts,
            host_of_slot,
            replay_min_runs: workload.replay_min_runs,
            short_of_min_runs,
            timers: BinaryHeap::new(),
            timer_seq: 0,
            ops_issued: 0,
            fault: None,
            recorded: HashMap::new(),
            recordable: specs
                .iter()
                .flat_map(|p| &p.ops)
                .filter_map(|op| match op {
                    Op::Record { event } => Some(event.clone()),
                    _ => None,
                })
                .collect(),
            woken: Vec::new(),
        };
        for h in 0..r.hosts.len() {
            let at = r.hosts[h].spec.arrival_ns;
            r.push_timer(at, Timer::Arrival(h));
        }
        Ok(r)
    }

    /// Orders active kernels by `order` (default: head of stream).
    pub fn with_arrival_order(mut self, order: ArrivalOrder) -> Self {
        self.engine = self.engine.with_arrival_order(order);
        self
    }

    /// The policy's name.
    pub fn policy_name(&self) -> String {
        self.engine.policy_name()
    }

    /// The device the workload runs on.
    pub fn device(&self) -> &DeviceInfo {
        self.engine.device()
    }

    /// The time of the latest input.
    pub fn now(&self) -> Nanos {
        self.engine.now()
    }

    /// Whether every process has finished its runs.
    pub fn is_finished(&self) -> bool {
        self.unfinished == 0
    }

    /// Operations (kernels, copies, host ops, syncs) issued so far, over all
    /// runs of all processes.
    pub fn ops_issued(&self) -> u64 {
        self.ops_issued
    }

    /// Next command for the device ([`Engine::poll_command`]).
    pub fn poll_command(&mut self) -> Result<Option<Command>, EngineError> {
        if let Some(e) = self.fault.take() {
            return Err(e);
        }
        self.engine.poll_command()
    }

    /// When the replay next needs `handle_timeout`: a host's timer or the policy's.
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let host = self.timers.peek().map(|Reverse((t, _, _))| *t);
        match (host, self.engine.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Time has reached `now`: fires the hosts' timers that are due.
    pub fn handle_timeout(&mut self, now: Nanos) {
        // A policy timer (slice end) also lands here.
        self.engine.handle_timeout(now);
        while let Some(Reverse((t, _, timer))) = self.timers.peek().copied() {
            if t > self.engine.now() {
                break;
            }
            self.timers.pop();
            let h = match timer {
                Timer::Arrival(h) => {
                    self.hosts[h].arrived = true;
                    self.start_run(h);
                    h
                }
                Timer::HostDone(h) => {
                    self.hosts[h].computing = false;
                    h
                }
            };
            self.step(h);
        }
    }

    /// Takes an event the device reported at `now`.
    pub fn handle_event(&mut self, now: Nanos, event: Event) -> Result<(), EngineError> {
        self.engine.handle_event(now, event)?;
        self.settle();
        Ok(())
    }

    /// What happened, for metrics. Call when `is_finished()`.
    pub fn record(&self) -> RunRecord {
        RunRecord {
            policy: self.engine.policy_name(),
            makespan_ns: self.engine.now(),
            processes: self
                .hosts
                .iter()
                .map(|h| ProcessRecord {
                    id: h.id,
                    name: h.spec.name.clone(),
                    priority: h.spec.priority,
                    arrival_ns: h.spec.arrival_ns,
                    runs: h.runs.clone(),
                })
                .collect(),
            preemptions: self.engine.preemptions().to_vec(),
            kernels_completed: self.engine.kernels_completed(),
        }
    }

    // ------------------------------------------------------------------ hosts

    fn push_timer(&mut self, at: Nanos, t: Timer) {
        self.timer_seq += 1;
        self.timers.push(Reverse((at, self.timer_seq, t)));
    }

    fn start_run(&mut self, h: usize) {
        let now = self.engine.now();
        let host = &mut self.hosts[h];
        host.runs_started += 1;
        host.op_idx = 0;
        host.run_start = now;
    }

    /// Moves host `h` as far as it can go, then every host that an operation
    /// completing meanwhile lets move.
    fn step(&mut self, h: usize) {
        self.step_host(h);
        self.step_woken();
        self.settle();
    }

    /// Steps the hosts that a recording let go on (`Op::WaitEvent`).
    fn step_woken(&mut self) {
        while let Some(h) = self.woken.pop() {
            self.step_host(h);
        }
    }

    /// Hands the engine's completions to their hosts. An operation can
    /// complete inside `submit` (a sync, an empty grid), so this runs after
    /// every host step, before anything else happens.
    fn settle(&mut self) {
        while let Some(c) = self.engine.poll_completion() {
            let Some(&h) = self.host_of_slot.get(c.slot.index() as usize) else { continue };
            self.hosts[h].in_flight -= 1;
            self.step_host(h);
            self.step_woken();
        }
    }

    /// Whether a process that just completed a run should start another.
    fn wants_another_run(&self, h: usize) -> bool {
        let host = &self.hosts[h];
        match self.replay_min_runs {
            // Keep replaying while anyone (this process included) is short of runs.
            Some(_) => self.short_of_min_runs > 0,
            None => host.runs_started < host.spec.repetitions.max(1),
        }
    }

    /// Records a completed run of host `h`.
    fn end_run(&mut self, h: usize) {
        let span = RunSpan { start_ns: self.hosts[h].run_start, end_ns: self.engine.now() };
        let runs = &mut self.hosts[h].runs;
        runs.push(span);
        if self.replay_min_runs.is_some_and(|min| runs.len() == min as usize) {
            self.short_of_min_runs -= 1;
        }
    }

    /// `Op::Record` of `event` was issued as operation `op` of `slot`: the
    /// hosts waiting for that recording go on.
    fn recorded_event(&mut self, event: String, slot: Slot, op: OpId) {
        self.recorded.entry(event).or_default().push((slot, op));
        for (i, host) in self.hosts.iter_mut().enumerate() {
            let Some(name) = &host.blocked_on else { continue };
            let Some(r) = self.recorded.get(name) else { continue };
            if host.waits.get(name).copied().unwrap_or(0) < r.len() {
                host.blocked_on = None;
                self.woken.push(i);
            }
        }
    }

    /// Moves the host thread of `h` as far as it can go now.
    fn step_host(&mut self, h: usize) {
        loop {
            let host = &self.hosts[h];
            if host.finished || !host.arrived || host.computing || host.blocked_on.is_some() {
                return;
            }
            if host.op_idx == host.spec.ops.len() {
                // End of a run: the host synchronises with its stream.
                if host.in_flight > 0 {
                    return;
                }
                self.end_run(h);
                if self.wants_another_run(h) {
                    self.start_run(h);
                    continue;
                }
                self.hosts[h].finished = true;
                self.unfinished -= 1;
                return;
            }
            // The host may run ahead of its stream by at most `async_depth` operations.
            if host.in_flight > host.spec.async_depth as usize {
                return;
            }
            let op_idx = host.op_idx;
            let now = self.engine.now();
            let stream_op = match &host.spec.ops[op_idx] {
                Op::Sync if host.in_flight > 0 => return, // a completion steps the host again
                Op::Sync => None,
                Op::Cpu { ns } => {
                    let what = || format!("host (cpu) operation {} of process `{}`", op_idx + 1, host.spec.name);
                    match later(now, *ns, what) {
                        Ok(at) => self.push_timer(at, Timer::HostDone(h)),
                        // The host stays busy: the run stops at the next `poll_command`.
                        Err(e) => {
                            self.fault.get_or_insert(e.into());
                        }
                    }
                    self.hosts[h].computing = true;
                    self.hosts[h].op_idx += 1;
                    self.ops_issued += 1;
                    return;
                }
                Op::Kernel(desc) => {
                    // Same block times for this operation under every policy and alone.
                    let time_key = ((host.id.0 as u64) << 40) ^ (op_idx as u64);
                    Some(StreamOp::Kernel { desc: desc.clone(), time_key })
                }
                Op::CopyToDevice { bytes } => {
                    Some(StreamOp::Copy { direction: CopyDirection::HostToDevice, bytes: *bytes })
                }
                Op::CopyToHost { bytes } => {
                    Some(StreamOp::Copy { direction: CopyDirection::DeviceToHost, bytes: *bytes })
                }
                Op::Record { .. } => Some(StreamOp::Sync),
                Op::WaitEvent { event } if !self.recordable.contains(event) => None,
                Op::WaitEvent { event } => {
                    let k = host.waits.get(event).copied().unwrap_or(0);
                    match self.recorded.get(event).and_then(|r| r.get(k)) {
                        Some(&(slot, op)) => Some(StreamOp::WaitFor { slot, op }),
                        None => {
                            // Stepped again when the recording is issued.
                            self.hosts[h].blocked_on = Some(event.clone());
                            return;
                        }
                    }
                }
            };
            let slot = host.slot;
            self.hosts[h].op_idx += 1;
            self.ops_issued += 1;
            if let Some(op) = stream_op {
                self.hosts[h].in_flight += 1;
                let id = match self.engine.submit(now, slot, op) {
                    Ok(id) => id,
                    Err(e) => {
                        // Cannot happen: kernels were checked in `new` and no slot is removed.
                        self.fault.get_or_insert(e);
                        return;
                    }
                };
                // Only event operations pay for a look (and a name's clone) here.
                let event = match &self.hosts[h].spec.ops[op_idx] {
                    Op::Record { event } => Some((true, event.clone())),
                    Op::WaitEvent { event } => Some((false, event.clone())),
                    _ => None,
                };
                // (A wait that orders nothing submitted nothing: it is not counted.)
                match event {
                    Some((true, event)) => self.recorded_event(event, slot, id),
                    Some((false, event)) => *self.hosts[h].waits.entry(event).or_insert(0) += 1,
                    None => {}
                }
            }
        }
    }
}

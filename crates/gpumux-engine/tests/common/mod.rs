//! The scripted-device harness the engine's integration tests share: an
//! engine and a `ScriptedDevice` stepped by hand, and what the device was told.
#![allow(dead_code)] // each test file uses a part of it

use gpumux_engine::device::ReleaseCause;
use gpumux_engine::kernel::{DeviceInfo, KernelDesc, KernelShape, SimTiming, SmLimits};
use gpumux_engine::scripted::ScriptedDevice;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use gpumux_engine::{
    policies, Command, Completion, Device, DeviceError, Engine, Event, KernelId, LaunchId, OpOutcome, ProcessId,
    ProcessInfo, Slot, SmId, StreamOp,
};
use std::sync::Arc;

pub const SMS: u16 = 8;
/// Blocks of `kernel` one SM holds at once on `device()`.
pub const PER_SM: u64 = 8;
pub const WAVE_NS: Nanos = 10_000;

pub fn device() -> DeviceInfo {
    DeviceInfo {
        name: "scripted-8".into(),
        num_sms: SMS,
        sm: SmLimits { max_threads: 2048, max_blocks: 16, registers: 65536, smem_bytes: 48 * 1024 },
        mem_bandwidth: 1e11,
        pcie_bandwidth: 1e10,
        pcie_latency_ns: 1_000,
        mem_bytes: 1 << 30,
    }
}

/// A kernel of `waves` full waves of the whole device, each taking `WAVE_NS`.
pub fn kernel(name: &str, waves: u64) -> StreamOp {
    StreamOp::Kernel { desc: desc(name, waves * PER_SM * SMS as u64), time_key: 0 }
}

pub fn desc(name: &str, blocks: u64) -> Arc<KernelDesc> {
    Arc::new(KernelDesc::new(name, KernelShape::new(blocks, 256, 32)).with_sim_timing(SimTiming::new(WAVE_NS)))
}

/// An engine and a scripted device, stepped by hand.
pub struct Bench {
    pub engine: Engine,
    pub dev: ScriptedDevice,
    pub now: Nanos,
    pub completions: Vec<(Nanos, Completion)>,
    /// Hand a launch's SMs released one after the other in increasing order
    /// to the engine as one release (`Engine::handle_released`), as gpumuxd's core does.
    pub coalesce: bool,
    /// SMs handed over merged into a release of several (with `coalesce`).
    pub merged: u64,
}

impl Bench {
    pub fn new(policy: &str) -> Self {
        Bench::with_policy(policies::by_name(policy).expect("a catalogued policy"))
    }

    /// With a policy made by the test.
    pub fn with_policy(policy: Box<dyn gpumux_engine::Policy>) -> Self {
        let engine = Engine::new(device(), policy).expect("engine");
        Bench {
            engine,
            dev: ScriptedDevice::new(device()),
            now: 0,
            completions: Vec::new(),
            coalesce: false,
            merged: 0,
        }
    }

    /// [`Bench::freeing_at_once`] with a policy made by the test.
    pub fn freeing_at_once_with(policy: Box<dyn gpumux_engine::Policy>) -> Self {
        let mut b = Bench::with_policy(policy);
        b.engine = std::mem::replace(
            &mut b.engine,
            Engine::new(device(), policies::by_name("fcfs").expect("fcfs")).expect("engine"),
        )
        .with_retreats_freeing_at_once(true);
        b.dev = ScriptedDevice::new(device()).freeing_retreats_in_the_command();
        b
    }

    /// The same with an engine built `with_retreats_freeing_at_once` and a
    /// device that frees a retreat's SMs in the command (the CUDA device's way).
    pub fn freeing_at_once(policy: &str) -> Self {
        let mut b = Bench::new(policy);
        let policy = policies::by_name(policy).expect("a catalogued policy");
        b.engine = Engine::new(device(), policy).expect("engine").with_retreats_freeing_at_once(true);
        b.dev = ScriptedDevice::new(device()).freeing_retreats_in_the_command();
        b
    }

    pub fn add(&mut self, id: u32, priority: i32) -> Slot {
        let info = ProcessInfo::new(ProcessId(id), format!("p{id}")).with_priority(priority);
        self.engine.add_process(info).expect("a valid process")
    }

    pub fn submit(&mut self, slot: Slot, op: StreamOp) -> gpumux_engine::OpId {
        self.engine.submit(self.now, slot, op).expect("submit")
    }

    /// Hands the engine's commands to the device, and its completions to `completions`.
    pub fn flush(&mut self) {
        while let Some(cmd) = self.engine.poll_command().expect("engine") {
            self.dev.submit(self.now, cmd).expect("device accepts engine commands");
        }
        while let Some(c) = self.engine.poll_completion() {
            self.completions.push((self.now, c));
        }
    }

    /// Runs until `stop` (or until nothing is left to do, without it).
    pub fn run(&mut self, stop: Option<Nanos>) {
        let mut events = Vec::new();
        loop {
            self.flush();
            let deadline = match (self.engine.poll_timeout(), stop) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            events.clear();
            self.now = match self.dev.advance(deadline, &mut events) {
                Ok(t) => t,
                Err(DeviceError::Stalled { .. }) => return,
                Err(e) => panic!("device: {e}"),
            };
            if self.coalesce {
                self.hand_coalesced(&mut events);
            }
            for ev in events.drain(..) {
                self.engine.handle_event(self.now, ev).expect("engine accepts device events");
            }
            if deadline.is_some_and(|d| d <= self.now) {
                self.engine.handle_timeout(self.now);
            }
            if stop.is_some_and(|s| self.now >= s) {
                self.flush();
                return;
            }
        }
    }

    /// Hands `events` (drained) to the engine, runs of one launch's SMs
    /// released in increasing order as one release each (gpumuxd's
    /// `engine_on_events` does the same).
    fn hand_coalesced(&mut self, events: &mut Vec<Event>) {
        let now = self.now;
        let mut run: Option<(LaunchId, ReleaseCause, SmId, SmSet)> = None;
        let flush = |engine: &mut Engine, run: &mut Option<(LaunchId, ReleaseCause, SmId, SmSet)>| {
            if let Some((l, c, _, set)) = run.take() {
                engine.handle_released(now, l, set, c).expect("engine accepts device events");
            }
        };
        for ev in events.drain(..) {
            match ev {
                Event::SmReleased { launch, sm, cause } => match &mut run {
                    Some((l, c, last, set)) if *l == launch && *c == cause && sm > *last => {
                        set.insert(sm);
                        *last = sm;
                        self.merged += 1;
                    }
                    _ => {
                        flush(&mut self.engine, &mut run);
                        run = Some((launch, cause, sm, SmSet::single(sm)));
                    }
                },
                other => {
                    flush(&mut self.engine, &mut run);
                    self.engine.handle_event(now, other).expect("engine accepts device events");
                }
            }
        }
        flush(&mut self.engine, &mut run);
    }

    /// Commands (with their times) sent at or after `from`.
    pub fn commands_since(&self, from: Nanos) -> impl Iterator<Item = &Command> {
        self.dev.log().iter().filter(move |(t, _)| *t >= from).map(|(_, c)| c)
    }

    /// The kernel of the first launch for front-end process `id`.
    pub fn kernel_of(&self, id: u32) -> Option<KernelId> {
        self.dev.log().iter().find_map(|(_, c)| match c {
            Command::Launch { kernel, process, .. } if process.0 == id => Some(*kernel),
            _ => None,
        })
    }

    /// SMs the launches of `kernel` were given (launched on or grown onto) at or after `from`.
    pub fn sms_given(&self, kernel: KernelId, from: Nanos) -> SmSet {
        let mine: Vec<LaunchId> = self
            .dev
            .log()
            .iter()
            .filter_map(|(_, c)| match c {
                Command::Launch { launch, kernel: k, .. } if *k == kernel => Some(*launch),
                _ => None,
            })
            .collect();
        self.commands_since(from).fold(SmSet::EMPTY, |acc, c| match c {
            Command::Launch { kernel: k, sms, .. } if *k == kernel => acc.union(sms),
            Command::Grow { launch, sms } if mine.contains(launch) => acc.union(sms),
            _ => acc,
        })
    }

    /// SMs running launches of front-end process `id`, from the commands so far.
    pub fn sms_running(&self, id: u32) -> SmSet {
        let mut mine: Vec<LaunchId> = Vec::new();
        let mut held = SmSet::EMPTY;
        for (_, c) in self.dev.log() {
            match c {
                Command::Launch { launch, process, sms, .. } if process.0 == id => {
                    mine.push(*launch);
                    held = held.union(sms);
                }
                Command::Grow { launch, sms } if mine.contains(launch) => held = held.union(sms),
                Command::Retreat { launch, sms, .. } if mine.contains(launch) => held = held.difference(sms),
                _ => {}
            }
        }
        held
    }

    pub fn outcomes(&self, slot: Slot) -> Vec<OpOutcome> {
        self.completions.iter().filter(|(_, c)| c.slot == slot).map(|(_, c)| c.outcome).collect()
    }
}

/// A small deterministic generator (the test needs no crate for it).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next(&mut self, below: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % below.max(1)
    }
}

/// One seeded workload on `b` (processes of priorities 0-2 coming, submitting
/// kernels of one block to three waves, and leaving): what the device was told and what completed, in order.
pub fn seeded_run(b: Bench, seed: u64) -> (Vec<(Nanos, String)>, Vec<String>) {
    let (commands, completions, _) = seeded_run_merged(b, seed);
    (commands, completions)
}

/// [`seeded_run`], and how many SMs went to the engine merged (`Bench::merged`).
pub fn seeded_run_merged(mut b: Bench, seed: u64) -> (Vec<(Nanos, String)>, Vec<String>, u64) {
    let mut rng = Lcg(seed);
    let priorities = [0, 0, 1, 2, 0];
    let mut slots: Vec<Option<Slot>> = vec![None; priorities.len()];
    let full = PER_SM * SMS as u64;
    for step in 0..60u64 {
        let p = rng.next(priorities.len() as u64) as usize;
        match (slots[p], rng.next(10)) {
            (None, _) => slots[p] = Some(b.add(p as u32, priorities[p])),
            // Leaves now and then, with whatever it still had queued.
            (Some(s), 0) if step > 10 => {
                b.engine.remove_process(b.now, s).expect("removes");
                slots[p] = None;
            }
            (Some(s), _) => {
                // From one block to three waves of the whole device.
                let blocks = 1 + rng.next(3 * full);
                b.submit(s, StreamOp::Kernel { desc: desc(&format!("k{step}"), blocks), time_key: step });
            }
        }
        let until = b.now + rng.next(2 * WAVE_NS) + 1;
        b.run(Some(until));
    }
    b.run(None);
    let commands = b.dev.log().iter().map(|(t, c)| (*t, format!("{c:?}"))).collect();
    let completions = b.completions.iter().map(|(t, c)| format!("{t} {c:?}")).collect();
    (commands, completions, b.merged)
}

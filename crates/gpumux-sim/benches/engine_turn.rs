//! Criterion benchmark of the engine's turn for an urgent kernel, as gpumuxd
//! drives it on a CUDA device (the policy `ppq-even-drain`, retreats freeing
//! their SMs in the command): a low-priority kernel fills the H100's 132 SMs,
//! a 132-block urgent kernel arrives. Three phases, each timed on its own:
//!
//! * `decide`: the urgent kernel's submit → its launch command (the policy
//!   takes SMs from the low-priority kernel: a `Retreat`, then the `Launch`);
//! * `released`: the device's events for that (each retreated SM released,
//!   the urgent launch's SMs exhausted) → nothing left to send;
//! * `ended`: the urgent launch's end → the engine's commands after it (the
//!   low-priority kernel grows back).
//!
//! The engine alone, no device: what an urgent launch's `decide` stage in
//! gpumuxd's stage log owes to the engine (docs/daemon.md, "Where a launch's
//! time goes").

use criterion::{criterion_group, criterion_main, Criterion};
use gpumux_engine::device::{Command, Event, ReleaseCause};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::{policies, Engine, KernelDesc, KernelShape, ProcessId, ProcessInfo, Slot, StreamOp};
use gpumux_sim::presets;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An engine with the low-priority kernel running on every SM.
struct Turn {
    engine: Engine,
    hp: Slot,
    hp_desc: Arc<KernelDesc>,
    now: u64,
    key: u64,
}

impl Turn {
    fn new() -> Turn {
        let policy = policies::by_name("ppq-even-drain").expect("the policy");
        let mut engine = Engine::new(presets::h100(), policy).expect("an engine").with_retreats_freeing_at_once(true);
        let lp = engine.add_process(ProcessInfo::new(ProcessId(0), "lp")).expect("a process");
        let hp = engine.add_process(ProcessInfo::new(ProcessId(1), "hp").with_priority(1)).expect("a process");
        // 20 waves of 8 blocks an SM, queued three deep: it never runs out.
        let lp_desc = Arc::new(KernelDesc::new("lp", KernelShape::new(132 * 8 * 20, 256, 32)));
        for key in 0..3 {
            engine.submit(1, lp, StreamOp::Kernel { desc: lp_desc.clone(), time_key: key }).expect("submit");
        }
        while engine.poll_command().expect("commands").is_some() {}
        let hp_desc = Arc::new(KernelDesc::new("hp", KernelShape::new(132, 256, 32)));
        Turn { engine, hp, hp_desc, now: 1, key: 100 }
    }

    /// One urgent kernel from arrival to end; the time of each phase.
    fn urgent(&mut self) -> [Duration; 3] {
        let e = &mut self.engine;
        self.now += 1_000_000;
        self.key += 1;
        let start = Instant::now();
        e.submit(self.now, self.hp, StreamOp::Kernel { desc: self.hp_desc.clone(), time_key: self.key })
            .expect("submit");
        let mut decide = None;
        let mut commands = Vec::new();
        while let Some(c) = e.poll_command().expect("commands") {
            if decide.is_none() && matches!(c, Command::Launch { process: ProcessId(1), .. }) {
                decide = Some(start.elapsed());
            }
            commands.push(c);
        }
        let decide = decide.expect("the urgent kernel's launch");
        let mut events = Vec::new();
        let mut urgent = None;
        for c in &commands {
            match c {
                Command::Retreat { launch, sms, .. } => events.extend(sms.iter().map(|sm| Event::SmReleased {
                    launch: *launch,
                    sm,
                    cause: ReleaseCause::Retreated,
                })),
                Command::Launch { launch, sms, process: ProcessId(1), .. } => {
                    urgent = Some(*launch);
                    events.extend(sms.iter().map(|sm| Event::SmReleased {
                        launch: *launch,
                        sm,
                        cause: ReleaseCause::Exhausted,
                    }));
                }
                _ => {}
            }
        }
        self.now += 5_000;
        let start = Instant::now();
        for ev in events {
            e.handle_event(self.now, ev).expect("an event");
        }
        while e.poll_command().expect("commands").is_some() {}
        let released = start.elapsed();
        self.now += 15_000;
        let start = Instant::now();
        let launch = urgent.expect("the urgent launch");
        let end = Event::LaunchEnded { launch, remaining: BlockRanges::default(), saved: Vec::new(), completed: 132 };
        e.handle_event(self.now, end).expect("its end");
        while e.poll_command().expect("commands").is_some() {}
        while e.poll_completion().is_some() {}
        [decide, released, start.elapsed()]
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("engine-turn/h100/ppq-even-drain");
    g.sample_size(50);
    for (i, phase) in ["decide", "released", "ended"].into_iter().enumerate() {
        g.bench_function(phase, |b| {
            let mut turn = Turn::new();
            b.iter_custom(|iters| (0..iters).map(|_| turn.urgent()[i]).sum())
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

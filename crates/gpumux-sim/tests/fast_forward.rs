//! The simulated GPU's fast forward (`src/gpu/fast_forward.rs`: waves of a
//! lone grid of identical blocks skipped in one step) changes nothing but
//! the simulator's speed: the same workloads, under the policies the daemon
//! and the experiments use and under a policy of random preemptions (every
//! mechanism, random slices), give the same events at the same times, the
//! same completions and the same device counters with it as without it.
//!
//! The engine is driven through its live interface, as gpumuxd drives it,
//! and polled at random instants (`until`), as the daemon's wall clock does.

use gpumux_engine::device::{Device, DeviceStats, Event};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::policy::Policy;
use gpumux_engine::time::Nanos;
use gpumux_engine::{policies, Engine, OpId, OpOutcome, ProcessId, ProcessInfo, Slot, StreamOp};
use gpumux_sim::timing::mix64;
use gpumux_sim::{presets, SimGpu};
use proptest::prelude::*;
use std::sync::Arc;

mod common;
use common::Chaos;

/// One kernel of a plan: which process, when, its grid and block.
#[derive(Clone, Debug)]
struct Step {
    process: usize,
    at: Nanos,
    blocks: u64,
    threads: u32,
    block_ns: Nanos,
    /// Not all identical blocks: never skipped, but beside skipped ones.
    spread: bool,
    idempotent: bool,
}

fn plan(seed: u64) -> (Vec<i32>, Vec<Step>) {
    let mut s = seed;
    let mut next = move || {
        s = mix64(s);
        s
    };
    let processes = 1 + (next() % 3) as usize;
    let priorities = (0..processes).map(|_| (next() % 2) as i32).collect();
    let mut steps = Vec::new();
    let mut at = 0;
    for _ in 0..(1 + next() % 6) {
        steps.push(Step {
            process: (next() % processes as u64) as usize,
            at,
            // Up to a few hundred waves of a K20c (13 SMs, up to 16 blocks each).
            blocks: 1 + next() % 40_000,
            threads: [32, 128, 256, 1024][(next() % 4) as usize],
            block_ns: 1 + next() % 5_000,
            spread: next() % 5 == 0,
            idempotent: next() % 2 == 0,
        });
        at += next() % 400_000;
    }
    (priorities, steps)
}

/// What a run showed: every device event with its time, each operation's
/// end, the device's counters.
#[derive(Debug, PartialEq)]
struct Run {
    events: Vec<(Nanos, Event)>,
    ended: Vec<(Nanos, OpId, OpOutcome)>,
    stats: DeviceStats,
    /// `MemStats`, compared as its fields' bits.
    mem: [u64; 4],
}

fn run(priorities: &[i32], steps: &[Step], policy: Box<dyn Policy>, seed: u64, fast: bool) -> (Run, u64) {
    let info = presets::k20c();
    let mut engine = Engine::new(info.clone(), policy).expect("engine");
    let mut gpu = SimGpu::new(info, seed).with_fast_forward(fast);
    let slots: Vec<Slot> = priorities
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            engine.add_process(ProcessInfo::new(ProcessId(i as u32), format!("p{i}")).with_priority(p)).expect("add")
        })
        .collect();
    let mut out = Run { events: Vec::new(), ended: Vec::new(), stats: DeviceStats::default(), mem: [0; 4] };
    // The driver's polls: at random instants, as a wall clock would.
    let mut poll = seed;
    let mut now: Nanos = 0;
    let mut next_step = 0;
    let mut events = Vec::new();
    for _ in 0..10_000_000 {
        while let Some(s) = steps.get(next_step).filter(|s| s.at <= now) {
            let mut timing = SimTiming::new(s.block_ns);
            if s.spread {
                timing = timing.with_spread(0.3);
            }
            let desc = KernelDesc::new(format!("k{next_step}"), KernelShape::new(s.blocks, s.threads, 32))
                .with_sim_timing(timing)
                .with_idempotent(s.idempotent);
            let op = StreamOp::Kernel { desc: Arc::new(desc), time_key: next_step as u64 };
            engine.submit(now, slots[s.process], op).expect("submit");
            next_step += 1;
        }
        while let Some(cmd) = engine.poll_command().expect("the engine decides") {
            gpu.submit(now, cmd).expect("the device accepts engine commands");
        }
        while let Some(c) = engine.poll_completion() {
            out.ended.push((now, c.op, c.outcome));
        }
        if next_step == steps.len() && out.ended.len() == steps.len() {
            let m = gpu.mem_stats();
            out.stats = gpu.stats();
            out.mem = [m.busy_ns, m.saturated_ns, m.issued_ns, m.alone_ns].map(f64::to_bits);
            gpu.check_invariants().expect("invariants");
            return (out, gpu.fast_forwarded());
        }
        poll = mix64(poll);
        let wall = now + 1 + poll % 300_000;
        let deadline =
            [engine.poll_timeout(), steps.get(next_step).map(|s| s.at), Some(wall)].into_iter().flatten().min();
        events.clear();
        now = gpu.advance(deadline, &mut events).expect("the device runs");
        for ev in events.drain(..) {
            out.events.push((now, ev.clone()));
            engine.handle_event(now, ev).expect("the engine accepts device events");
        }
        if deadline.is_some_and(|d| d <= now) {
            engine.handle_timeout(now);
        }
    }
    panic!("the run did not finish");
}

fn same_with_and_without(seed: u64, policy: impl Fn() -> Box<dyn Policy>) -> u64 {
    let (priorities, steps) = plan(seed);
    let (slow, none) = run(&priorities, &steps, policy(), seed, false);
    assert_eq!(none, 0, "off means off");
    let (fast, skipped) = run(&priorities, &steps, policy(), seed, true);
    // Compared piecewise first, for a readable failure.
    assert_eq!(fast.ended, slow.ended, "seed {seed}: completions");
    assert_eq!(fast.events.len(), slow.events.len(), "seed {seed}: events");
    for (i, (f, s)) in fast.events.iter().zip(&slow.events).enumerate() {
        assert_eq!(f, s, "seed {seed}: event {i}");
    }
    assert_eq!(fast.stats, slow.stats, "seed {seed}: device counters");
    assert_eq!(fast.mem, slow.mem, "seed {seed}: memory counters");
    skipped
}

/// A lone grid of a thousand waves: skipped but for its last wave, and the
/// same to the nanosecond.
#[test]
fn a_lone_grid_is_skipped_with_the_same_results() {
    let info = presets::k20c();
    let blocks = 1_000 * 13 * 2;
    let steps = [Step { process: 0, at: 0, blocks, threads: 1024, block_ns: 1_000, spread: false, idempotent: false }];
    for policy in ["ppq-even-drain", "fcfs"] {
        let (slow, _) = run(&[0], &steps, policies::by_name(policy).expect("policy"), 1, false);
        let (fast, skipped) = run(&[0], &steps, policies::by_name(policy).expect("policy"), 1, true);
        assert_eq!(fast, slow, "{policy}");
        assert!(skipped > 900, "{policy}: {skipped} of 1000 waves skipped on {}", info.name);
        assert_eq!(fast.stats.blocks_completed, blocks);
    }
}

/// The random plans below do meet the fast forward (else they would compare
/// nothing): over a few fixed seeds, waves were skipped under each policy,
/// beside preemptions, later arrivals and kernels of varied blocks.
#[test]
fn the_plans_are_skipped_through_under_each_policy() {
    for policy in ["ppq-even-drain", "ppq-excl-cs", "rr-100us"] {
        let skipped: u64 =
            (0..12u64).map(|seed| same_with_and_without(seed, || policies::by_name(policy).expect("policy"))).sum();
        assert!(skipped > 0, "{policy}: no wave skipped in 12 plans");
    }
    let chaos: u64 = (0..12u64).map(|seed| same_with_and_without(seed, || Box::new(Chaos { state: seed }))).sum();
    assert!(chaos > 0, "random preemptions: no wave skipped in 12 plans");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_same_under_the_daemons_policy(seed in any::<u64>()) {
        same_with_and_without(seed, || policies::by_name("ppq-even-drain").expect("policy"));
    }

    #[test]
    fn the_same_under_context_switches(seed in any::<u64>()) {
        same_with_and_without(seed, || policies::by_name("ppq-excl-cs").expect("policy"));
    }

    #[test]
    fn the_same_under_random_preemptions(seed in any::<u64>()) {
        same_with_and_without(seed, || Box::new(Chaos { state: seed }));
    }
}

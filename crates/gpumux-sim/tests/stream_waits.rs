//! Cross-stream waits (`StreamOp::WaitFor`, what `cudaStreamWaitEvent`
//! becomes) on the simulated GPU, as a randomised property test: under every
//! built-in policy and a policy of random preemptions (every mechanism,
//! random slices), no operation queued behind a wait is started before the
//! operation it waits for has ended, and every operation still completes.
//!
//! The engine is driven through its live interface, as gpumuxd drives it:
//! processes (one per stream), operations submitted at t = 0 and later, some
//! waiting for the marker of another stream, recorded after its kernels.

use gpumux_engine::device::{Command, CopyDirection, Device, Event};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::policy::Policy;
use gpumux_engine::time::Nanos;
use gpumux_engine::{Engine, OpId, OpOutcome, ProcessId, ProcessInfo, Slot, StreamOp};
use gpumux_sim::timing::mix64;
use gpumux_sim::{presets, SimGpu};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

mod common;
use common::Chaos;

/// One operation of a randomised plan.
#[derive(Clone, Debug)]
enum Step {
    Kernel {
        blocks: u64,
        block_ns: u64,
        idempotent: bool,
    },
    Copy {
        bytes: u64,
    },
    /// A recorded event: a marker, which later steps may wait for.
    Record,
    /// Waits for the `n`th `Record` of the plan (one submitted before).
    Wait {
        record: usize,
    },
}

/// A plan: which stream each step goes to, when it is submitted, what it is.
struct Plan {
    priorities: Vec<i32>,
    steps: Vec<(usize, Nanos, Step)>,
}

fn plan(seed: u64) -> Plan {
    let mut s = seed;
    let mut next = move || {
        s = mix64(s);
        s
    };
    let streams = 2 + (next() % 4) as usize;
    let priorities = (0..streams).map(|_| (next() % 3) as i32).collect();
    let mut steps = Vec::new();
    let mut records = 0;
    let mut at = 0;
    let n = 8 + next() % 24;
    for i in 0..n {
        let stream = (next() % streams as u64) as usize;
        // The last third of the plan is submitted while the first part runs
        // (times rise, so a `Wait` still follows the record it names): some
        // waits then find their event done already.
        if i >= n * 2 / 3 {
            at += next() % 40_000;
        }
        let step = match next() % 6 {
            0 | 1 => Step::Kernel {
                blocks: 1 + next() % 400,
                block_ns: 1_000 + next() % 30_000,
                idempotent: next() % 2 == 0,
            },
            2 => Step::Copy { bytes: 1 << (10 + next() % 12) },
            4 | 5 if records > 0 => Step::Wait { record: (next() % records) as usize },
            _ => Step::Record,
        };
        if matches!(step, Step::Record) {
            records += 1;
        }
        steps.push((stream, at, step));
    }
    Plan { priorities, steps }
}

/// What a run showed: per operation, when its first command went to the
/// device and when the engine reported its end, and how.
#[derive(Default)]
struct Seen {
    first_command: HashMap<OpId, Nanos>,
    ended: HashMap<OpId, (Nanos, OpOutcome)>,
    /// Per stream, its operations in order; per wait, the marker it waits for.
    streams: Vec<Vec<OpId>>,
    waits: HashMap<OpId, OpId>,
    /// Waits whose marker had not ended when they were submitted (the ones that test something).
    real_waits: usize,
}

fn kernel(i: usize, blocks: u64, block_ns: u64, idempotent: bool) -> StreamOp {
    let desc = KernelDesc::new(format!("k{i}"), KernelShape::new(blocks, 128 << (i % 3), 32))
        .with_sim_timing(SimTiming::new(block_ns).with_spread(0.3))
        .with_idempotent(idempotent);
    StreamOp::Kernel { desc: Arc::new(desc), time_key: i as u64 }
}

/// Runs `plan` under `policy` on a simulated K20c (13 SMs: preemption is frequent).
fn run(plan: &Plan, policy: Box<dyn Policy>, seed: u64) -> Seen {
    let info = presets::k20c();
    let mut engine = Engine::new(info.clone(), policy).expect("engine");
    let mut gpu = SimGpu::new(info, seed);
    let slots: Vec<Slot> = plan
        .priorities
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let info = ProcessInfo::new(ProcessId(i as u32), format!("s{i}")).with_priority(p);
            engine.add_process(info).expect("a process")
        })
        .collect();
    let mut seen = Seen { streams: vec![Vec::new(); slots.len()], ..Seen::default() };
    // The marker op of each `Record`, and its stream.
    let mut records: Vec<(Slot, OpId)> = Vec::new();
    let mut next_step = 0;
    let mut now: Nanos = 0;
    let mut events: Vec<Event> = Vec::new();
    for _round in 0..2_000_000 {
        while let Some((stream, _, step)) = plan.steps.get(next_step).filter(|s| s.1 <= now) {
            let op = match step {
                Step::Kernel { blocks, block_ns, idempotent } => kernel(next_step, *blocks, *block_ns, *idempotent),
                Step::Copy { bytes } => StreamOp::Copy { direction: CopyDirection::HostToDevice, bytes: *bytes },
                Step::Record => StreamOp::Sync,
                Step::Wait { record } => {
                    let (slot, op) = records[*record];
                    StreamOp::WaitFor { slot, op }
                }
            };
            let id = engine.submit(now, slots[*stream], op).expect("submit");
            match step {
                Step::Record => records.push((slots[*stream], id)),
                Step::Wait { record } => {
                    let awaited = records[*record].1;
                    seen.waits.insert(id, awaited);
                    if !seen.ended.contains_key(&awaited) {
                        seen.real_waits += 1;
                    }
                }
                _ => {}
            }
            seen.streams[*stream].push(id);
            next_step += 1;
        }
        while let Some(cmd) = engine.poll_command().expect("the engine decides") {
            if let Command::Launch { op, .. } | Command::Copy { op, .. } = &cmd {
                seen.first_command.entry(*op).or_insert(now);
            }
            gpu.submit(now, cmd).expect("the device accepts engine commands");
        }
        while let Some(c) = engine.poll_completion() {
            seen.ended.insert(c.op, (now, c.outcome));
            // Completing a marker may have readied commands: take them next round.
        }
        if next_step == plan.steps.len() && seen.ended.len() == plan.steps.len() {
            return seen;
        }
        let next_submission = plan.steps.get(next_step).map(|s| s.1);
        let deadline = match (engine.poll_timeout(), next_submission) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        events.clear();
        now = gpu.advance(deadline, &mut events).unwrap_or_else(|e| {
            panic!("the device stalled with {} of {} operations ended: {e}", seen.ended.len(), plan.steps.len())
        });
        for ev in events.drain(..) {
            engine.handle_event(now, ev).expect("the engine accepts device events");
        }
        if deadline.is_some_and(|d| d <= now) {
            engine.handle_timeout(now);
        }
    }
    panic!("the run did not finish");
}

/// The property: behind a wait, nothing starts (or ends) before the
/// awaited marker ended; everything completes.
fn check(seen: &Seen, policy: &str) {
    for (op, (_, outcome)) in &seen.ended {
        assert_eq!(*outcome, OpOutcome::Completed, "{policy}: {op} was dropped");
    }
    for stream in &seen.streams {
        for (i, w) in stream.iter().enumerate() {
            let Some(awaited) = seen.waits.get(w) else { continue };
            let (marker_end, _) = seen.ended[awaited];
            for later in &stream[i..] {
                let (end, _) = seen.ended[later];
                assert!(end >= marker_end, "{policy}: {later} ended at {end} ns, before {awaited} at {marker_end}");
                if let Some(&start) = seen.first_command.get(later) {
                    assert!(
                        start >= marker_end,
                        "{policy}: {later} (behind a wait for {awaited}) started at {start} ns, before {awaited} ended at {marker_end}"
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn nothing_behind_a_cross_stream_wait_starts_before_its_event_under_any_policy(seed in any::<u64>()) {
        let p = plan(seed);
        for (name, _) in gpumux_engine::policies::CATALOGUE {
            let policy = gpumux_engine::policies::by_name(name).expect("catalogue");
            check(&run(&p, policy, seed), name);
        }
        check(&run(&p, Box::new(Chaos { state: seed }), seed), "chaos");
    }
}

/// The property test above is only as strong as its waits: a fixed case
/// where the wait must hold a high-priority stream back from a long
/// low-priority kernel that preemptive policies would otherwise take SMs
/// from, under each policy.
#[test]
fn a_high_priority_stream_waits_for_a_low_priority_kernel_under_every_policy() {
    let p = Plan {
        priorities: vec![0, 5],
        steps: vec![
            (0, 0, Step::Kernel { blocks: 2_000, block_ns: 20_000, idempotent: false }),
            (0, 0, Step::Record),
            (1, 0, Step::Wait { record: 0 }),
            (1, 0, Step::Kernel { blocks: 50, block_ns: 5_000, idempotent: true }),
            (1, 0, Step::Record),
        ],
    };
    for (name, _) in gpumux_engine::policies::CATALOGUE {
        let policy = gpumux_engine::policies::by_name(name).expect("catalogue");
        let seen = run(&p, policy, 7);
        check(&seen, name);
        assert_eq!(seen.real_waits, 1, "{name}");
        let low = seen.streams[0][0];
        let urgent = seen.streams[1][1];
        assert!(seen.first_command[&urgent] >= seen.ended[&low].0, "{name}: the urgent kernel jumped the wait");
    }
}

/// The random plans do test something: most hold waits whose event has not
/// ended when they are submitted.
#[test]
fn the_random_plans_hold_waits_for_events_still_running() {
    let (mut plans_with_real_waits, mut real) = (0, 0);
    for seed in 0..32u64 {
        let seen = run(&plan(seed), gpumux_engine::policies::by_name("ppq-excl-cs").expect("catalogue"), seed);
        real += seen.real_waits;
        plans_with_real_waits += usize::from(seen.real_waits > 0);
    }
    assert!(plans_with_real_waits >= 16, "only {plans_with_real_waits} of 32 plans wait for a running event");
    assert!(real >= 32, "only {real} real waits in 32 plans");
}

/// A workload's pipeline (`Op::Record` / `Op::WaitEvent`, what the files'
/// `record` and `wait_event` ops become): copy-in, compute, copy-out as
/// three processes. Under every policy the k-th kernel starts only after the
/// k-th copy in is done, and the k-th copy out only after the k-th kernel
/// ended; each stage alone (an isolated run) finishes too.
#[test]
fn a_workload_pipeline_pairs_its_stages_chunk_by_chunk_under_every_policy() {
    use gpumux_engine::model::{Op, ProcessSpec, Workload};
    use gpumux_engine::{KernelId, Replay};
    const CHUNKS: usize = 6;
    let stage = |name: &str, ops: Vec<Op>| ProcessSpec {
        name: name.into(),
        priority: 0,
        weight: 1.0,
        arrival_ns: 0,
        repetitions: 1,
        async_depth: 64,
        ops: (0..CHUNKS).flat_map(|_| ops.clone()).collect(),
    };
    let record = |e: &str| Op::Record { event: e.into() };
    let wait = |e: &str| Op::WaitEvent { event: e.into() };
    let filter = KernelDesc::new("filter", KernelShape::new(60, 256, 32)).with_sim_timing(SimTiming::new(40_000));
    let w = Workload {
        name: "pipeline".into(),
        processes: vec![
            stage("in", vec![Op::CopyToDevice { bytes: 4 << 20 }, record("in")]),
            stage("compute", vec![wait("in"), Op::Kernel(Arc::new(filter)), record("done")]),
            stage("out", vec![wait("done"), Op::CopyToHost { bytes: 4 << 20 }]),
        ],
        replay_min_runs: None,
    };
    for (name, _) in gpumux_engine::policies::CATALOGUE {
        let info = presets::k20c();
        let policy = gpumux_engine::policies::by_name(name).expect("catalogue");
        let mut replay = Replay::new(&w, info.clone(), policy, None).expect("replay");
        let mut gpu = SimGpu::new(info, 3);
        let (mut copy_owner, mut launch_kernel) = (HashMap::new(), HashMap::new());
        // Per process: copy starts and ends; per kernel: first launch and last end.
        let mut copies_in: Vec<(Nanos, Nanos)> = Vec::new();
        let mut copies_out: Vec<(Nanos, Nanos)> = Vec::new();
        let mut kernels: Vec<(KernelId, Nanos, Nanos)> = Vec::new();
        let (mut now, mut events) = (0, Vec::new());
        replay.handle_timeout(0);
        while !replay.is_finished() {
            while let Some(cmd) = replay.poll_command().expect("engine") {
                match &cmd {
                    Command::Copy { copy, process, .. } => {
                        copy_owner.insert(*copy, process.0);
                        let list = if process.0 == 0 { &mut copies_in } else { &mut copies_out };
                        list.push((now, Nanos::MAX));
                    }
                    Command::Launch { launch, kernel, .. } => {
                        launch_kernel.insert(*launch, *kernel);
                        if !kernels.iter().any(|k| k.0 == *kernel) {
                            kernels.push((*kernel, now, 0));
                        }
                    }
                    _ => {}
                }
                gpu.submit(now, cmd).expect("device");
            }
            if replay.is_finished() {
                break;
            }
            events.clear();
            let deadline = replay.poll_timeout();
            now = gpu.advance(deadline, &mut events).unwrap_or_else(|e| panic!("{name}: {e}"));
            for ev in events.drain(..) {
                match &ev {
                    Event::CopyDone { copy } => {
                        let list = if copy_owner[copy] == 0 { &mut copies_in } else { &mut copies_out };
                        if let Some(c) = list.iter_mut().find(|c| c.1 == Nanos::MAX) {
                            c.1 = now;
                        }
                    }
                    Event::LaunchEnded { launch, .. } => {
                        let k = launch_kernel[launch];
                        if let Some(e) = kernels.iter_mut().find(|e| e.0 == k) {
                            e.2 = e.2.max(now);
                        }
                    }
                    _ => {}
                }
                replay.handle_event(now, ev).expect("engine");
            }
            if events.is_empty() || deadline.is_some_and(|d| d <= now) {
                replay.handle_timeout(now);
            }
        }
        assert_eq!((copies_in.len(), kernels.len(), copies_out.len()), (CHUNKS, CHUNKS, CHUNKS), "{name}");
        for k in 0..CHUNKS {
            assert!(kernels[k].1 >= copies_in[k].1, "{name}: kernel {k} started before its chunk arrived");
            assert!(copies_out[k].0 >= kernels[k].2, "{name}: copy out {k} started before its kernel ended");
        }
        // The stages overlap: copy in k + 1 does not wait for kernel k.
        assert!(copies_in[1].0 < kernels[0].2, "{name}: the pipeline did not overlap");
        for only in 0..3 {
            let policy = gpumux_engine::policies::by_name(name).expect("catalogue");
            let info = presets::k20c();
            let mut alone = Replay::new(&w, info.clone(), policy, Some(ProcessId(only))).expect("replay");
            gpumux_engine::driver::run(&mut alone, &mut SimGpu::new(info, 3), &mut gpumux_engine::driver::NoHooks)
                .unwrap_or_else(|e| panic!("{name}: stage {only} alone: {e}"));
        }
    }
}

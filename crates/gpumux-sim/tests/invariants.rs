//! Property tests of the engine and the simulator together: under any
//! sequence of preemptions (every mechanism), resizes and resumes chosen by a
//! random policy, no block is lost or run twice, resumed kernels continue
//! where they stopped, SM capacity is never exceeded, and every job finishes.

use gpumux_engine::device::{Device, Event};
use gpumux_engine::ids::KernelId;
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumux_engine::policy::Policy;
use gpumux_engine::{ArrivalOrder, Replay};
use gpumux_sim::{presets, SimGpu};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

mod common;
use common::Chaos;

fn kernel(name: &str, blocks: u64, threads: u32, regs: u32, smem: u32, t_ns: u64, idempotent: bool) -> Arc<KernelDesc> {
    Arc::new(
        KernelDesc::new(name, KernelShape::new(blocks, threads, regs).with_smem_per_block(smem))
            .with_sim_timing(SimTiming::new(t_ns).with_spread(0.5).with_mem_intensity(0.6))
            .with_idempotent(idempotent),
    )
}

fn workload(seed: u64, procs: usize) -> Workload {
    let mut processes = Vec::new();
    for p in 0..procs {
        let s = gpumux_sim::timing::mix64(seed ^ (p as u64 * 7919));
        let ops = vec![
            Op::CopyToDevice { bytes: 1 << 20 },
            Op::Kernel(kernel(
                &format!("k{p}a"),
                1 + s % 300,
                64 << (s % 4),
                16 + (s >> 8) as u32 % 48,
                ((s >> 16) % 3) as u32 * 8192,
                1_000 + (s >> 20) % 20_000,
                !s.is_multiple_of(5),
            )),
            Op::Cpu { ns: 2_000 },
            Op::Kernel(kernel(&format!("k{p}b"), 1 + (s >> 30) % 200, 128, 32, 0, 3_000, true)),
            Op::Kernel(kernel(&format!("k{p}c"), 1 + (s >> 34) % 100, 256, 32, 0, 2_000, true)),
            Op::CopyToHost { bytes: 1 << 16 },
            Op::Sync,
            Op::Cpu { ns: 1_000 },
        ];
        processes.push(ProcessSpec {
            name: format!("p{p}"),
            priority: (s % 3) as i32,
            weight: 1.0,
            arrival_ns: (s >> 40) % 50_000,
            repetitions: 1 + (s % 2) as u32,
            async_depth: (s % 3) as u32,
            ops,
        });
    }
    Workload { name: "chaos".into(), processes, replay_min_runs: None }
}

/// Runs the engine and simulator step by step, checking SM capacity after
/// every step, and returns the audit.
/// `overhead_ns`: the simulator's fixed cost per SM preemption (0: none).
/// Odd seeds order kernels by submission (`ArrivalOrder::Submission`).
fn run_checked(w: &Workload, policy: Box<dyn Policy>, seed: u64, overhead_ns: u64) -> gpumux_sim::gpu::Audit {
    let info = presets::k20c();
    let order = if seed % 2 == 1 { ArrivalOrder::Submission } else { ArrivalOrder::HeadOfStream };
    let mut engine = Replay::new(w, info.clone(), policy, None).expect("engine").with_arrival_order(order);
    let mut gpu = SimGpu::new(info, seed).with_preempt_overhead(overhead_ns);
    gpu.enable_audit();
    let mut events: Vec<Event> = Vec::new();
    let mut now = 0;
    engine.handle_timeout(0);
    for _step in 0..2_000_000 {
        while let Some(cmd) = engine.poll_command().expect("engine") {
            gpu.submit(now, cmd).expect("device accepts engine commands");
        }
        gpu.check_invariants().expect("invariants");
        if engine.is_finished() {
            return gpu.audit().expect("audit on").clone();
        }
        let deadline = engine.poll_timeout();
        events.clear();
        now = gpu.advance(deadline, &mut events).expect("device advances");
        if events.is_empty() {
            engine.handle_timeout(now);
        }
        for ev in events.drain(..) {
            engine.handle_event(now, ev).expect("engine accepts device events");
        }
        if deadline.is_some_and(|d| d <= now) {
            engine.handle_timeout(now);
        }
    }
    panic!("run did not finish");
}

fn expected_blocks(w: &Workload) -> u64 {
    w.processes
        .iter()
        .map(|p| {
            p.repetitions as u64
                * p.ops.iter().map(|o| if let Op::Kernel(k) = o { k.shape.blocks } else { 0 }).sum::<u64>()
        })
        .sum()
}

fn check_audit(w: &Workload, audit: &gpumux_sim::gpu::Audit) {
    // Every block of every kernel completes exactly once.
    let mut done: HashMap<(KernelId, u64), u32> = HashMap::new();
    for &(k, b) in &audit.completed {
        *done.entry((k, b)).or_default() += 1;
    }
    assert!(done.values().all(|&n| n == 1), "a block completed twice");
    assert_eq!(done.len() as u64, expected_blocks(w), "blocks lost");
    // First issues of each kernel's blocks come in increasing index order:
    // a resumed launch starts exactly where the previous one stopped.
    let mut last: HashMap<KernelId, u64> = HashMap::new();
    let mut seen: std::collections::HashSet<(KernelId, u64)> = Default::default();
    for &(k, b, restored) in &audit.issued {
        if restored || !seen.insert((k, b)) {
            continue;
        }
        if let Some(&prev) = last.get(&k) {
            assert!(b > prev, "kernel {k} issued block {b} for the first time after {prev}");
        }
        last.insert(k, b);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn chaos_policy_loses_no_block(seed in any::<u64>(), procs in 1usize..5, overhead_ns in prop_oneof![Just(0u64), 1u64..20_000]) {
        let w = workload(seed, procs);
        let audit = run_checked(&w, Box::new(Chaos { state: seed }), seed, overhead_ns);
        check_audit(&w, &audit);
    }

    #[test]
    fn every_builtin_policy_finishes_every_job(seed in any::<u64>(), procs in 1usize..5) {
        let w = workload(seed, procs);
        for (name, _) in gpumux_engine::policies::CATALOGUE {
            let policy = gpumux_engine::policies::by_name(name).expect("catalogue");
            let audit = run_checked(&w, policy, seed, if seed % 2 == 0 { 0 } else { seed % 10_000 });
            check_audit(&w, &audit);
        }
    }
}

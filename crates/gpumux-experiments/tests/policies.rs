//! The spatial and cooperative policies on hand-worked cases, on a 4-SM
//! simulated GPU with one block per SM and 1 ms blocks (no spread), so every
//! end time can be worked out by hand.

use gpumux_engine::device::Mechanism;
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumux_engine::policies::{self, spatial::Heuristic, spatial::Spatial};
use gpumux_engine::policy::Policy;
use gpumux_engine::time::NS_PER_MS;
use gpumux_experiments::sim::{simulate, SimSetup};
use std::sync::Arc;

fn kernel(blocks: u64) -> Op {
    let shape = KernelShape::new(blocks, 64, 8).with_max_blocks_per_sm(1);
    Op::Kernel(Arc::new(KernelDesc::new(format!("k{blocks}"), shape).with_sim_timing(SimTiming::new(NS_PER_MS))))
}

fn workload(procs: &[&[u64]]) -> Workload {
    Workload {
        name: "t".into(),
        processes: procs
            .iter()
            .enumerate()
            .map(|(i, ks)| ProcessSpec {
                name: format!("p{i}"),
                priority: 0,
                weight: 1.0,
                arrival_ns: 0,
                repetitions: 1,
                async_depth: 0,
                ops: ks.iter().map(|&b| kernel(b)).collect(),
            })
            .collect(),
        replay_min_runs: None,
    }
}

/// End time of each process's (single) run, in ms.
fn ends(w: &Workload, p: Box<dyn Policy>) -> Vec<f64> {
    let mut info = gpumux_sim::presets::k20c();
    info.num_sms = 4;
    let out = simulate(w, &info, p, None, &SimSetup::seeded(1), None).expect("run");
    out.record.processes.iter().map(|p| p.runs[0].end_ns as f64 / NS_PER_MS as f64).collect()
}

#[test]
fn static_even_splits_two_processes_two_and_two() {
    // 8 blocks each on 2 SMs: 4 rounds of 1 ms, both end at 4 ms.
    let w = workload(&[&[8], &[8]]);
    assert_eq!(ends(&w, policies::by_name("spatial-even").expect("policy")), vec![4.0, 4.0]);
}

#[test]
fn smart_even_gives_a_one_block_kernel_one_sm() {
    // p0 has 1 block: Smart Even gives it 1 SM, p1 3 SMs: 6 blocks in 2 ms.
    let w = workload(&[&[1], &[6]]);
    assert_eq!(ends(&w, policies::by_name("spatial-smart-even").expect("policy")), vec![1.0, 2.0]);
    // Even wastes one SM on p0: p1 has 2 SMs, 3 ms.
    assert_eq!(ends(&w, policies::by_name("spatial-even").expect("policy")), vec![1.0, 3.0]);
}

#[test]
fn coop_leaves_sms_a_small_kernel_cannot_use_idle() {
    // Coop: p0's 1-block kernel owns the GPU for 1 ms, then p1's 6 blocks take 2 ms.
    let w = workload(&[&[1], &[6]]);
    assert_eq!(ends(&w, policies::by_name("coop").expect("policy")), vec![1.0, 3.0]);
    // FCFS runs p1 beside it on the 3 other SMs.
    assert_eq!(ends(&w, policies::by_name("fcfs").expect("policy")), vec![1.0, 2.0]);
}

#[test]
fn coop_takes_turns_at_kernel_boundaries() {
    // p0: two 4-block kernels; p1: one. Round-robin: p0 k1 (0-1), p1 (1-2), p0 k2 (2-3).
    let w = workload(&[&[4, 4], &[4]]);
    assert_eq!(ends(&w, policies::by_name("coop").expect("policy")), vec![3.0, 2.0]);
}

#[test]
fn dynamic_gives_a_finished_process_share_to_the_others() {
    // p0: 1 block. Static even: p1 keeps 2 SMs, 8 blocks take 4 ms. Dynamic:
    // p0's 2 SMs move to p1 when p0 finishes at 1 ms: 2 + 4 + 2 blocks, 3 ms.
    let w = workload(&[&[1], &[8]]);
    assert_eq!(ends(&w, policies::by_name("spatial-even").expect("policy"))[1], 4.0);
    let dynamic = Spatial::new(Heuristic::Even, true, Mechanism::ContextSwitch);
    assert_eq!(ends(&w, Box::new(dynamic))[1], 3.0);
}

#[test]
fn fixed_split_and_reservation() {
    let w = workload(&[&[3], &[3]]);
    // 3/1: p0 one round, p1 three.
    assert_eq!(
        ends(&w, Box::new(Spatial::new(Heuristic::Fixed(vec![3, 1]), false, Mechanism::ContextSwitch))),
        vec![1.0, 3.0]
    );
    let qos = Spatial::new(Heuristic::Even, false, Mechanism::ContextSwitch)
        .with_reservation(gpumux_engine::policies::spatial::Reservation { process_name: "p1".into(), sms: 3 });
    assert_eq!(ends(&w, Box::new(qos)), vec![3.0, 1.0]);
}

//! Issue 39's urgent client beside long-block neighbours, at the engine's
//! level on the simulated H100 under the daemon's default policy
//! (`ppq-even-drain`): an urgent process (priority 5) runs rounds of
//! one-wave kernels with a pause between rounds (its sync's round trip),
//! beside two processes of priority 0 whose kernels are one wave of blocks
//! that each run 10 ms (a grid-stride loop whose blocks each cover the
//! whole grid's work, as `examples/clients/oversubscribe.rs`'s do on a GPU).
//!
//! Without reserves (`policies::reserve`), the neighbours take the urgent
//! process's SMs in every gap it leaves (between rounds, and between two of
//! its kernels, since the simulator gives an SM back once a kernel's last
//! block there has been issued), and its next kernel waits for their blocks
//! to drain: it loses most of its rate. With them it keeps its SMs from the
//! levels below while taking them back would be slow, and loses at most one
//! drain when it starts: the goal is at most 10 % of its rate.

mod stepping;

use gpumux_engine::device::{Device, Event, Mechanism};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::policies::ppq_even::PpqEven;
use gpumux_engine::policy::Policy;
use gpumux_engine::time::{Nanos, NS_PER_MS, NS_PER_US};
use gpumux_engine::{Engine, OpOutcome, ProcessId, ProcessInfo, Slot, StreamOp};
use gpumux_sim::{presets, SimGpu, SimTuning};
use std::sync::Arc;

/// One wave of 256-thread blocks on the H100 (8 per SM, 132 SMs).
const ONE_WAVE: u64 = 132 * 8;
/// The urgent process: ROUNDS rounds of KERNELS kernels of 1 ms blocks.
const ROUNDS: u32 = 60;
const KERNELS: u32 = 5;
/// Its pause between rounds (a sync's answer and the next launch).
const PAUSE: Nanos = 100 * NS_PER_US;
/// The neighbours' blocks.
const LONG_BLOCK: Nanos = 10 * NS_PER_MS;
/// When the urgent process starts: the neighbours hold every SM by then.
const URGENT_AT: Nanos = 15 * NS_PER_MS;

fn kernel(name: &str, blocks: u64, block_ns: Nanos) -> StreamOp {
    let desc = KernelDesc::new(name, KernelShape::new(blocks, 256, 32)).with_sim_timing(SimTiming::new(block_ns));
    StreamOp::Kernel { desc: Arc::new(desc), time_key: 0 }
}

struct Outcome {
    /// The urgent process's time from its first kernel to its last one's end.
    urgent_ns: Nanos,
    /// Kernels each neighbour completed while the urgent process ran, and in all.
    neighbours_during: [u32; 2],
    neighbours_done: [u32; 2],
}

/// Runs the urgent process, whose kernels have `urgent_blocks` blocks
/// (beside two neighbours of `NEIGHBOUR_KERNELS` kernels each if
/// `neighbours`), under `policy`, until everyone is done.
fn run(policy: Box<dyn Policy>, urgent_blocks: u64, neighbours: bool) -> Outcome {
    run_on(policy, urgent_blocks, neighbours, false)
}

/// [`run`], with SMs given back at a launch's end if `release_at_end` (as
/// the CUDA device does; the simulator's default gives one back once a
/// kernel's last block there is issued).
fn run_on(policy: Box<dyn Policy>, urgent_blocks: u64, neighbours: bool, release_at_end: bool) -> Outcome {
    const NEIGHBOUR_KERNELS: u32 = 40;
    let info = presets::h100();
    let mut engine = Engine::new(info.clone(), policy).expect("engine");
    let mut gpu = SimGpu::new(info, 7).with_tuning(&SimTuning { release_at_end, ..SimTuning::default() });
    let add = |engine: &mut Engine, id: u32, priority: i32| -> Slot {
        let p = ProcessInfo::new(ProcessId(id), format!("p{id}")).with_priority(priority);
        engine.add_process(p).expect("a process")
    };
    let urgent = add(&mut engine, 0, 5);
    let low = if neighbours { vec![add(&mut engine, 1, 0), add(&mut engine, 2, 0)] } else { vec![] };
    let mut now: Nanos = 0;
    for &s in &low {
        engine.submit(0, s, kernel("long", ONE_WAVE, LONG_BLOCK)).expect("submit");
    }
    let mut low_submitted = [1u32; 2];
    let mut low_done = [0u32; 2];
    let mut low_during = [0u32; 2];
    let (mut round, mut left_in_round) = (0u32, 0u32);
    let mut next_round_at = Some(URGENT_AT);
    let mut urgent_end: Option<Nanos> = None;
    let mut events: Vec<Event> = Vec::new();
    loop {
        if next_round_at.is_some_and(|t| t <= now) {
            for _ in 0..KERNELS {
                engine.submit(now, urgent, kernel("urgent", urgent_blocks, NS_PER_MS)).expect("submit");
            }
            left_in_round = KERNELS;
            next_round_at = None;
        }
        while let Some(cmd) = engine.poll_command().expect("the engine decides") {
            gpu.submit(now, cmd).expect("the device accepts engine commands");
        }
        while let Some(c) = engine.poll_completion() {
            assert_eq!(c.outcome, OpOutcome::Completed);
            if c.slot == urgent {
                left_in_round -= 1;
                if left_in_round == 0 {
                    round += 1;
                    if round == ROUNDS {
                        urgent_end = Some(now);
                    } else {
                        next_round_at = Some(now + PAUSE);
                    }
                }
            } else if let Some(i) = low.iter().position(|&s| s == c.slot) {
                low_done[i] += 1;
                if urgent_end.is_none() {
                    low_during[i] += 1;
                }
                if low_submitted[i] < NEIGHBOUR_KERNELS {
                    engine.submit(now, low[i], kernel("long", ONE_WAVE, LONG_BLOCK)).expect("submit");
                    low_submitted[i] += 1;
                }
            }
        }
        let low_finished = low.iter().enumerate().all(|(i, _)| low_done[i] == NEIGHBOUR_KERNELS);
        if urgent_end.is_some() && low_finished {
            break;
        }
        let deadline = [next_round_at, engine.poll_timeout()].into_iter().flatten().min();
        now = stepping::step(&mut engine, &mut gpu, deadline, &mut events);
        assert!(now < 60_000 * NS_PER_MS, "everyone done within a minute of device time: {round} rounds, {low_done:?}");
    }
    let urgent_ns = urgent_end.expect("the urgent process ended") - URGENT_AT;
    Outcome { urgent_ns, neighbours_during: low_during, neighbours_done: low_done }
}

fn loss(alone: Nanos, beside: Nanos) -> f64 {
    (1.0 - alone as f64 / beside as f64) * 100.0
}

#[test]
fn an_urgent_process_beside_long_block_neighbours_keeps_its_rate_and_they_finish() {
    let alone = run(Box::new(PpqEven::new(Mechanism::Drain)), ONE_WAVE, false).urgent_ns;
    let with = run(Box::new(PpqEven::new(Mechanism::Drain)), ONE_WAVE, true);
    let lost = loss(alone, with.urgent_ns);
    eprintln!(
        "urgent alone {} ms, beside two long-block neighbours {} ms: {lost:.1} % lost; neighbours' kernels during its run {:?}",
        alone / NS_PER_MS,
        with.urgent_ns / NS_PER_MS,
        with.neighbours_during
    );
    assert!(lost <= 10.0, "the urgent process lost {lost:.1} % of its rate (goal: at most 10 %)");
    assert_eq!(with.neighbours_done, [40, 40], "both neighbours finished every kernel");
}

#[test]
fn without_reserves_the_urgent_process_loses_its_rate_to_the_neighbours_drains() {
    let alone = run(Box::new(PpqEven::without_reserve(Mechanism::Drain)), ONE_WAVE, false).urgent_ns;
    let with = run(Box::new(PpqEven::without_reserve(Mechanism::Drain)), ONE_WAVE, true);
    let lost = loss(alone, with.urgent_ns);
    eprintln!(
        "without reserves: urgent alone {} ms, beside {} ms: {lost:.1} % lost",
        alone / NS_PER_MS,
        with.urgent_ns / NS_PER_MS
    );
    assert!(lost > 30.0, "without reserves the urgent process waits for the neighbours' blocks: {lost:.1} % lost");
    assert_eq!(with.neighbours_done, [40, 40]);
}

/// The reserve is what the urgent process used, not the GPU: with kernels
/// of a quarter of the SMs (33 of 132) it keeps its rate, and the
/// neighbours go on beside it on the other 99 (with the whole GPU reserved
/// they complete only the kernel running when it comes). With SMs given
/// back at a launch's end, as on the CUDA device: with the simulator's
/// default, an SM whose long blocks were all issued looks idle to the engine
/// while they run, so an urgent kernel given it waits there (18 % lost),
/// which no count of SMs kept can prevent.
#[test]
fn an_urgent_process_using_a_quarter_of_the_sms_leaves_the_neighbours_the_rest() {
    let quarter = 33 * 8;
    let alone = run_on(Box::new(PpqEven::new(Mechanism::Drain)), quarter, false, true).urgent_ns;
    let with = run_on(Box::new(PpqEven::new(Mechanism::Drain)), quarter, true, true);
    let lost = loss(alone, with.urgent_ns);
    eprintln!(
        "a quarter of the SMs: urgent alone {} ms, beside {} ms: {lost:.1} % lost; neighbours' kernels during its run {:?}",
        alone / NS_PER_MS,
        with.urgent_ns / NS_PER_MS,
        with.neighbours_during
    );
    assert!(lost <= 10.0, "the urgent process lost {lost:.1} % of its rate (goal: at most 10 %)");
    // Its run is about 300 ms; each neighbour's kernel is a 10 ms wave on
    // half of the 99 SMs left (two waves, 20 ms): about 15 each if nothing
    // held them off.
    assert!(
        with.neighbours_during.iter().all(|&k| k >= 8),
        "the neighbours went on beside it: {:?} kernels each",
        with.neighbours_during
    );
    assert_eq!(with.neighbours_done, [40, 40]);
}

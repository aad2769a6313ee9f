//! Issue 36's huge-grids abuser on the simulated GPU, at the engine's level:
//! two clients launching one-block kernels one at a time (launch, wait for
//! its end, a short pause, again) beside a peer of their priority whose grid
//! never ends, under the daemon's default policy. Once the split has
//! settled, a small kernel takes no SM from the grid and the grid never
//! grows back: on the CUDA device each retreat is a per-SM leave of the
//! grid's workers and each grow a restart of them, device rounds on the
//! small kernel's path.
//!
//! The simulated GPU releases a launch's SMs as soon as it has issued its
//! last block (`Exhausted`, while the block still runs), unlike the
//! scripted device of the engine's own test of this
//! (`gpumux-engine/tests/ppq_even.rs`): a small kernel whose only block is
//! issued then wants no SM, and the policy must not hand its share to the
//! grid for that.

use gpumux_engine::device::{Command, Device, Event};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::time::Nanos;
use gpumux_engine::{policies, Engine, OpOutcome, ProcessId, ProcessInfo, Slot, StreamOp};
use gpumux_sim::{presets, SimGpu};
use std::sync::Arc;

fn kernel(name: &str, blocks: u64, threads: u32, block_ns: Nanos) -> StreamOp {
    let desc = KernelDesc::new(name, KernelShape::new(blocks, threads, 32)).with_sim_timing(SimTiming::new(block_ns));
    StreamOp::Kernel { desc: Arc::new(desc), time_key: 0 }
}

/// Retreats and grows sent after the small clients' first kernels, and
/// the small kernels completed.
fn run(policy: &str) -> (usize, usize, usize) {
    let info = presets::k20c();
    let sms = info.num_sms as u32;
    let mut engine = Engine::new(info.clone(), policies::by_name(policy).expect("a policy")).expect("engine");
    let mut gpu = SimGpu::new(info, 7);
    let add = |engine: &mut Engine, id: u32| -> Slot {
        engine.add_process(ProcessInfo::new(ProcessId(id), format!("p{id}"))).expect("a process")
    };
    let grid = add(&mut engine, 0);
    let smalls = [add(&mut engine, 1), add(&mut engine, 2)];
    // Far more blocks than the test runs: it never ends here.
    engine.submit(0, grid, kernel("grid", 1 << 30, 1024, 10_000)).expect("submit");
    let pause: Nanos = 3_000;
    let mut now: Nanos = 0;
    let mut next_at: [Option<Nanos>; 2] = [Some(20_000), Some(27_000)];
    let (mut launched, mut done) = ([0usize; 2], [0usize; 2]);
    let mut settled_at: Option<Nanos> = None;
    let (mut retreats, mut grows) = (0, 0);
    let mut events: Vec<Event> = Vec::new();
    let mut grid_sms = 0u32;
    while done.iter().min() < Some(&40) {
        for i in 0..2 {
            if next_at[i].is_some_and(|t| t <= now) {
                engine.submit(now, smalls[i], kernel("small", 1, 32, 5_000)).expect("submit");
                launched[i] += 1;
                next_at[i] = None;
            }
        }
        if settled_at.is_none() && launched.iter().all(|&n| n >= 3) {
            settled_at = Some(now);
        }
        while let Some(cmd) = engine.poll_command().expect("the engine decides") {
            if settled_at.is_some() {
                match &cmd {
                    Command::Retreat { .. } => retreats += 1,
                    Command::Grow { .. } => grows += 1,
                    _ => {}
                }
            }
            if let Command::Launch { process: ProcessId(0), sms, .. } = &cmd {
                grid_sms = sms.len();
            }
            gpu.submit(now, cmd).expect("the device accepts engine commands");
        }
        while let Some(c) = engine.poll_completion() {
            let Some(i) = smalls.iter().position(|&s| s == c.slot) else { continue };
            assert_eq!(c.outcome, OpOutcome::Completed);
            if matches!(c.outcome, OpOutcome::Completed) {
                done[i] += 1;
                next_at[i] = Some(now + pause);
            }
        }
        let deadline = [next_at[0], next_at[1], engine.poll_timeout()].into_iter().flatten().min();
        events.clear();
        now = gpu.advance(deadline, &mut events).expect("the device runs");
        for ev in events.drain(..) {
            engine.handle_event(now, ev).expect("the engine accepts device events");
        }
        if deadline.is_some_and(|d| d <= now) {
            engine.handle_timeout(now);
        }
        assert!(now < 100_000_000, "40 small kernels each within 100 ms: {done:?} done");
    }
    assert_eq!(grid_sms, sms, "alone at first, the grid had every SM");
    (retreats, grows, done.iter().sum())
}

#[test]
fn small_kernels_beside_an_endless_grid_take_no_sm_from_it() {
    let (retreats, grows, done) = run("ppq-even-drain");
    assert!(done >= 80, "{done} small kernels");
    assert_eq!((retreats, grows), (0, 0), "retreats and grows after the first small kernels");
}

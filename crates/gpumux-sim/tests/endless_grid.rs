//! Issue 36's huge-grids abuser on the simulated GPU, at the engine's level:
//! two clients launching one-block kernels one at a time (launch, wait for
//! its end, a short pause, again) beside a peer of their priority whose grid
//! never ends, under the daemon's default policy.
//!
//! On the CUDA device a launch gives its SMs back with its end; the
//! simulator, by default, as soon as it has issued its last block (a GPU's
//! hardware scheduler starts other blocks there). A one-block kernel then
//! wants no SM from the moment its block starts, `ppq-even` hands its share
//! to the grid and takes it back at its next kernel: a retreat and a grow of
//! the grid for each small kernel. With SMs given back at the end
//! (`SimTuning::release_at_end`, what `gpumux calibrate` sets for a CUDA
//! device) none once the split has settled, as on the engine's scripted
//! device (`gpumux-engine/tests/ppq_even.rs`). Keeping the share in the
//! policy instead (tried: a kernel counted for its whole grid, a share it
//! does not fill kept from its peers) cost co-running clients of long blocks
//! a block time of idle SMs at each kernel's tail, and the daemon's replay of
//! itself drifted 5-11 % (`gpumux/tests/replay.rs`).

mod stepping;

use gpumux_engine::device::{Command, Device, Event};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::time::Nanos;
use gpumux_engine::{policies, Engine, OpOutcome, ProcessId, ProcessInfo, Slot, StreamOp};
use gpumux_sim::{presets, SimGpu, SimTuning};
use std::sync::Arc;

fn kernel(name: &str, blocks: u64, threads: u32, block_ns: Nanos) -> StreamOp {
    let desc = KernelDesc::new(name, KernelShape::new(blocks, threads, 32)).with_sim_timing(SimTiming::new(block_ns));
    StreamOp::Kernel { desc: Arc::new(desc), time_key: 0 }
}

/// Retreats and grows sent after the small clients' first kernels, and
/// the small kernels completed.
fn run(policy: &str, release_at_end: bool) -> (usize, usize, usize) {
    let info = presets::k20c();
    let sms = info.num_sms as u32;
    let mut engine = Engine::new(info.clone(), policies::by_name(policy).expect("a policy")).expect("engine");
    let mut gpu = SimGpu::new(info, 7).with_tuning(&SimTuning { release_at_end, ..SimTuning::default() });
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
        now = stepping::step(&mut engine, &mut gpu, deadline, &mut events);
        assert!(now < 100_000_000, "40 small kernels each within 100 ms: {done:?} done");
    }
    assert_eq!(grid_sms, sms, "alone at first, the grid had every SM");
    (retreats, grows, done.iter().sum())
}

#[test]
fn with_sms_given_back_at_the_end_small_kernels_take_no_sm_from_an_endless_grid() {
    let (retreats, grows, done) = run("ppq-even-drain", true);
    assert!(done >= 80, "{done} small kernels");
    assert_eq!((retreats, grows), (0, 0), "retreats and grows after the first small kernels");
}

#[test]
fn with_sms_given_back_at_the_last_issue_each_small_kernel_takes_sms_from_the_grid_and_gives_them_back() {
    let (retreats, grows, done) = run("ppq-even-drain", false);
    assert!(done >= 80, "{done} small kernels");
    // The simulator's default: the churn the module doc describes (38 of each for 74 kernels).
    assert!(retreats >= done / 4 && grows >= done / 4, "{retreats} retreats, {grows} grows for {done} kernels");
}

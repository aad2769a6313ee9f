//! Small runs whose outcome can be worked out by hand.

use gpumux_engine::device::TraceSpan;
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumux_engine::record::RunRecord;
use gpumux_engine::{driver, policies, ArrivalOrder, Replay};
use gpumux_sim::{presets, SimGpu};
use std::sync::Arc;

fn k(name: &str, blocks: u64, bps: u32, t_ns: u64) -> Op {
    // Threads decide occupancy, so blocks of other kernels cannot squeeze in.
    let shape = KernelShape::new(blocks, 2048 / bps, 16);
    Op::Kernel(Arc::new(KernelDesc::new(name, shape).with_sim_timing(SimTiming::new(t_ns))))
}

fn proc_(name: &str, priority: i32, arrival_ns: u64, ops: Vec<Op>) -> ProcessSpec {
    ProcessSpec { name: name.into(), priority, weight: 1.0, arrival_ns, repetitions: 1, async_depth: 0, ops }
}

fn run(policy: &str, procs: Vec<ProcessSpec>) -> (RunRecord, Vec<TraceSpan>) {
    run_with(policy, procs, 0)
}

/// `overhead_ns`: the simulator's fixed cost per SM preemption.
fn run_with(policy: &str, procs: Vec<ProcessSpec>, overhead_ns: u64) -> (RunRecord, Vec<TraceSpan>) {
    run_full(policy, procs, overhead_ns, ArrivalOrder::HeadOfStream)
}

fn run_full(
    policy: &str,
    procs: Vec<ProcessSpec>,
    overhead_ns: u64,
    order: ArrivalOrder,
) -> (RunRecord, Vec<TraceSpan>) {
    let w = Workload { name: "t".into(), processes: procs, replay_min_runs: None };
    let info = presets::k20c();
    let mut e = Replay::new(&w, info.clone(), policies::by_name(policy).expect("policy"), None)
        .expect("engine")
        .with_arrival_order(order);
    let mut gpu = SimGpu::new(info, 7).with_preempt_overhead(overhead_ns);
    gpumux_engine::device::Device::enable_trace(&mut gpu);
    let out = driver::run(&mut e, &mut gpu, &mut driver::NoHooks).expect("run");
    (out.record, out.trace)
}

fn end(r: &RunRecord, p: usize) -> u64 {
    r.processes[p].runs.last().map(|s| s.end_ns).expect("a run")
}

#[test]
fn fcfs_runs_waves_of_blocks() {
    // 26 blocks, one per SM at a time on 13 SMs: two waves of 1 µs.
    let (r, _) = run("fcfs", vec![proc_("a", 0, 0, vec![k("k", 26, 1, 1_000)])]);
    assert_eq!(end(&r, 0), 2_000);
}

#[test]
fn fcfs_starts_next_kernel_in_leftover_sms() {
    // a: 20 blocks of 1 µs on 13 SMs → 13 then 7; b (arrives at 0, after a)
    // gets the 6 SMs a leaves free in its second wave, and the rest after.
    let (r, _) =
        run("fcfs", vec![proc_("a", 0, 0, vec![k("a", 20, 1, 1_000)]), proc_("b", 0, 0, vec![k("b", 13, 1, 1_000)])]);
    assert_eq!(end(&r, 0), 2_000);
    // b: 6 blocks at 1 µs, 7 at 2 µs → done at 3 µs.
    assert_eq!(end(&r, 1), 3_000);
}

#[test]
fn copies_take_latency_plus_bytes_over_bandwidth() {
    // k20c: 10 µs + 6 MB / 6 GB/s = 1 ms + 10 µs; D2H runs on its own engine.
    let (r, _) = run(
        "fcfs",
        vec![proc_("a", 0, 0, vec![Op::CopyToDevice { bytes: 6_000_000 }, Op::CopyToHost { bytes: 6_000_000 }])],
    );
    assert_eq!(end(&r, 0), 2 * 1_010_000);
}

#[test]
fn host_time_overlaps_gpu_only_with_async_depth() {
    let ops = vec![k("k", 13, 1, 10_000), Op::Cpu { ns: 10_000 }];
    let (sync, _) = run("fcfs", vec![proc_("a", 0, 0, ops.clone())]);
    assert_eq!(end(&sync, 0), 20_000);
    let mut p = proc_("a", 0, 0, ops);
    p.async_depth = 1;
    let (asynch, _) = run("fcfs", vec![p]);
    assert_eq!(end(&asynch, 0), 10_000);
}

#[test]
fn sync_makes_an_async_host_wait_for_its_stream() {
    // As above with async_depth 1, but the host synchronises before its CPU
    // phase: kernel then CPU, 20 µs, as for a synchronous process.
    let mut p = proc_("a", 0, 0, vec![k("k", 13, 1, 10_000), Op::Sync, Op::Cpu { ns: 10_000 }]);
    p.async_depth = 1;
    let (r, _) = run("fcfs", vec![p]);
    assert_eq!(end(&r, 0), 20_000);
}

#[test]
fn submission_order_keeps_an_enqueued_kernel_ahead_of_later_ones() {
    // a issues two 10 µs full-GPU kernels at 0 (async); b issues one at 5 µs.
    let procs = || {
        let mut a = proc_("a", 0, 0, vec![k("a1", 13, 1, 10_000), k("a2", 13, 1, 10_000)]);
        a.async_depth = 4;
        vec![a, proc_("b", 0, 5_000, vec![k("b", 13, 1, 10_000)])]
    };
    // Head of stream: a2 arrives when a1 completes (10 µs), after b (5 µs),
    // and b already holds a1's SMs: a1, b, a2.
    let (head, _) = run_full("fcfs", procs(), 0, ArrivalOrder::HeadOfStream);
    assert_eq!((end(&head, 0), end(&head, 1)), (30_000, 20_000));
    // Submission: a2 was issued at 0, so b may not pass it: a1, a2, b.
    let (sub, _) = run_full("fcfs", procs(), 0, ArrivalOrder::Submission);
    assert_eq!((end(&sub, 0), end(&sub, 1)), (20_000, 30_000));
    // DSS ignores the queue order: it splits the SMs between the active kernels.
    let (dss_head, _) = run_full("dss-cs", procs(), 0, ArrivalOrder::HeadOfStream);
    let (dss_sub, _) = run_full("dss-cs", procs(), 0, ArrivalOrder::Submission);
    assert_eq!(end(&dss_head, 1), end(&dss_sub, 1));
}

/// Low: 13×10 blocks of 100 µs; high arrives at 30 µs with 13 blocks of 1 µs.
fn low_then_high() -> Vec<ProcessSpec> {
    vec![proc_("low", 0, 0, vec![k("low", 130, 1, 100_000)]), proc_("high", 1, 30_000, vec![k("high", 13, 1, 1_000)])]
}

#[test]
fn ppq_drain_waits_for_resident_blocks_and_npq_waits_for_the_kernel() {
    let procs = low_then_high;
    let (drain, _) = run("ppq-excl-drain", procs());
    // Drained at 100 µs (the running blocks finish), then 1 µs.
    assert_eq!(end(&drain, 1), 101_000);
    assert_eq!(drain.preemptions.len(), 13);
    assert!(drain.preemptions.iter().all(|p| p.latency_ns == 70_000));
    let (npq, _) = run("npq", procs());
    // Without preemption it waits for all 10 waves of the low kernel.
    assert_eq!(end(&npq, 1), 1_001_000);
    // Flushing drops the running blocks at once: high finishes at 31 µs and
    // the low kernel then runs all 130 blocks again from 31 µs (the 13
    // dropped ones lost their 30 µs of progress): 10 waves more.
    let (flush, _) = run("ppq-excl-flush", procs());
    assert_eq!(end(&flush, 1), 31_000);
    assert_eq!(end(&flush, 0), 31_000 + 1_000_000);
}

#[test]
fn fixed_preemption_overhead_delays_every_mechanism_by_the_same_time() {
    // As above, with a 5 µs fixed cost per SM preemption: each SM is handed
    // over 5 µs later than its mechanism alone allows.
    let procs = low_then_high;
    for (policy, base_latency) in [("ppq-excl-drain", 70_000), ("ppq-excl-flush", 0)] {
        let (r0, _) = run(policy, procs());
        let (r5, trace) = run_with(policy, procs(), 5_000);
        assert_eq!(end(&r5, 1), end(&r0, 1) + 5_000, "{policy}");
        assert!(r0.preemptions.iter().all(|p| p.latency_ns == base_latency), "{policy}");
        assert!(r5.preemptions.iter().all(|p| p.latency_ns == base_latency + 5_000), "{policy}");
        assert_eq!(trace.iter().filter(|s| s.name == "preemption overhead").count(), 13, "{policy}");
    }
    // Context switch: the save time plus 5 µs.
    let (r0, _) = run("ppq-excl-cs", procs());
    let (r5, _) = run_with("ppq-excl-cs", procs(), 5_000);
    let l0 = r0.preemptions[0].latency_ns;
    assert!(l0 > 0 && r0.preemptions.iter().all(|p| p.latency_ns == l0));
    assert!(r5.preemptions.iter().all(|p| p.latency_ns == l0 + 5_000));
    assert_eq!(end(&r5, 1), end(&r0, 1) + 5_000);
}

#[test]
fn dss_splits_sms_evenly_between_two_kernels() {
    // Two long kernels with equal tokens: each should hold 6 or 7 of 13 SMs.
    let (_, trace) = run(
        "dss-cs",
        vec![
            proc_("a", 0, 0, vec![k("a", 13 * 50, 1, 10_000)]),
            proc_("b", 0, 20_000, vec![k("b", 13 * 50, 1, 10_000)]),
        ],
    );
    // At 100 µs, count SMs owned by each kernel.
    let at = 100_000;
    let owners = |name: &str| {
        trace.iter().filter(|s| s.category == "kernel" && s.name == name && s.start_ns <= at && s.end_ns > at).count()
    };
    let (a, b) = (owners("a"), owners("b"));
    assert_eq!(a + b, 13, "every SM busy");
    assert!(a.abs_diff(b) <= 1, "a {a} SMs, b {b} SMs");
}

#[test]
fn round_robin_alternates_slices() {
    // Two processes, long kernels; 50 µs quantum with 10 µs blocks → slices
    // of 5 waves. With RR the second process must finish its first slice long
    // before the first process's kernel is done.
    let (r, trace) = run(
        "rr-50us",
        vec![proc_("a", 0, 0, vec![k("a", 13 * 100, 1, 10_000)]), proc_("b", 0, 0, vec![k("b", 13 * 100, 1, 10_000)])],
    );
    // a's first slice is 5 waves (65 blocks); its last wave is issued at
    // 40 µs, when the slice has nothing left to issue and b takes the SMs
    // (its blocks fill in as a's last wave ends at 50 µs).
    let first_b = trace.iter().filter(|s| s.name == "b").map(|s| s.start_ns).min().expect("b ran");
    assert_eq!(first_b, 40_000, "b's first slice follows a's first slice");
    let second_a = trace.iter().filter(|s| s.name == "a" && s.start_ns > 0).map(|s| s.start_ns).min().expect("a again");
    assert_eq!(second_a, 90_000, "a's second slice follows b's first");
    // Both finish near the end: total work is 2000 µs.
    assert!(end(&r, 0) >= 1_900_000 && end(&r, 1) >= 1_950_000);
}

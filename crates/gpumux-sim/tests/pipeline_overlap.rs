//! Issue 40's copy/compute pipeline on the simulated GPU, driven through the
//! engine's live interface as gpumuxd drives it: chunk c is copied up on a
//! copy-in stream, a compute stream waits for that copy's marker and runs a
//! kernel, a copy-out stream waits for the kernel's marker and copies the
//! chunk down. Everything is queued at t = 0, as a client whose copies do
//! not wait queues it (`copy_to_device_async`). What the GPU check measures
//! on a real GPU holds here: each stage starts only after the one it waits
//! for, each copy in is on the device before the one before it ended (the
//! engine's copy ahead), a copy up and a copy down are in flight at once
//! (two copy engines) beside the kernels, and the whole takes about the
//! copy-in chain plus one kernel and one copy down, well below the sum of
//! its parts.

mod stepping;

use gpumux_engine::device::{Command, CopyDirection, Device, Event};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::policies;
use gpumux_engine::time::Nanos;
use gpumux_engine::{Engine, OpId, ProcessId, ProcessInfo, StreamOp};
use gpumux_sim::{presets, SimGpu};
use std::collections::HashMap;
use std::sync::Arc;

const CHUNKS: usize = 12;
const CHUNK_BYTES: u64 = 16 << 20;

/// One operation's first command to the device and its end.
#[derive(Default)]
struct Spans {
    start: HashMap<OpId, Nanos>,
    end: HashMap<OpId, Nanos>,
}

impl Spans {
    fn span(&self, op: OpId) -> (Nanos, Nanos) {
        (self.start[&op], self.end[&op])
    }
}

fn kernel(c: usize) -> StreamOp {
    // One wave on an H100 (132 SMs × 8 blocks of 256 threads), 150 µs a block.
    let desc =
        KernelDesc::new(format!("lcg{c}"), KernelShape::new(1056, 256, 32)).with_sim_timing(SimTiming::new(150_000));
    StreamOp::Kernel { desc: Arc::new(desc), time_key: 1 }
}

#[test]
fn a_copy_compute_pipeline_overlaps_both_copy_directions_and_the_kernels() {
    for (policy, _) in gpumux_engine::policies::CATALOGUE {
        let info = presets::h100();
        let mut engine = Engine::new(info.clone(), policies::by_name(policy).expect("a policy")).expect("engine");
        let mut gpu = SimGpu::new(info, 7);
        let slot = |engine: &mut Engine, i: u32| {
            engine.add_process(ProcessInfo::new(ProcessId(i), format!("s{i}"))).expect("a stream")
        };
        let (copy_in, copy_out) = (slot(&mut engine, 0), slot(&mut engine, 1));
        let compute = [slot(&mut engine, 2), slot(&mut engine, 3)];
        let mut chunks = Vec::new();
        for c in 0..CHUNKS {
            let up = StreamOp::Copy { direction: CopyDirection::HostToDevice, bytes: CHUNK_BYTES };
            let up = engine.submit(0, copy_in, up).expect("copy in");
            let arrived = engine.submit(0, copy_in, StreamOp::Sync).expect("record");
            let k = compute[c % 2];
            engine.submit(0, k, StreamOp::WaitFor { slot: copy_in, op: arrived }).expect("wait");
            let run = engine.submit(0, k, kernel(c)).expect("kernel");
            let computed = engine.submit(0, k, StreamOp::Sync).expect("record");
            engine.submit(0, copy_out, StreamOp::WaitFor { slot: k, op: computed }).expect("wait");
            let down = StreamOp::Copy { direction: CopyDirection::DeviceToHost, bytes: CHUNK_BYTES };
            let down = engine.submit(0, copy_out, down).expect("copy out");
            chunks.push((up, run, down));
        }
        let spans = drive(&mut engine, &mut gpu, chunks.len() * 3, |op| {
            chunks.iter().any(|&(u, r, d)| op == u || op == r || op == d)
        });

        let (mut copy_down, mut kernels) = (0, 0);
        for (c, &(up, run, down)) in chunks.iter().enumerate() {
            let (_, u1) = spans.span(up);
            let (k0, k1) = spans.span(run);
            let (d0, d1) = spans.span(down);
            assert!(k0 >= u1, "{policy}: chunk {c}'s kernel started at {k0} ns, before its copy in ended at {u1}");
            assert!(d0 >= k1, "{policy}: chunk {c}'s copy out started at {d0} ns, before its kernel ended at {k1}");
            copy_down += d1 - d0;
            kernels += k1 - k0;
            // Copy ahead: the next copy in was on the device before this one ended.
            if let Some(&(next, _, _)) = chunks.get(c + 1) {
                assert!(spans.start[&next] < u1, "{policy}: chunk {}'s copy in waited for chunk {c}'s end", c + 1);
            }
        }
        // Each copy in is queued behind the one before: the first alone shows one's time.
        let one_up = spans.end[&chunks[0].0] - spans.start[&chunks[0].0];
        let copy_up = one_up * CHUNKS as u64;
        let makespan = chunks.iter().map(|&(_, _, d)| spans.end[&d]).max().unwrap_or(0);
        let (one_kernel, one_down) = (kernels / CHUNKS as u64, copy_down / CHUNKS as u64);
        assert!(
            makespan < (copy_up + copy_down + kernels) * 6 / 10,
            "{policy}: {makespan} ns, not well below copies {copy_up} + {copy_down} and kernels {kernels} ns"
        );
        // The copy-in chain bounds it; the last kernel and copy down follow.
        let bound = copy_up + one_kernel + one_down;
        assert!(makespan >= copy_up, "{policy}: faster than its copies in");
        assert!(
            makespan <= bound + bound / 20,
            "{policy}: {makespan} ns against the chain's {bound} (copy in {one_up} ns)"
        );
        // A copy down ran while a later chunk's copy up did: both engines at once.
        let both = chunks.iter().enumerate().any(|(c, &(_, _, down))| {
            let (d0, d1) = spans.span(down);
            chunks[c + 1..].iter().any(|&(up, _, _)| {
                let (u0, u1) = spans.span(up);
                u0 < d1 && d0 < u1
            })
        });
        assert!(both, "{policy}: no copy down overlapped a copy up");
    }
}

/// Runs the engine and the GPU until `want` operations that `tracked`
/// names have ended; their spans.
fn drive(engine: &mut Engine, gpu: &mut SimGpu, want: usize, tracked: impl Fn(OpId) -> bool) -> Spans {
    let mut spans = Spans::default();
    let mut now: Nanos = 0;
    let mut events: Vec<Event> = Vec::new();
    for _ in 0..1_000_000 {
        while let Some(cmd) = engine.poll_command().expect("the engine decides") {
            if let Command::Launch { op, .. } | Command::Copy { op, .. } = &cmd {
                spans.start.entry(*op).or_insert(now);
            }
            gpu.submit(now, cmd).expect("the device accepts engine commands");
        }
        while let Some(c) = engine.poll_completion() {
            if tracked(c.op) {
                spans.end.insert(c.op, now);
            }
        }
        if spans.end.len() == want {
            return spans;
        }
        let deadline = engine.poll_timeout();
        now = stepping::step(engine, gpu, deadline, &mut events);
    }
    panic!("the pipeline did not finish");
}

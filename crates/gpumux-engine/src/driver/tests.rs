//! The driver loop's hooks, on a hand-written device that runs every launch
//! for a fixed time: commands and events seen in order, a stop time kept,
//! progress reported.

use super::*;
use crate::device::{ProtocolError, ReleaseCause};
use crate::ids::{LaunchId, SmId};
use crate::kernel::{DeviceInfo, KernelDesc, KernelShape, SimTiming, SmLimits};
use crate::model::{Op, ProcessSpec, Workload};
use crate::policies::fcfs::Fcfs;
use crate::ranges::BlockRanges;
use std::collections::VecDeque;
use std::sync::Arc;

/// Time every launch takes on [`FixedTimeGpu`].
const LAUNCH_NS: Nanos = 1_000;

fn info() -> DeviceInfo {
    DeviceInfo {
        name: "fixed-time test GPU".into(),
        num_sms: 4,
        sm: SmLimits { max_threads: 2048, max_blocks: 16, registers: 65536, smem_bytes: 49152 },
        mem_bandwidth: 1e11,
        pcie_bandwidth: 1e10,
        pcie_latency_ns: 0,
        mem_bytes: 1 << 30,
    }
}

fn kernel(blocks: u64) -> Op {
    Op::Kernel(Arc::new(
        KernelDesc::new("k", KernelShape::new(blocks, 128, 16))
            .with_sim_timing(SimTiming::new(100))
            .with_idempotent(false),
    ))
}

/// One process that runs `kernels` kernels of 8 blocks, one after the other, `repetitions` times.
fn workload(kernels: usize, repetitions: u32) -> Workload {
    Workload {
        name: "driver test".into(),
        processes: vec![ProcessSpec {
            name: "p".into(),
            priority: 0,
            weight: 1.0,
            arrival_ns: 0,
            repetitions,
            async_depth: 0,
            ops: (0..kernels).map(|_| kernel(8)).collect(),
        }],
        replay_min_runs: None,
    }
}

fn engine(w: &Workload) -> Replay {
    Replay::new(w, info(), Box::new(Fcfs), None).expect("engine")
}

/// A device double: a launch runs all its blocks in [`LAUNCH_NS`], then
/// releases its SMs and ends. It keeps what it was sent and what it reported.
struct FixedTimeGpu {
    info: DeviceInfo,
    now: Nanos,
    /// Launches in flight, in the order they end: end time, launch, its SMs, its blocks.
    running: VecDeque<(Nanos, LaunchId, Vec<SmId>, u64)>,
    submitted: Vec<(Nanos, Command)>,
    reported: Vec<(Nanos, Event)>,
    stats: DeviceStats,
}

impl FixedTimeGpu {
    fn new() -> Self {
        FixedTimeGpu {
            info: info(),
            now: 0,
            running: VecDeque::new(),
            submitted: Vec::new(),
            reported: Vec::new(),
            stats: DeviceStats::default(),
        }
    }
}

impl Device for FixedTimeGpu {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn submit(&mut self, now: Nanos, command: Command) -> Result<(), DeviceError> {
        if let Command::Launch { launch, blocks, sms, .. } = &command {
            self.running.push_back((now + LAUNCH_NS, *launch, sms.iter().collect(), blocks.len()));
        } else {
            return Err(
                ProtocolError::Unsupported { device: self.info.name.clone(), command: format!("{command:?}") }.into()
            );
        }
        self.submitted.push((now, command));
        Ok(())
    }

    fn advance(&mut self, until: Option<Nanos>, events: &mut Vec<Event>) -> Result<Nanos, DeviceError> {
        let Some(&(end, ..)) = self.running.front() else {
            return until.ok_or(DeviceError::Stalled { now: self.now });
        };
        if let Some(until) = until.filter(|&u| u < end) {
            self.now = until;
            return Ok(until);
        }
        self.now = end;
        while self.running.front().is_some_and(|r| r.0 == end) {
            let Some((_, launch, sms, blocks)) = self.running.pop_front() else { break };
            for sm in sms {
                events.push(Event::SmReleased { launch, sm, cause: ReleaseCause::Exhausted });
            }
            events.push(Event::LaunchEnded {
                launch,
                remaining: BlockRanges::new(),
                saved: Vec::new(),
                completed: blocks,
            });
            self.stats.blocks_completed += blocks;
        }
        self.reported.extend(events.iter().map(|e| (end, e.clone())));
        Ok(end)
    }

    fn stats(&self) -> DeviceStats {
        self.stats.clone()
    }
}

/// Keeps everything the driver shows it.
#[derive(Default)]
struct Recorder {
    commands: Vec<(Nanos, Command)>,
    events: Vec<(Nanos, Event)>,
    progress: Vec<Progress>,
}

impl DriverHooks for Recorder {
    fn on_command(&mut self, now: Nanos, command: &Command) {
        self.commands.push((now, command.clone()));
    }

    fn on_event(&mut self, now: Nanos, event: &Event) {
        self.events.push((now, event.clone()));
    }

    fn on_progress(&mut self, progress: Progress) {
        self.progress.push(progress);
    }
}

#[test]
fn hooks_see_every_command_and_event_in_the_order_the_device_does() {
    let w = workload(3, 1);
    let mut gpu = FixedTimeGpu::new();
    let mut hooks = Recorder::default();
    let out = run(&mut engine(&w), &mut gpu, &mut hooks).expect("run");
    assert_eq!(hooks.commands, gpu.submitted);
    assert_eq!(hooks.events, gpu.reported);
    // Three kernels one after the other, each launched when the one before ended.
    let launch_times: Vec<Nanos> = hooks.commands.iter().map(|(t, _)| *t).collect();
    assert_eq!(launch_times, [0, LAUNCH_NS, 2 * LAUNCH_NS]);
    assert_eq!(out.end_ns, 3 * LAUNCH_NS);
    assert_eq!(out.record.processes[0].runs.len(), 1);
    assert_eq!(out.stats.blocks_completed, 24);
}

#[test]
fn a_pair_of_hooks_both_see_the_run() {
    let w = workload(2, 1);
    let (mut first, mut second) = (Recorder::default(), Recorder::default());
    run(&mut engine(&w), &mut FixedTimeGpu::new(), &mut (&mut first, &mut second)).expect("run");
    assert_eq!(first.commands.len(), 2);
    assert_eq!(first.commands, second.commands);
    assert_eq!(first.events, second.events);
    assert_eq!(first.progress, second.progress);
}

#[test]
fn a_run_stops_at_the_stop_time_and_the_engine_hears_nothing_from_it() {
    let w = workload(3, 1);
    let mut gpu = FixedTimeGpu::new();
    let mut hooks = Recorder::default();
    let stop = 2 * LAUNCH_NS;
    let out = run_until(&mut engine(&w), &mut gpu, stop, &mut hooks).expect("run");
    assert_eq!(out.end_ns, stop);
    // The second kernel ended exactly at the stop time: reported by the device, never passed on.
    assert!(hooks.events.iter().all(|(t, _)| *t < stop), "{:?}", hooks.events);
    assert!(gpu.reported.iter().any(|(t, _)| *t == stop));
    assert_eq!(hooks.commands.len(), 2);
    assert!(out.record.processes[0].runs.is_empty(), "the run did not complete");
}

#[test]
fn a_stop_time_between_events_ends_the_run_there() {
    let w = workload(3, 1);
    let mut gpu = FixedTimeGpu::new();
    let out = run_until(&mut engine(&w), &mut gpu, LAUNCH_NS / 2, &mut NoHooks).expect("run");
    assert_eq!(out.end_ns, LAUNCH_NS / 2);
    assert!(gpu.reported.is_empty());
    assert_eq!(out.stats.blocks_completed, 0);
}

#[test]
fn a_stop_time_after_the_end_changes_nothing() {
    let w = workload(3, 2);
    let mut whole = Recorder::default();
    let mut stopped = Recorder::default();
    let a = run(&mut engine(&w), &mut FixedTimeGpu::new(), &mut whole).expect("run");
    let b = run_until(&mut engine(&w), &mut FixedTimeGpu::new(), 100 * LAUNCH_NS, &mut stopped).expect("run");
    assert_eq!(a.record, b.record);
    assert_eq!(a.end_ns, b.end_ns);
    assert_eq!(whole.commands, stopped.commands);
    assert_eq!(whole.events, stopped.events);
}

#[test]
fn progress_comes_every_so_many_steps_and_once_at_the_end() {
    // One step per kernel: each ends alone, and the next starts at once.
    let kernels = 2 * PROGRESS_EVERY as usize + 10;
    let w = workload(kernels, 1);
    let mut hooks = Recorder::default();
    let out = run(&mut engine(&w), &mut FixedTimeGpu::new(), &mut hooks).expect("run");
    let times: Vec<Nanos> = hooks.progress.iter().map(|p| p.now).collect();
    assert_eq!(times, [PROGRESS_EVERY * LAUNCH_NS, 2 * PROGRESS_EVERY * LAUNCH_NS, out.end_ns]);
    let last = hooks.progress.last().copied().unwrap_or_default();
    assert_eq!(last.blocks_completed, out.stats.blocks_completed);
    assert_eq!(last.ops_issued, kernels as u64);
    assert!(hooks.progress.windows(2).all(|p| p[0].blocks_completed <= p[1].blocks_completed));
}

//! Runs an engine against a device until the workload completes.

use crate::device::{Device, DeviceError, DeviceStats, Event, TraceSpan};
use crate::engine::EngineError;
use crate::record::RunRecord;
use crate::replay::Replay;
use crate::time::Nanos;

/// Why a run stopped early.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The engine (or its front-end) stopped.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The device stopped.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Everything one run produced.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// What the processes did.
    pub record: RunRecord,
    /// The device's counters.
    pub stats: DeviceStats,
    /// The device's timeline, if it was asked to record one.
    pub trace: Vec<TraceSpan>,
}

/// How far a run is, for progress displays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Device time.
    pub now: Nanos,
    /// Blocks the device completed so far.
    pub blocks_completed: u64,
    /// Operations the processes have issued so far.
    pub ops_issued: u64,
}

/// Drives `engine` on `device` to completion. `progress` is called now and
/// then with the current device time (for progress bars); it must be cheap.
pub fn run(
    engine: &mut Replay,
    device: &mut dyn Device,
    progress: &mut dyn FnMut(Nanos),
) -> Result<RunOutcome, RunError> {
    run_with_progress(engine, device, &mut |p| progress(p.now))
}

/// [`run`], reporting blocks and operations done as well (ETAs), and once
/// more when the run completes.
pub fn run_with_progress(
    engine: &mut Replay,
    device: &mut dyn Device,
    progress: &mut dyn FnMut(Progress),
) -> Result<RunOutcome, RunError> {
    let mut events: Vec<Event> = Vec::new();
    let mut now: Nanos = 0;
    // Arrivals at time 0 are timers like any other.
    engine.handle_timeout(0);
    let mut steps: u64 = 0;
    // Protocol log for debugging a device or policy (`GPUMUX_LOG_PROTOCOL=1`).
    let log = std::env::var_os("GPUMUX_LOG_PROTOCOL").is_some();
    loop {
        while let Some(cmd) = engine.poll_command()? {
            if log {
                eprintln!("{now:>14} -> {cmd:?}");
            }
            device.submit(now, cmd)?;
        }
        if engine.is_finished() {
            break;
        }
        let deadline = engine.poll_timeout();
        events.clear();
        let t = device.advance(deadline, &mut events)?;
        now = t;
        if events.is_empty() {
            engine.handle_timeout(t);
        } else {
            for ev in events.drain(..) {
                if log {
                    eprintln!("{t:>14} <- {ev:?}");
                }
                engine.handle_event(t, ev)?;
            }
            if deadline.is_some_and(|d| d <= t) {
                engine.handle_timeout(t);
            }
        }
        steps += 1;
        if steps.is_multiple_of(4096) {
            progress(Progress {
                now,
                blocks_completed: device.stats().blocks_completed,
                ops_issued: engine.ops_issued(),
            });
        }
    }
    progress(Progress { now, blocks_completed: device.stats().blocks_completed, ops_issued: engine.ops_issued() });
    Ok(RunOutcome { record: engine.record(), stats: device.stats(), trace: device.take_trace() })
}

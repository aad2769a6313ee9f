//! The one loop that runs an engine against a device: `gpumux run`, `gpumux
//! bench sim`, the experiments and the tests all go through it.
//!
//! What a caller wants to watch (commands, events, progress) it says with
//! [`DriverHooks`], whose methods default to doing nothing; the loop is
//! generic over the hooks, so a run without any ([`NoHooks`], `()`) costs what
//! a loop without hooks would. The loop itself does no I/O: a protocol log,
//! a progress bar or a counter is the caller's hook.

use crate::device::{Command, Device, DeviceError, DeviceStats, Event, TraceSpan};
use crate::engine::EngineError;
use crate::record::RunRecord;
use crate::replay::Replay;
use crate::time::Nanos;

/// Why a run stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The engine failed: a policy decided something invalid, the device broke
    /// the protocol, or simulated time overflowed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The device refused a command or could not go on.
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Everything one run produced.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// The engine's record: each process's runs, preemptions, makespan.
    pub record: RunRecord,
    /// The device's counters.
    pub stats: DeviceStats,
    /// The device's timeline, if it was asked to keep one (`Device::enable_trace`).
    pub trace: Vec<TraceSpan>,
    /// Device time when the run ended: where the device's last step left it,
    /// or the stop time of [`run_until`].
    pub end_ns: Nanos,
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

/// Steps of the loop (one `advance` each) between two [`DriverHooks::on_progress`]
/// calls: often enough for a display, rare enough that reading the device's
/// counters costs nothing measurable.
pub const PROGRESS_EVERY: u64 = 4096;

/// What a caller sees of a run while it goes. Every method does nothing
/// unless implemented; all are called on the driver's thread, in the order
/// things happen, and must be cheap (they run once per command or event).
pub trait DriverHooks {
    /// A command the engine issued at `now`, just before the device gets it.
    #[inline]
    fn on_command(&mut self, _now: Nanos, _command: &Command) {}

    /// An event the device reported at `now`, just before the engine gets it.
    #[inline]
    fn on_event(&mut self, _now: Nanos, _event: &Event) {}

    /// How far the run is: every [`PROGRESS_EVERY`] steps and once at the end
    /// (not when an error ends the run).
    #[inline]
    fn on_progress(&mut self, _progress: Progress) {}
}

/// A run nobody watches.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoHooks;

impl DriverHooks for NoHooks {}

impl<H: DriverHooks + ?Sized> DriverHooks for &mut H {
    #[inline]
    fn on_command(&mut self, now: Nanos, command: &Command) {
        (**self).on_command(now, command)
    }

    #[inline]
    fn on_event(&mut self, now: Nanos, event: &Event) {
        (**self).on_event(now, event)
    }

    #[inline]
    fn on_progress(&mut self, progress: Progress) {
        (**self).on_progress(progress)
    }
}

/// Two watchers of one run, each called in turn (first, then second).
impl<A: DriverHooks, B: DriverHooks> DriverHooks for (A, B) {
    #[inline]
    fn on_command(&mut self, now: Nanos, command: &Command) {
        self.0.on_command(now, command);
        self.1.on_command(now, command);
    }

    #[inline]
    fn on_event(&mut self, now: Nanos, event: &Event) {
        self.0.on_event(now, event);
        self.1.on_event(now, event);
    }

    #[inline]
    fn on_progress(&mut self, progress: Progress) {
        self.0.on_progress(progress);
        self.1.on_progress(progress);
    }
}

/// Drives `engine` on `device` until the workload completes.
pub fn run<D, H>(engine: &mut Replay, device: &mut D, hooks: &mut H) -> Result<RunOutcome, RunError>
where
    D: Device + ?Sized,
    H: DriverHooks + ?Sized,
{
    drive(engine, device, None, hooks)
}

/// [`run`], but the run ends at device time `stop_at` if work remains then
/// (fixed-time runs, as in Adriaens's spatial experiments): the device is
/// advanced no further than `stop_at`, and what it reports on reaching it is
/// not handed to the engine, so the record is the engine's view just before.
pub fn run_until<D, H>(
    engine: &mut Replay,
    device: &mut D,
    stop_at: Nanos,
    hooks: &mut H,
) -> Result<RunOutcome, RunError>
where
    D: Device + ?Sized,
    H: DriverHooks + ?Sized,
{
    drive(engine, device, Some(stop_at), hooks)
}

fn drive<D, H>(
    engine: &mut Replay,
    device: &mut D,
    stop_at: Option<Nanos>,
    hooks: &mut H,
) -> Result<RunOutcome, RunError>
where
    D: Device + ?Sized,
    H: DriverHooks + ?Sized,
{
    let mut events: Vec<Event> = Vec::new();
    let mut now: Nanos = 0;
    // Arrivals at time 0 are timers like any other.
    engine.handle_timeout(0);
    let mut steps: u64 = 0;
    loop {
        while let Some(cmd) = engine.poll_command()? {
            hooks.on_command(now, &cmd);
            device.submit(now, cmd)?;
        }
        if engine.is_finished() {
            break;
        }
        let deadline = engine.poll_timeout();
        let until = match stop_at {
            Some(stop) => Some(deadline.map_or(stop, |d| d.min(stop))),
            None => deadline,
        };
        events.clear();
        now = device.advance(until, &mut events)?;
        if stop_at.is_some_and(|stop| now >= stop) {
            break;
        }
        if events.is_empty() {
            engine.handle_timeout(now);
        } else {
            for ev in events.drain(..) {
                hooks.on_event(now, &ev);
                engine.handle_event(now, ev)?;
            }
            if deadline.is_some_and(|d| d <= now) {
                engine.handle_timeout(now);
            }
        }
        steps += 1;
        if steps.is_multiple_of(PROGRESS_EVERY) {
            hooks.on_progress(progress(engine, device, now));
        }
    }
    hooks.on_progress(progress(engine, device, now));
    Ok(RunOutcome { record: engine.record(), stats: device.stats(), trace: device.take_trace(), end_ns: now })
}

fn progress<D: Device + ?Sized>(engine: &Replay, device: &D, now: Nanos) -> Progress {
    Progress { now, blocks_completed: device.stats().blocks_completed, ops_issued: engine.ops_issued() }
}

#[cfg(test)]
mod tests;

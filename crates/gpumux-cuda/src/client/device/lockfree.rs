//! Polls that make no driver call while the launcher thread has kernels to
//! launch (issue 35).
//!
//! **Why.** A poll's driver calls take the driver's lock, which the launcher
//! thread's `cuLaunchKernel` of a run's next kernel waits for
//! (`runtime::launcher`). The calls a poll can make, and when:
//! * `cuEventQuery` of a copy's end event: at every poll, for the first copy
//!   of each copy stream while one is in flight (`poll_copies`);
//! * `cuEventQuery` of a launch's end event (`WorkerLaunch::poll`): a launch
//!   whose end shows in host memory only after [`crate::preempt`]'s
//!   `EVENT_QUERY_AFTER` (100 µs) and then at most every 100 µs (the fault
//!   check), a launch that publishes no end (a timed one, an unpublished
//!   native kernel not known ended from a later one) at every poll, with a
//!   `cuEventRecord` on its stream first for a lazy end; for live launches
//!   (`poll_launches`), the heads of runs queued natively (`poll_ahead`),
//!   the kernel a run's unpublished one is known ended from
//!   (`mark_implied_ends`), and orphaned queued workers (`poll_orphans`);
//! * `cuCtxGetCurrent` as each part makes the context current, and only
//!   until the context is known current on the thread (`ClientContext::bind`;
//!   a read of the thread's current context, no lock that a launch waits for).
//!
//! Ends published in host memory (every worker launch's, one native kernel's
//! in a few of a run's, its last always) and cuts' answers are read there.
//!
//! **How.** The device thread is the only one that posts to the launcher, so
//! a launcher with nothing posted and not made when a poll starts has
//! nothing to launch that the poll's calls could hold up. When it does
//! ([`Launcher::busy`]), the poll reads host memory alone: launches and runs
//! end from their published ends (or a later kernel's), and copies and
//! orphans wait for the next poll that may call the driver. Driver calls
//! are made at least every [`DRIVER_POLL_GAP`] all the same, busy or not:
//! a fault never publishes an end, and is seen by those calls (or by the
//! launcher's own failing `cuLaunchKernel`, which ends its jobs and so the
//! busy spell).
//!
//! **Off by default.** On one H200 (2026-11-29, the 511-launch chain, four
//! runs alternating in one call) it measured 2.41x and 1.98x native against
//! 2.34x and 2.20x off: no gain beyond the chain's spread, with 2 % of the
//! polls reading host memory alone. [`POLL_LOCKFREE_VAR`] = `1` turns it on
//! for experiments.

use super::ClientDevice;
use crate::preempt::WorkerLaunch;
use crate::runtime::launcher::Launcher;
use gpumux_engine::time::Nanos;

/// The daemon's environment (its device process inherits it): `1`, a poll
/// makes no driver call while the launcher thread has kernels to launch
/// (module doc); unset or anything else, every poll makes its calls (the
/// default: no gain measured, module doc).
pub const POLL_LOCKFREE_VAR: &str = "GPUMUX_POLL_LOCKFREE";

/// The most device time between two polls that make their driver calls
/// (ns): a fault shows no later than this after the poll that would have
/// seen it (plus the 100 µs of `EVENT_QUERY_AFTER` for a launch that
/// publishes its end).
pub const DRIVER_POLL_GAP: Nanos = 1_000_000;

/// [`POLL_LOCKFREE_VAR`]'s value: on only if it is `1`.
pub fn lockfree_from(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim() == "1")
}

/// Whether a poll at `now` makes its driver calls (`false`: host memory
/// alone), with the switch `on`, the launcher thread `launching` (kernels
/// posted and not made), and the last poll that made them at `driver_polled`.
pub fn driver_calls_due(on: bool, launching: bool, now: Nanos, driver_polled: Nanos) -> bool {
    !on || !launching || now >= driver_polled.saturating_add(DRIVER_POLL_GAP)
}

/// Every worker of `segs` has left, as host memory shows (no driver call):
/// not running, or its end published there or known from a later kernel's.
pub(super) fn all_left_in_host_memory(segs: &[WorkerLaunch]) -> bool {
    segs.iter().all(|w| !w.running() || w.end_in_host_memory())
}

/// Polls by whether they called the driver (logged on close).
#[derive(Debug, Default)]
pub(super) struct LockfreeCounts {
    /// Polls that read host memory alone.
    pub host_only: u64,
    /// Polls that made their driver calls.
    pub with_driver: u64,
    /// When the last of those began (device time, ns).
    pub driver_polled: Nanos,
}

impl LockfreeCounts {
    /// One line, or `None` if no poll was made.
    pub fn summary(&self) -> Option<String> {
        let all = self.host_only + self.with_driver;
        (all > 0 && self.host_only > 0).then(|| {
            format!(
                "{} of {all} polls read host memory alone (the launcher thread had kernels to launch; {}=0: none)",
                self.host_only, POLL_LOCKFREE_VAR
            )
        })
    }
}

impl ClientDevice {
    /// Whether the poll starting now makes its driver calls (module doc),
    /// counted, and noted as the last that did if so.
    pub(super) fn poll_calls_driver(&mut self) -> bool {
        let launching = self.st.as_ref().and_then(|st| st.launcher.as_ref()).is_some_and(Launcher::busy);
        let now = self.now();
        let due = driver_calls_due(self.poll_lockfree, launching, now, self.lockfree.driver_polled);
        if due {
            self.lockfree.with_driver += 1;
            self.lockfree.driver_polled = now;
        } else {
            self.lockfree.host_only += 1;
        }
        due
    }

    /// Polls so far that read host memory alone, and those that called the
    /// driver (module doc).
    pub fn polls_by_driver_calls(&self) -> (u64, u64) {
        (self.lockfree.host_only, self.lockfree.with_driver)
    }

    /// Sets whether polls skip driver calls while the launcher thread has
    /// kernels to launch (tests; the device reads [`POLL_LOCKFREE_VAR`] when it opens).
    pub fn set_poll_lockfree(&mut self, on: bool) {
        self.poll_lockfree = on;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_is_on_only_when_it_reads_1() {
        assert!(!lockfree_from(None));
        assert!(lockfree_from(Some("1")));
        assert!(lockfree_from(Some(" 1\n")));
        assert!(!lockfree_from(Some("yes")));
        assert!(!lockfree_from(Some("0")));
    }

    #[test]
    fn a_poll_skips_driver_calls_only_while_kernels_wait_for_the_launcher_and_not_for_long() {
        let polled = 5_000_000;
        // The launcher has kernels to launch, the last driver poll recent: host memory alone.
        assert!(!driver_calls_due(true, true, polled + 10_000, polled));
        assert!(!driver_calls_due(true, true, polled + DRIVER_POLL_GAP - 1, polled));
        // ...but never longer than DRIVER_POLL_GAP without them (the fault check).
        assert!(driver_calls_due(true, true, polled + DRIVER_POLL_GAP, polled));
        // Nothing to launch: nothing to hold up, the calls are made.
        assert!(driver_calls_due(true, false, polled + 10_000, polled));
        // Switched off: always made, as before.
        assert!(driver_calls_due(false, true, polled + 10_000, polled));
        // The device's first poll (none made yet, at time 0).
        assert!(driver_calls_due(true, true, DRIVER_POLL_GAP, 0));
    }

    #[test]
    fn the_counts_say_how_many_polls_read_host_memory_alone() {
        let mut c = LockfreeCounts::default();
        assert_eq!(c.summary(), None);
        c.with_driver = 3;
        assert_eq!(c.summary(), None, "every poll called the driver");
        c.host_only = 7;
        let line = c.summary().unwrap_or_default();
        assert!(line.starts_with("7 of 10 polls"), "{line}");
    }
}

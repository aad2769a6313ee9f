//! Which priorities started launches lately: while a higher priority is
//! active, no kernel of a lower one is queued natively ahead (issue 39).
//!
//! **Why.** Kernels queued natively ahead ([`super::ahead`], "Deep") run on
//! the GPU whatever the engine decides next, and cannot be called back. The
//! engine keeps an urgent client's SMs from a lower level of long blocks
//! while the urgent client is active (`gpumux_engine::policies::reserve`);
//! a run of the lower level's kernels queued natively behind one launch the
//! engine made (before the urgent client came, or before the engine had
//! measured the level's blocks) goes on regardless: on an H200 (the lead's
//! run of f3ec956, `oversubscribe-gpu.sh`, 11.3 % lost) 16 kernels of a
//! neighbour's run, 28 ms each, ran beside 16 of the urgent client's
//! kernels, each of which then took 28 ms instead of 2. Hardware stream
//! priority orders only blocks waiting for a slot, and a neighbour's blocks
//! that took the slots first hold them for their whole run. So while a
//! higher priority is active, every kernel of a lower one is started by the
//! engine's launch command, one at a time, as without queueing ahead.
//!
//! **Tried: short blocks let through.** Holding only kernels whose blocks
//! were not known shorter than the engine's reserve bound (200 µs; block
//! times from the profile cache or from native grids' command-to-end
//! times) was to give back the low-priority client of `bench daemon --only
//! priority` (2 ms kernels of 20 µs blocks) the round trip through the
//! daemon per kernel that the hold costs it. It did not: on one H200
//! (2026-11-29, 1ce7bf1, the priority part twice per setting, alternating)
//! that client kept 0.936 and 0.937 of its rate beside the urgent one at 20
//! µs blocks with it, against 0.947 and 0.949 holding every kernel, the
//! urgent p99 the same; level at 100 and 1000 µs blocks. The code is in
//! git: 026a0d1 (`GPUMUX_HIGHER_HOLD=long`).

use std::time::{Duration, Instant};

/// A priority that started a launch this recently counts as active: longer
/// than an urgent client's gaps between its kernels and rounds (tens of
/// microseconds to a few milliseconds through the daemon).
pub const ACTIVE_FOR: Duration = Duration::from_millis(100);

/// The last launch start of each priority (a few priorities).
#[derive(Debug, Default)]
pub struct Higher {
    last: Vec<(i32, Instant)>,
}

impl Higher {
    /// A launch of `priority` started at `now`.
    pub fn started(&mut self, priority: i32, now: Instant) {
        match self.last.iter_mut().find(|e| e.0 == priority) {
            Some(e) => e.1 = now,
            None => self.last.push((priority, now)),
        }
    }

    /// A priority above `priority` started a launch within [`ACTIVE_FOR`] of
    /// `now`: a kernel of `priority` is held from being queued natively ahead.
    pub fn active_above(&self, priority: i32, now: Instant) -> bool {
        self.last.iter().any(|&(p, t)| p > priority && now.saturating_duration_since(t) < ACTIVE_FOR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_higher_priority_counts_as_active_for_a_while_after_its_last_launch() {
        let t0 = Instant::now();
        let mut h = Higher::default();
        assert!(!h.active_above(0, t0));
        h.started(5, t0);
        h.started(0, t0);
        assert!(h.active_above(0, t0 + ACTIVE_FOR / 2), "priority 5 launched lately");
        assert!(!h.active_above(5, t0), "nothing above 5");
        assert!(!h.active_above(0, t0 + ACTIVE_FOR), "idle for the window: no longer active");
        h.started(5, t0 + ACTIVE_FOR);
        assert!(h.active_above(0, t0 + ACTIVE_FOR), "a new launch renews it");
    }
}

//! Which priorities started launches lately: a stream of a lower priority
//! is not queued natively ahead while a higher one is active (issue 39).
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
//! that took the slots first hold them for their whole run. A kernel of a
//! lower priority while a higher one is active is therefore started by the
//! engine's launch command, one at a time, as without queueing ahead.

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

    /// A priority above `priority` started a launch within [`ACTIVE_FOR`] of `now`.
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

//! The core's share of the clients' cadence windows (`crate::spin`, issue
//! 35): a request from a client whose reader learned a window keeps the core
//! polling that long after it, and the device process polling too while any
//! such window lasts, so that a client launching every few ms finds neither
//! asleep. Once every window has passed, both go back to their own short
//! windows and then sleep: an idle connection costs nothing.

use std::time::{Duration, Instant};

/// The latest end of a cadence window among the requests the core took.
#[derive(Debug, Default)]
pub(crate) struct CoreCadence {
    until: Option<Instant>,
}

impl CoreCadence {
    /// A request came at `now` from a client whose cadence window is `window`.
    pub(crate) fn on_request(&mut self, window: Duration, now: Instant) {
        if window.is_zero() {
            return;
        }
        let end = now + window;
        if self.until.is_none_or(|u| u < end) {
            self.until = Some(end);
        }
    }

    /// Whether a window is still open at `now` (forgotten once it is not).
    pub(crate) fn awake(&mut self, now: Instant) -> bool {
        match self.until {
            Some(u) if now < u => true,
            Some(_) => {
                self.until = None;
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_latest_window_holds_and_none_is_left_after_it() {
        let t0 = Instant::now();
        let mut c = CoreCadence::default();
        assert!(!c.awake(t0));
        c.on_request(Duration::ZERO, t0);
        assert!(!c.awake(t0), "a client with no cadence opens nothing");
        c.on_request(Duration::from_millis(3), t0);
        c.on_request(Duration::from_millis(1), t0 + Duration::from_millis(1));
        assert!(c.awake(t0 + Duration::from_micros(2_900)), "the longer window holds");
        assert!(!c.awake(t0 + Duration::from_millis(3)));
        assert!(!c.awake(t0 + Duration::from_micros(100)), "forgotten once passed");
    }
}

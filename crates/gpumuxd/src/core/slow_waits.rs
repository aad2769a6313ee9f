//! Requests that waited long for the core, summed up once a second.
//!
//! A line per request was the first design. Under load every queued request
//! waits: a daemon serving 8 clients that launch as fast as they can wrote
//! 40,848 such lines in a two-second run of `gpumux bench daemon --only
//! overhead` on the simulated GPU, each formatted and written by the core,
//! the very thread the requests were waiting for. One line a second says the
//! same: how many waited, and the longest wait.

use std::time::{Duration, Instant};

/// How often a summary line is written while requests keep waiting.
pub(super) const EVERY: Duration = Duration::from_secs(1);

/// The waits noted since the last summary.
#[derive(Debug, Default)]
pub(super) struct SlowWaits {
    count: u64,
    longest: Duration,
    longest_client: u64,
    /// When the first wait of this window was noted.
    since: Option<Instant>,
}

impl SlowWaits {
    /// A request of `client` waited `waited` for the core (the caller
    /// decides what counts as long).
    pub(super) fn note(&mut self, client: u64, waited: Duration, now: Instant) {
        self.since.get_or_insert(now);
        self.count += 1;
        if waited > self.longest {
            self.longest = waited;
            self.longest_client = client;
        }
    }

    /// The summary of the window, once [`EVERY`] has passed since its first
    /// wait (`force`: now, e.g. when the core stops); `None` if none waited.
    pub(super) fn due(&mut self, now: Instant, force: bool) -> Option<String> {
        let since = self.since?;
        let span = now.saturating_duration_since(since);
        if span < EVERY && !force {
            return None;
        }
        let line = format!(
            "{} request(s) waited over {} µs for the core in {:.1} s, the longest {:.0} µs (client {}): \
             the core was busy (docs/daemon.md, \"Where the core's and the device process's time goes\")",
            self.count,
            super::SLOW_ROUND.as_micros(),
            span.as_secs_f64(),
            self.longest.as_secs_f64() * 1e6,
            self.longest_client
        );
        *self = SlowWaits::default();
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_summed_up_once_a_second_with_the_longest() {
        let t0 = Instant::now();
        let mut w = SlowWaits::default();
        assert!(w.due(t0, true).is_none(), "nothing waited: nothing to say, even when forced");
        w.note(3, Duration::from_micros(700), t0);
        w.note(5, Duration::from_micros(2_500), t0 + Duration::from_millis(10));
        w.note(3, Duration::from_micros(900), t0 + Duration::from_millis(20));
        assert!(w.due(t0 + Duration::from_millis(999), false).is_none(), "not a second yet");
        let line = w.due(t0 + EVERY, false).expect("a second after the first wait");
        assert!(
            line.starts_with("3 request(s) waited over 500 µs for the core in 1.0 s, the longest 2500 µs (client 5)"),
            "{line}"
        );
        assert!(w.due(t0 + 3 * EVERY, false).is_none(), "the window starts again empty");
        w.note(7, Duration::from_micros(600), t0 + 3 * EVERY);
        let line = w.due(t0 + 3 * EVERY, true).expect("forced");
        assert!(
            line.starts_with("1 request(s) waited over 500 µs for the core in 0.0 s, the longest 600 µs (client 7)"),
            "{line}"
        );
    }
}

//! Where the core's device rounds go (issue 35): how many rounds its pumps
//! took, and per round the engine's time on the device's events (with how
//! many), on its commands (the policy's turns), and the completions sent
//! back to the clients. The device calls themselves are the load line's
//! `device sends` and `device polls`, and a device process's exchanges are
//! split by `backend::exchange_clock`. Sums only, printed with the core's
//! load line at stop and in its laps.

use std::fmt::Write;
use std::time::Duration;

/// Sums since the core began (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RoundTally {
    /// Pumps that did something (an event, a command or a request).
    pub(crate) pumps: u64,
    /// Their rounds (command/event exchanges with the device).
    pub(crate) rounds: u64,
    /// Events the engine took, and its time on them.
    pub(crate) events: u64,
    pub(crate) events_engine: Duration,
    /// Commands the engine gave, and its time giving them (its policy's turns).
    pub(crate) commands: u64,
    pub(crate) commands_engine: Duration,
    /// Launch commands answered in the turn that made them, from ends the
    /// device reported ahead (`Core::drain_commands`).
    pub(crate) answered_in_turn: u64,
    /// Client requests a pump took between its rounds and turns, not
    /// during a poll (`Core::take_requests`).
    pub(crate) requests_between: u64,
    /// Time completing operations (`drain_completions`: replies, counters).
    pub(crate) completions: Duration,
}

impl RoundTally {
    fn minus(&self, o: &RoundTally) -> RoundTally {
        RoundTally {
            pumps: self.pumps - o.pumps,
            rounds: self.rounds - o.rounds,
            events: self.events - o.events,
            events_engine: self.events_engine.saturating_sub(o.events_engine),
            commands: self.commands - o.commands,
            commands_engine: self.commands_engine.saturating_sub(o.commands_engine),
            answered_in_turn: self.answered_in_turn - o.answered_in_turn,
            requests_between: self.requests_between - o.requests_between,
            completions: self.completions.saturating_sub(o.completions),
        }
    }

    fn words(&self) -> Option<String> {
        if self.rounds == 0 {
            return None;
        }
        let per = |d: Duration, n: u64| d.as_secs_f64() * 1e6 / n.max(1) as f64;
        let mut s = format!(
            "{} device rounds in {} pumps; per round: engine on events {:.2} µs ({:.1} events), engine's \
             commands {:.2} µs ({:.2} commands), completions {:.2} µs",
            self.rounds,
            self.pumps,
            per(self.events_engine, self.rounds),
            self.events as f64 / self.rounds as f64,
            per(self.commands_engine, self.rounds),
            self.commands as f64 / self.rounds as f64,
            per(self.completions, self.rounds),
        );
        if self.answered_in_turn > 0 {
            let _ = write!(s, "; {} launches answered in the turn that made them", self.answered_in_turn);
        }
        if self.requests_between > 0 {
            let _ = write!(s, "; {} requests taken between rounds", self.requests_between);
        }
        Some(s)
    }
}

/// The core's round sums, and the last lap's.
#[derive(Debug, Default)]
pub(crate) struct RoundClock {
    pub(crate) total: RoundTally,
    at_lap: RoundTally,
}

impl RoundClock {
    /// Everything so far, in words.
    pub(crate) fn summary(&self) -> Option<String> {
        self.total.words()
    }

    /// Since the last lap, in words, and a new lap.
    pub(crate) fn lap(&mut self) -> Option<String> {
        let words = self.total.minus(&self.at_lap).words();
        self.at_lap = self.total;
        words
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_round_means_and_laps() {
        let mut c = RoundClock::default();
        assert!(c.summary().is_none());
        c.total.pumps = 2;
        c.total.rounds = 4;
        c.total.events = 10;
        c.total.events_engine = Duration::from_micros(8);
        c.total.commands = 4;
        c.total.commands_engine = Duration::from_micros(12);
        c.total.completions = Duration::from_micros(2);
        let s = c.lap().expect("rounds counted");
        assert!(s.starts_with("4 device rounds in 2 pumps"), "{s}");
        assert!(s.contains("engine on events 2.00 µs (2.5 events)"), "{s}");
        assert!(s.contains("commands 3.00 µs (1.00 commands), completions 0.50 µs"), "{s}");
        assert!(c.lap().is_none(), "nothing since the lap");
        c.total.rounds += 1;
        c.total.answered_in_turn = 3;
        c.total.requests_between = 5;
        let s = c.lap().expect("one more round");
        assert!(s.starts_with("1 device rounds in 0 pumps") && s.contains("3 launches answered"), "{s}");
        assert!(s.ends_with("; 5 requests taken between rounds"), "{s}");
    }
}

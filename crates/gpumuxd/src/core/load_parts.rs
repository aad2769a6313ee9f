//! The parts of the core's time its load clock ([`crate::load`]) counts, and
//! the timing of the engine and device calls made anywhere in the core
//! ([`CallTimes`]), so that the time of each part is counted once.

use crate::load::LoadClock;
use std::cell::Cell;
use std::time::Duration;

/// What the core's load clock counts ([`crate::load`]), parts that do not
/// overlap: client messages (without the engine and the device sends made
/// while handling them); the engine, wherever the core calls it; messages
/// sent to the device (binds, commands, unbinds: a write into the device
/// process's ring); polls of the device (a round trip to the device process,
/// which first carries out the commands sent before it); frames to clients
/// (replies and events: a write into the client's ring, a doorbell if it
/// sleeps, or a hand-off to its writer thread); and the rest of the device
/// exchanges (completions, bookkeeping). Exchanges that brought no event and
/// sent no command are the core waiting, not counted.
pub(super) const LOAD_PARTS: [&str; 6] =
    ["messages", "engine", "device sends", "device polls", "client frames", "exchanges' rest"];
pub(super) const LOAD_MESSAGES: usize = 0;
const LOAD_ENGINE: usize = 1;
const LOAD_SENDS: usize = 2;
const LOAD_POLLS: usize = 3;
const LOAD_FRAMES: usize = 4;
pub(super) const LOAD_EXCHANGES: usize = 5;

/// Time the core spent in the engine and in device calls since it last
/// looked, counted where the calls are made (the load clock's finer parts).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct CallTimes {
    /// Client requests handled while a poll's answer was on its way (their
    /// own time, without the calls above made in them).
    pub(super) messages: (u64, Duration),
    pub(super) engine: (u64, Duration),
    pub(super) sends: (u64, Duration),
    pub(super) polls: (u64, Duration),
    pub(super) frames: (u64, Duration),
}

impl CallTimes {
    pub(super) fn all(&self) -> Duration {
        self.messages.1 + self.engine.1 + self.sends.1 + self.polls.1 + self.frames.1
    }
    /// Adds the calls to `load`, with `rest` (its count and time, less the calls) as `part`.
    pub(super) fn add_to(&self, load: &mut LoadClock, part: usize, count: u64, took: Duration) {
        load.add(part, count, took.saturating_sub(self.all()));
        load.add(LOAD_MESSAGES, self.messages.0, self.messages.1);
        load.add(LOAD_ENGINE, self.engine.0, self.engine.1);
        load.add(LOAD_SENDS, self.sends.0, self.sends.1);
        load.add(LOAD_POLLS, self.polls.0, self.polls.1);
        load.add(LOAD_FRAMES, self.frames.0, self.frames.1);
    }
}

/// Counts one call of `took` into the slot `which` picks.
pub(super) fn count_call(calls: &Cell<CallTimes>, which: fn(&mut CallTimes) -> &mut (u64, Duration), took: Duration) {
    let mut c = calls.get();
    let slot = which(&mut c);
    slot.0 += 1;
    slot.1 += took;
    calls.set(c);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_part_is_counted_once_the_calls_apart_from_what_made_them() {
        let calls = Cell::new(CallTimes::default());
        count_call(&calls, |c| &mut c.engine, Duration::from_micros(3));
        count_call(&calls, |c| &mut c.sends, Duration::from_micros(1));
        count_call(&calls, |c| &mut c.sends, Duration::from_micros(1));
        let mut load = LoadClock::new(&LOAD_PARTS);
        // One message that took 10 µs in all, 5 of them in those calls.
        calls.take().add_to(&mut load, LOAD_MESSAGES, 1, Duration::from_micros(10));
        let s = load.summary().expect("something was counted");
        assert!(s.contains("1 messages: ") && s.contains("%, 5.00 µs each; 1 engine: "), "{s}");
        assert!(s.contains("%, 3.00 µs each; 2 device sends: ") && s.contains("%, 1.00 µs each"), "{s}");
        assert!(!s.contains("device polls") && !s.contains("client frames"), "parts with no count are left out: {s}");
        assert_eq!(calls.get().all(), Duration::ZERO, "taken: the next turn starts from zero");
    }
}

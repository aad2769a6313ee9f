//! Where an exchange with the device process goes (issue 35): the core's
//! sends by kind, and for each poll answered by the device process, the
//! wait split into its parts, on one clock both processes read
//! (`CLOCK_MONOTONIC`, which `Instant` reads too).
//!
//! A poll's wait, from the core's `Poll` written to its answer read:
//! * *busy*: the device process was still carrying out messages sent before
//!   the `Poll` (binds, commands, unbinds), after the `Poll` was written;
//! * *to device*: from then (or from the write) until it took the `Poll`
//!   off the link (a ring read, or a wake-up if it slept);
//! * *device poll*: its device's `poll`;
//! * *answer*: the rest of its work on the answer (the ends seen ahead, the
//!   other reports, encoding);
//! * *back*: from its answer written until the core read it (the core may
//!   be in a client's request then, [`crate::core`]'s requests during a poll).
//!
//! The device process also says how long each kind of message took it
//! since its last answer ([`HostTimes::work`]). Sums only: a few clock
//! reads per message, nothing per event.

use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// The device process's kinds of message (its load clock's parts too).
pub const HOST_PARTS: [&str; 9] = [
    "launch commands",
    "answered launches",
    "other commands",
    "polls",
    "binds",
    "unbinds",
    "other messages",
    "looks between messages",
    "retired launches",
];
/// [`HOST_PARTS`]: a launch command the device carries out.
pub const HOST_LAUNCHES: usize = 0;
/// [`HOST_PARTS`]: a launch command the daemon answered from an end seen ahead.
pub const HOST_ANSWERED: usize = 1;
/// [`HOST_PARTS`]: grows, retreats, copies.
pub const HOST_COMMANDS: usize = 2;
/// [`HOST_PARTS`]: polls.
pub const HOST_POLLS: usize = 3;
/// [`HOST_PARTS`]: binds.
pub const HOST_BINDS: usize = 4;
/// [`HOST_PARTS`]: unbinds.
pub const HOST_UNBINDS: usize = 5;
/// [`HOST_PARTS`]: the rest.
pub const HOST_OTHER: usize = 6;
/// [`HOST_PARTS`]: not a message: a look between messages that saw a run's
/// ends or let a run go on (`GPUMUX_DEEPEN_BETWEEN`, [`crate::device_host`]).
pub const HOST_LOOKS: usize = 7;
/// [`HOST_PARTS`]: an answered launch and its unbind as one message
/// (unless `GPUMUX_RETIRE_ANSWERED=0`, [`super::wire::ToDevice::Retire`]).
pub const HOST_RETIRED: usize = 8;

/// The core's kinds of message sent to the device process.
pub const SEND_PARTS: [&str; 8] =
    ["binds", "launches", "answered launches", "other commands", "unbinds", "polls", "other", "retired launches"];
/// [`SEND_PARTS`] indices.
pub const SEND_BINDS: usize = 0;
/// See [`SEND_PARTS`].
pub const SEND_LAUNCHES: usize = 1;
/// See [`SEND_PARTS`].
pub const SEND_ANSWERED: usize = 2;
/// See [`SEND_PARTS`].
pub const SEND_COMMANDS: usize = 3;
/// See [`SEND_PARTS`].
pub const SEND_UNBINDS: usize = 4;
/// See [`SEND_PARTS`].
pub const SEND_POLLS: usize = 5;
/// See [`SEND_PARTS`].
pub const SEND_OTHER: usize = 6;
/// See [`SEND_PARTS`]: an answered launch and its unbind as one message
/// ([`super::wire::ToDevice::Retire`]).
pub const SEND_RETIRED: usize = 7;

/// `CLOCK_MONOTONIC` in ns: the same clock in the daemon and its device process.
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// How many of one kind, and their time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    /// How many.
    pub count: u64,
    /// Their time in all, ns.
    pub ns: u64,
}

impl Work {
    /// One more, of `ns`.
    pub fn add(&mut self, ns: u64) {
        self.count += 1;
        self.ns += ns;
    }

    fn minus(self, o: Work) -> Work {
        Work { count: self.count.saturating_sub(o.count), ns: self.ns.saturating_sub(o.ns) }
    }

    fn plus(&mut self, o: Work) {
        self.count += o.count;
        self.ns += o.ns;
    }
}

/// The device process's account of one poll it answered, sent with the
/// answer ([`super::wire::FromDevice::Polled`]); times on [`mono_ns`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostTimes {
    /// When it took the `Poll` off the link.
    pub poll_read: u64,
    /// When it had finished the message before the `Poll`.
    pub busy_until: u64,
    /// When its answer was ready to be written.
    pub answered: u64,
    /// Its device's `poll`, ns.
    pub device_poll_ns: u64,
    /// Times it slept on its socket (a doorbell woke it) since its last answer.
    pub sleeps: u64,
    /// The messages it carried out since its last answer, by [`HOST_PARTS`]
    /// (the poll itself not yet among them).
    pub work: [Work; HOST_PARTS.len()],
}

/// Sums of the parts (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    sends: [Work; SEND_PARTS.len()],
    /// Polls answered by the device process: count and the core's whole wait.
    exchanges: Work,
    busy_ns: u64,
    to_device_ns: u64,
    device_poll_ns: u64,
    answer_ns: u64,
    back_ns: u64,
    /// Polls answered without the device process (ends known ahead).
    local_polls: u64,
    host: [Work; HOST_PARTS.len()],
    host_sleeps: u64,
}

impl Tally {
    fn minus(&self, o: &Tally) -> Tally {
        let mut t = *self;
        for (a, b) in t.sends.iter_mut().zip(o.sends) {
            *a = a.minus(b);
        }
        for (a, b) in t.host.iter_mut().zip(o.host) {
            *a = a.minus(b);
        }
        t.exchanges = self.exchanges.minus(o.exchanges);
        t.busy_ns = self.busy_ns.saturating_sub(o.busy_ns);
        t.to_device_ns = self.to_device_ns.saturating_sub(o.to_device_ns);
        t.device_poll_ns = self.device_poll_ns.saturating_sub(o.device_poll_ns);
        t.answer_ns = self.answer_ns.saturating_sub(o.answer_ns);
        t.back_ns = self.back_ns.saturating_sub(o.back_ns);
        t.local_polls = self.local_polls.saturating_sub(o.local_polls);
        t.host_sleeps = self.host_sleeps.saturating_sub(o.host_sleeps);
        t
    }

    fn words(&self) -> Option<String> {
        if self.exchanges.count == 0 && self.local_polls == 0 && self.sends.iter().all(|w| w.count == 0) {
            return None;
        }
        let us = |ns: u64, n: u64| ns as f64 / 1e3 / n.max(1) as f64;
        let n = self.exchanges.count;
        let mut s = format!(
            "{n} exchanges, {} polls answered from known ends; an exchange waited {:.2} µs: device busy with \
             earlier messages {:.2}, to the device {:.2}, its device poll {:.2}, its answer {:.2}, back {:.2}",
            self.local_polls,
            us(self.exchanges.ns, n),
            us(self.busy_ns, n),
            us(self.to_device_ns, n),
            us(self.device_poll_ns, n),
            us(self.answer_ns, n),
            us(self.back_ns, n),
        );
        s.push_str("; sent");
        for (name, w) in SEND_PARTS.iter().zip(self.sends).filter(|(_, w)| w.count > 0) {
            let _ = write!(s, " {} {name} {:.2} µs", w.count, us(w.ns, w.count));
        }
        let _ = write!(s, "; the device process (slept {} times)", self.host_sleeps);
        for (name, w) in HOST_PARTS.iter().zip(self.host).filter(|(_, w)| w.count > 0) {
            let _ = write!(s, " {} {name} {:.2} µs", w.count, us(w.ns, w.count));
        }
        Some(s)
    }
}

/// The daemon's side: sums since the backend opened and since the last lap.
#[derive(Debug, Default)]
pub struct ExchangeClock {
    total: Tally,
    at_lap: Tally,
    /// When the `Poll` awaited went out, and when its answer was read.
    poll_sent: u64,
    answer_read: u64,
}

impl ExchangeClock {
    /// A message of kind `part` ([`SEND_PARTS`]) took `ns` to send.
    pub fn sent(&mut self, part: usize, ns: u64) {
        if let Some(w) = self.total.sends.get_mut(part) {
            w.add(ns);
        }
    }

    /// A `Poll` went out now.
    pub fn poll_sent(&mut self) {
        self.poll_sent = mono_ns();
    }

    /// The answer to the `Poll` was read now.
    pub fn answer_read(&mut self) {
        self.answer_read = mono_ns();
    }

    /// A poll answered here, without the device process.
    pub fn local_poll(&mut self) {
        self.total.local_polls += 1;
    }

    /// The device process's account of the poll just answered: the wait
    /// between [`ExchangeClock::poll_sent`] and [`ExchangeClock::answer_read`] split.
    pub fn exchanged(&mut self, h: &HostTimes) {
        let (sent, read) = (self.poll_sent, self.answer_read.max(self.poll_sent));
        let t = &mut self.total;
        t.exchanges.add(read - sent);
        // The device's stamps, kept within the core's window (one clock, but
        // a stamp of a device process that lies is no reason to underflow).
        let poll_read = h.poll_read.clamp(sent, read);
        let busy_until = h.busy_until.clamp(sent, poll_read);
        let answered = h.answered.clamp(poll_read, read);
        t.busy_ns += busy_until - sent;
        t.to_device_ns += poll_read - busy_until;
        let device_poll = h.device_poll_ns.min(answered - poll_read);
        t.device_poll_ns += device_poll;
        t.answer_ns += answered - poll_read - device_poll;
        t.back_ns += read - answered;
        for (a, b) in t.host.iter_mut().zip(h.work) {
            a.plus(b);
        }
        t.host_sleeps += h.sleeps;
    }

    /// Everything since the backend opened, in words (`None`: nothing happened).
    pub fn summary(&self) -> Option<String> {
        self.total.words()
    }

    /// Since the last lap, in words, and a new lap.
    pub fn lap(&mut self) -> Option<String> {
        let words = self.total.minus(&self.at_lap).words();
        self.at_lap = self.total;
        words
    }
}

/// The device process's side: what it did since its last answer.
#[derive(Debug, Default)]
pub struct HostClock {
    work: [Work; HOST_PARTS.len()],
    sleeps: u64,
    busy_until: u64,
}

impl HostClock {
    /// A message of kind `part` ([`HOST_PARTS`]) ran from `began` to `ended` ([`mono_ns`]).
    pub fn did(&mut self, part: usize, began: u64, ended: u64) {
        if let Some(w) = self.work.get_mut(part) {
            w.add(ended.saturating_sub(began));
        }
        self.busy_until = ended;
    }

    /// It slept on its socket.
    pub fn slept(&mut self) {
        self.sleeps += 1;
    }

    /// The account of the poll read at `poll_read`, its device's poll having
    /// taken `device_poll_ns`, its answer ready now; a fresh one starts.
    pub fn answer(&mut self, poll_read: u64, device_poll_ns: u64) -> HostTimes {
        let t = HostTimes {
            poll_read,
            busy_until: self.busy_until.min(poll_read),
            answered: mono_ns(),
            device_poll_ns,
            sleeps: self.sleeps,
            work: self.work,
        };
        self.work = Default::default();
        self.sleeps = 0;
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_polls_wait_is_split_into_parts_that_add_up_to_it() {
        let mut c = ExchangeClock::default();
        c.sent(SEND_LAUNCHES, 1_000);
        c.sent(SEND_LAUNCHES, 3_000);
        c.poll_sent = 10_000;
        c.answer_read = 30_000;
        let mut work = [Work::default(); HOST_PARTS.len()];
        work[HOST_LAUNCHES] = Work { count: 2, ns: 6_000 };
        // Busy until 14 µs, the poll read at 15, its device poll 4 µs, answered at 22.
        let h = HostTimes {
            poll_read: 15_000,
            busy_until: 14_000,
            answered: 22_000,
            device_poll_ns: 4_000,
            sleeps: 1,
            work,
        };
        c.exchanged(&h);
        c.local_poll();
        let t = c.total;
        assert_eq!(t.exchanges, Work { count: 1, ns: 20_000 });
        assert_eq!(
            (t.busy_ns, t.to_device_ns, t.device_poll_ns, t.answer_ns, t.back_ns),
            (4_000, 1_000, 4_000, 3_000, 8_000)
        );
        assert_eq!(t.busy_ns + t.to_device_ns + t.device_poll_ns + t.answer_ns + t.back_ns, t.exchanges.ns);
        let s = c.lap().expect("something happened");
        assert!(s.contains("1 exchanges, 1 polls answered from known ends"), "{s}");
        assert!(s.contains("waited 20.00 µs") && s.contains("back 8.00"), "{s}");
        assert!(s.contains("2 launches 2.00 µs") && s.contains("2 launch commands 3.00 µs"), "{s}");
        assert!(s.contains("slept 1 times"), "{s}");
        assert!(c.lap().is_none(), "a fresh lap has nothing yet");
        assert!(c.summary().is_some_and(|s| s.contains("1 exchanges")), "the totals stay");
    }

    #[test]
    fn stamps_outside_the_cores_window_do_not_underflow() {
        let mut c = ExchangeClock { poll_sent: 10_000, answer_read: 12_000, ..Default::default() };
        // A device that was idle long before the poll, and stamps past the answer.
        let h = HostTimes {
            poll_read: 50_000,
            busy_until: 1_000,
            answered: 60_000,
            device_poll_ns: 9_000,
            ..Default::default()
        };
        c.exchanged(&h);
        let t = c.total;
        assert_eq!(t.busy_ns + t.to_device_ns + t.device_poll_ns + t.answer_ns + t.back_ns, 2_000);
    }

    #[test]
    fn the_device_process_says_what_it_did_since_its_last_answer() {
        let mut h = HostClock::default();
        h.did(HOST_BINDS, 100, 400);
        h.did(HOST_ANSWERED, 400, 1_400);
        h.slept();
        let t = h.answer(2_000, 500);
        assert_eq!(t.work[HOST_BINDS], Work { count: 1, ns: 300 });
        assert_eq!(t.work[HOST_ANSWERED], Work { count: 1, ns: 1_000 });
        assert_eq!((t.busy_until, t.sleeps, t.device_poll_ns), (1_400, 1, 500));
        let next = h.answer(3_000, 0);
        assert_eq!(next.work, [Work::default(); HOST_PARTS.len()], "a fresh account after each answer");
        assert_eq!(next.sleeps, 0);
    }
}

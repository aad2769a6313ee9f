//! Held polls in the device process ([`crate::backend::wire::ToDevice::PollHeld`];
//! docs/daemon.md, "Held polls"): when a hold goes on, and where its time went.
//!
//! A poll of a busy device used to be answered at once, empty, and the
//! daemon's core asked again a poll period (5 µs) and a round trip later, so
//! a short kernel's end waited for both. A held poll polls the device until
//! news, so the end goes back the moment the device sees it. The hold stops
//! where waiting cannot bring news ([`keep_holding`]), so it never spins on
//! an idle device or past the device's own next wake.
//!
//! **Pace.** A device poll may take the driver's lock (a copy's end event is
//! queried at each poll), which the launcher thread's next `cuLaunchKernel`
//! waits for. So the device is polled back to back only within
//! [`TIGHT_AFTER_SUBMIT`] of the last command (a kernel just launched, whose
//! end is what a waiting client wants soon); later in a hold it is polled
//! every [`PACE`], the core's old poll period, while the link is watched
//! all along.
//!
//! **A run's ends, watched** (issue 35). Where the device can say whether a
//! kernel it ran ahead has ended without a poll's work (the CUDA device: a
//! word its kernels publish in host memory; `Backend::run_end_landed`), the
//! hold reads that instead: it polls the device the moment an end landed,
//! and otherwise only every [`PACE`], not back to back. On the H200 a run's
//! next burst was queued ~33 µs (p50) after the last launch command, the
//! moment the back-to-back polls after it stopped, though its kernels had
//! ended long before (the stage stamps of the programs bench's chain:
//! docs/program-speed.md, "What the stage stamps showed"): polls made back to
//! back did not see ends that a poll 5 µs later saw. [`poll_due_watching`].

use crate::backend::Wake;
use std::fmt::Write as _;

/// How long after a command the device is polled back to back in a hold
/// (module doc): above an empty or short kernel's launch call to its end on
/// the GPU (3-10 µs on the H200).
pub const TIGHT_AFTER_SUBMIT: u64 = 30_000;

/// How often the device is polled in a hold past [`TIGHT_AFTER_SUBMIT`], ns:
/// as often as the core polled it before held polls (`--poll-us`'s default).
pub const PACE: u64 = 5_000;

/// Whether the device is polled at `now` in a hold, its last poll at
/// `polled` and the last command handled at `submitted` (module doc, "Pace").
pub fn poll_due(now: u64, polled: u64, submitted: u64) -> bool {
    now < submitted.saturating_add(TIGHT_AFTER_SUBMIT) || now >= polled.saturating_add(PACE)
}

/// [`poll_due`] for a device that watches a run's ends (module doc, "A
/// run's ends, watched"): `landed` is `Backend::run_end_landed`. An end
/// landed: due at once (at most every [`LANDED_GAP`], should the poll not
/// take it); none: due every [`PACE`] only; nothing watched: [`poll_due`].
pub fn poll_due_watching(now: u64, polled: u64, submitted: u64, landed: Option<bool>) -> bool {
    match landed {
        Some(true) => now >= polled.saturating_add(LANDED_GAP),
        Some(false) => now >= polled.saturating_add(PACE),
        None => poll_due(now, polled, submitted),
    }
}

/// The least time between two polls of a hold that an end landed calls for
/// (ns): a poll normally takes what landed, and one that cannot (the end of a
/// kernel whose run the device cannot walk yet) must not make the hold poll
/// back to back again.
pub const LANDED_GAP: u64 = 1_000;

/// Why a held poll was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// The device had news (events, ends seen ahead, loads, pins, moves, failures).
    News,
    /// The daemon sent another message: it is answered first.
    Message,
    /// The hold's time ran out with the device still busy.
    Deadline,
    /// The device had nothing due within the hold (idle, or its next wake later).
    NothingDue,
}

/// Whether a held poll goes on at `now` (ns, [`crate::backend::exchange_clock::mono_ns`])
/// with the device's `wake` and the hold ending at `deadline`: only while
/// the device is busy and may have news before the deadline.
pub fn keep_holding(wake: Wake, now: u64, deadline: u64) -> Result<(), Ended> {
    if now >= deadline {
        return Err(Ended::Deadline);
    }
    match wake {
        Wake::Spin => Ok(()),
        Wake::After(d) if now.saturating_add(d.as_nanos() as u64) < deadline => Ok(()),
        Wake::After(_) | Wake::Idle => Err(Ended::NothingDue),
    }
}

/// Counts of held polls by how they ended, and the time held (logged when
/// the device process stops, beside its load line).
#[derive(Debug, Default)]
pub struct HoldClock {
    /// Per [`Ended`] in its order: how many, and ns held in all.
    by: [(u64, u64); 4],
}

impl HoldClock {
    /// A held poll ended `how` after `held_ns` of holding.
    pub fn ended(&mut self, how: Ended, held_ns: u64) {
        let i = how as usize;
        self.by[i].0 += 1;
        self.by[i].1 += held_ns;
    }

    /// One line, or `None` if no poll was held.
    pub fn summary(&self) -> Option<String> {
        let total: u64 = self.by.iter().map(|b| b.0).sum();
        if total == 0 {
            return None;
        }
        let mut line = format!("{total} held polls, by how they ended (count, mean µs held):");
        for (name, (n, ns)) in ["news", "a message", "the deadline", "nothing due"].iter().zip(self.by) {
            let mean = if n == 0 { 0.0 } else { ns as f64 / n as f64 / 1e3 };
            let _ = write!(line, " {name} {n} ({mean:.1})");
        }
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_hold_goes_on_only_while_news_may_come_before_its_deadline() {
        assert_eq!(keep_holding(Wake::Spin, 100, 200), Ok(()));
        assert_eq!(keep_holding(Wake::Spin, 200, 200), Err(Ended::Deadline));
        assert_eq!(keep_holding(Wake::Idle, 100, 200), Err(Ended::NothingDue));
        // A device due in 50 ns is worth waiting for; one due after the deadline is not.
        assert_eq!(keep_holding(Wake::After(Duration::from_nanos(50)), 100, 200), Ok(()));
        assert_eq!(keep_holding(Wake::After(Duration::from_nanos(150)), 100, 200), Err(Ended::NothingDue));
    }

    #[test]
    fn a_hold_polls_back_to_back_just_after_a_command_and_at_its_pace_later() {
        let submitted = 1_000_000;
        // 1 µs after the last poll: due while the command is recent, not later.
        assert!(poll_due(submitted + 10_000, submitted + 9_000, submitted));
        let late = submitted + TIGHT_AFTER_SUBMIT + 10_000;
        assert!(!poll_due(late, late - 1_000, submitted));
        assert!(poll_due(late, late - PACE, submitted));
    }

    #[test]
    fn a_hold_watching_a_run_polls_when_an_end_lands_and_otherwise_at_its_pace() {
        let submitted = 1_000_000;
        // Just after a command, 1 µs after the last poll.
        let (now, polled) = (submitted + 2_000, submitted + 1_000);
        assert!(poll_due(now, polled, submitted), "back to back without a watch");
        assert!(poll_due_watching(now, polled, submitted, None), "nothing watched: as before");
        assert!(!poll_due_watching(now, polled, submitted, Some(false)), "watched, nothing landed: not back to back");
        assert!(poll_due_watching(now, polled, submitted, Some(true)), "an end landed: at once");
        // Nothing landed: at the pace, as late in a hold without a watch.
        assert!(poll_due_watching(polled + PACE, polled, submitted, Some(false)));
        // An end the last poll could not take does not make it poll back to back.
        assert!(!poll_due_watching(polled + LANDED_GAP - 1, polled, submitted, Some(true)));
    }

    #[test]
    fn the_clock_counts_each_way_a_hold_ended() {
        let mut c = HoldClock::default();
        assert_eq!(c.summary(), None);
        c.ended(Ended::News, 3_000);
        c.ended(Ended::News, 5_000);
        c.ended(Ended::Deadline, 50_000);
        let line = c.summary().unwrap_or_default();
        assert!(line.starts_with("3 held polls"), "{line}");
        assert!(line.contains("news 2 (4.0)"), "{line}");
        assert!(line.contains("the deadline 1 (50.0)"), "{line}");
        assert!(line.contains("a message 0 (0.0)"), "{line}");
    }
}

//! How long a thread serving one client keeps polling after its traffic,
//! learned from the gaps between that client's requests (issue 35, "2 ms
//! after the last launch").
//!
//! Each thread on a request's path polls a short default window (100-500 µs)
//! before it sleeps; a client whose requests come 2 ms apart then finds every
//! one of them asleep and pays a wake-up on each (tens of µs in a virtual
//! machine: 205 µs p50 against 28 natively on the H100). Polling for ever is
//! no answer: an idle connection must cost nothing. The rule here: a gap
//! between two requests longer than the default window but at most the cap
//! says the client comes back on that scale, and the window becomes 1.5 times
//! that gap (at most the cap); a gap longer than the cap says it does not,
//! and the window falls back to the default. So a client that launches every
//! 2 ms keeps its path awake (the CPU it costs: its threads polling, yielding
//! the core after their first looks), and one that stops is asleep again one
//! learned window (at most the cap) after its last request.
//!
//! Pure arithmetic on atomics, shared by the daemon's threads of a connection
//! and by the client library's; the callers read their own clocks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The longest window a cadence may ask for: the urgent clients' window, above
/// the gaps of a client that launches every few ms.
pub const CADENCE_CAP: Duration = Duration::from_millis(5);

/// Whether cadences are learned: yes unless `GPUMUX_CADENCE=0` is in the
/// environment (read once; the daemon and the client library each read their
/// own), so that a run can measure the path without them.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPUMUX_CADENCE").map_or(true, |v| v.trim() != "0"))
}

/// One client's cadence (module doc). Times are ns on the caller's clock.
#[derive(Debug, Default)]
pub struct Cadence {
    /// When the last request came (0: none yet).
    last_ns: AtomicU64,
    /// The window learned, in ns (0: the default's).
    window_ns: AtomicU64,
}

impl Cadence {
    /// No request seen: the default window.
    pub const fn new() -> Cadence {
        Cadence { last_ns: AtomicU64::new(0), window_ns: AtomicU64::new(0) }
    }

    /// A request came at `now_ns` (non-decreasing, above 0); `floor` is the
    /// poller's default window (gaps within it are bursts and teach nothing),
    /// `cap` the longest window allowed now. Returns the window learned.
    pub fn note(&self, now_ns: u64, floor: Duration, cap: Duration) -> Duration {
        // One writer per cadence (a connection's reader, or the client's
        // sending thread); readers only look at the window.
        let last = self.last_ns.load(Ordering::Relaxed);
        let learned = self.window_ns.load(Ordering::Relaxed);
        if now_ns < last {
            return Duration::from_nanos(learned);
        }
        self.last_ns.store(now_ns, Ordering::Relaxed);
        if last == 0 {
            return Duration::from_nanos(learned);
        }
        let gap = now_ns - last;
        let (floor, cap) = (floor.as_nanos() as u64, cap.as_nanos() as u64);
        let window = if gap > cap {
            0
        } else if gap > floor {
            (gap.saturating_mul(3) / 2).min(cap)
        } else {
            learned.min(cap)
        };
        self.window_ns.store(window, Ordering::Relaxed);
        Duration::from_nanos(window)
    }

    /// The window learned (zero: the default's).
    pub fn window(&self) -> Duration {
        Duration::from_nanos(self.window_ns.load(Ordering::Relaxed))
    }

    /// Until when (ns on the caller's clock) the window holds its pollers
    /// awake: the last request plus the window; 0 if none is learned.
    pub fn awake_until(&self) -> u64 {
        match self.window_ns.load(Ordering::Relaxed) {
            0 => 0,
            w => self.last_ns.load(Ordering::Relaxed).saturating_add(w),
        }
    }
}

/// The cap when `regular` clients hold a learned window: [`CADENCE_CAP`] for
/// up to four, shorter beyond (each one's pollers cost CPU while its window
/// lasts), never below `floor`.
pub fn cap_for(regular: usize, floor: Duration) -> Duration {
    const FULL: usize = 4;
    let cap = if regular <= FULL { CADENCE_CAP } else { CADENCE_CAP * FULL as u32 / regular as u32 };
    cap.max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;
    const FLOOR: Duration = Duration::from_micros(100);

    #[test]
    fn a_client_that_comes_back_every_2_ms_keeps_a_window_of_1_5_times_that() {
        let c = Cadence::new();
        assert_eq!(c.note(1_000 * US, FLOOR, CADENCE_CAP), Duration::ZERO, "one request teaches nothing");
        assert_eq!(c.awake_until(), 0);
        // Its sync 30 µs later: a burst, nothing learned.
        assert_eq!(c.note(1_030 * US, FLOOR, CADENCE_CAP), Duration::ZERO);
        // 2 ms later: the window is 3 ms, from that request on.
        assert_eq!(c.note(3_030 * US, FLOOR, CADENCE_CAP), Duration::from_micros(3_000));
        assert_eq!(c.awake_until(), 6_030 * US);
        // The burst after it keeps what was learned.
        assert_eq!(c.note(3_060 * US, FLOOR, CADENCE_CAP), Duration::from_micros(3_000));
        assert_eq!(c.window(), Duration::from_micros(3_000));
    }

    #[test]
    fn the_window_never_passes_the_cap_and_a_long_gap_forgets_it() {
        let c = Cadence::new();
        c.note(10 * US, FLOOR, CADENCE_CAP);
        assert_eq!(c.note(4_010 * US, FLOOR, CADENCE_CAP), CADENCE_CAP, "4 ms × 1.5 is capped at 5 ms");
        let small = Duration::from_micros(500);
        assert_eq!(c.note(4_020 * US, FLOOR, small), small, "a smaller cap cuts a learned window");
        // Gone for 6 ms: above the cap, so no longer regular.
        assert_eq!(c.note(10_020 * US, FLOOR, CADENCE_CAP), Duration::ZERO);
        assert_eq!(c.awake_until(), 0, "asleep after its default window");
        assert_eq!(c.note(10_040 * US, FLOOR, CADENCE_CAP), Duration::ZERO, "a burst does not bring it back");
    }

    #[test]
    fn a_clock_that_goes_back_changes_nothing() {
        let c = Cadence::new();
        c.note(100 * US, FLOOR, CADENCE_CAP);
        c.note(1_100 * US, FLOOR, CADENCE_CAP);
        assert_eq!(c.note(50 * US, FLOOR, CADENCE_CAP), Duration::from_micros(1_500));
    }

    #[test]
    fn many_regular_clients_share_a_shorter_cap() {
        assert_eq!(cap_for(0, FLOOR), CADENCE_CAP);
        assert_eq!(cap_for(4, FLOOR), CADENCE_CAP);
        assert_eq!(cap_for(8, FLOOR), CADENCE_CAP / 2);
        assert_eq!(cap_for(64, FLOOR), Duration::from_micros(312) + Duration::from_nanos(500));
        assert_eq!(cap_for(1_000_000, FLOOR), FLOOR, "never below the default window");
    }
}

//! How long the core lets a device process hold a poll's answer while its
//! device is busy and has no news (docs/daemon.md, "Held polls"; the device
//! process's side: `device_host::hold`).
//!
//! A busy device was polled every `--poll-us` (5 µs) plus a round trip on
//! the link, so a kernel's end waited for the next poll: issue 35 put the
//! launch command → end seen (`run`) at 13.2 µs p50 for an empty kernel on
//! the H200. Held, the poll is answered the moment the device sees the
//! end. The core waits for the answer handling the requests a poll lets
//! through (launches, syncs, events); anything else ends the hold
//! (`Backend::end_hold`), and the hold never outlasts the core's next
//! timer (the policy's slice end, a restore's gate), so nothing the core
//! does is later than a poll period by it.

use super::Core;
use std::time::Duration;

/// The variable that sets the hold in µs, in the daemon's environment;
/// `0` turns held polls off (every poll answered at once, as before).
pub const HOLD_VAR: &str = "GPUMUX_POLL_HOLD_US";

/// The hold unless [`HOLD_VAR`] says otherwise: well above a short kernel's
/// launch-to-end on the GPU (an empty one's end lands 3-10 µs after its
/// launch call), short enough that a message the poll's handling lets
/// through is not what bounds it (those end it at once).
pub const DEFAULT_HOLD: Duration = Duration::from_micros(50);

/// The hold [`HOLD_VAR`] sets (read once), else [`DEFAULT_HOLD`]; a value
/// that is not a number of µs is reported once and the default kept.
pub fn configured() -> Duration {
    static HOLD: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *HOLD.get_or_init(|| match std::env::var(HOLD_VAR) {
        Err(_) => DEFAULT_HOLD,
        Ok(v) => parse(&v).unwrap_or_else(|| {
            tracing::warn!("{HOLD_VAR}={v:?} is not a number of µs; held polls keep {DEFAULT_HOLD:?}");
            DEFAULT_HOLD
        }),
    })
}

/// `v` as µs, at most [`MAX_HOLD`].
fn parse(v: &str) -> Option<Duration> {
    v.trim().parse::<u64>().ok().map(Duration::from_micros).filter(|&d| d <= MAX_HOLD)
}

/// The longest hold: as long as the core handles requests while a poll's
/// answer is on its way (`REQUESTS_DURING_POLL`); past it the core waits
/// for the answer alone, and a launch that came meanwhile, which would have
/// ended the hold, would wait for the hold's end instead.
pub const MAX_HOLD: Duration = super::pump_requests::REQUESTS_DURING_POLL;

/// The hold for a poll starting now, with the core's next timer `timer` from
/// now if any: `hold`, cut to end before the timer (none if the timer is due
/// within a µs).
pub fn hold_before(hold: Duration, timer: Option<Duration>) -> Duration {
    match timer {
        Some(t) if t < Duration::from_micros(1) => Duration::ZERO,
        Some(t) => hold.min(t),
        None => hold,
    }
}

impl Core {
    /// The hold for the poll the pump sends now ([`hold_before`] the engine's
    /// and the swap's next timers).
    pub(super) fn poll_hold(&self) -> Duration {
        let hold = configured();
        if hold.is_zero() {
            return hold;
        }
        hold_before(hold, self.next_timer())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_ends_before_the_cores_next_timer() {
        let hold = Duration::from_micros(50);
        assert_eq!(hold_before(hold, None), hold);
        assert_eq!(hold_before(hold, Some(Duration::from_micros(20))), Duration::from_micros(20));
        assert_eq!(hold_before(hold, Some(Duration::from_millis(3))), hold);
        assert_eq!(hold_before(hold, Some(Duration::from_nanos(300))), Duration::ZERO);
    }

    #[test]
    fn the_variable_takes_microseconds_and_refuses_the_rest() {
        assert_eq!(parse("0"), Some(Duration::ZERO));
        assert_eq!(parse(" 20 "), Some(Duration::from_micros(20)));
        assert_eq!(parse("200"), Some(MAX_HOLD));
        assert_eq!(parse("201"), None);
        assert_eq!(parse("fast"), None);
        assert_eq!(parse("-5"), None);
    }
}

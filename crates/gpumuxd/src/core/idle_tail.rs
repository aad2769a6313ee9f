//! No poll of an idle device at a pump's tail (issue 35, an empty launch +
//! sync's added time).
//!
//! A pump goes round until a round brings nothing: after the round whose
//! poll brought a kernel's end, the next completes the operations (the
//! sync's reply among them), runs the engine, and polls again, though the
//! answer just read said the device is idle and the round sent it nothing.
//! Through a device process that poll is a round trip on the link (the
//! device process first carries out the unbinds sent before it), and a
//! client that got its reply and launched again back to back has its launch
//! taken during that poll (`core/device.rs`, "Requests during a poll") but
//! its command held until the poll's answer is read.
//!
//! So a round after the first that sent nothing to a device whose last
//! answer was [`Wake::Idle`] ends the pump instead of polling. Nothing is
//! lost: a device process's `next_wake` is not `Idle` while a command is
//! unpolled, an end known ahead is unanswered, or its answer asked for
//! another poll; loads, pins and moves under way keep a device's wake off
//! `Idle` (the core's loop does not pump an idle device either); the first
//! round still polls, so a pump after a sleep still notices a device
//! process that died.
//!
//! `GPUMUX_IDLE_TAIL_POLL=1` in the daemon's environment polls as before,
//! for an A/B in one build.

use crate::backend::Wake;

/// The variable; `1` keeps the tail poll.
pub const VAR: &str = "GPUMUX_IDLE_TAIL_POLL";

/// Whether [`VAR`] leaves the tail poll out (read when a core is made).
pub(super) fn skip_from_env() -> bool {
    skip(std::env::var(VAR).ok().as_deref())
}

/// Left out unless the value is `1`.
fn skip(value: Option<&str>) -> bool {
    value.is_none_or(|v| v.trim() != "1")
}

/// Whether a pump's round `round` (1 the first) ends without a poll: the
/// skip `enabled`, a later round, nothing `sent` in it, and the device idle
/// by its last answer (`wake`).
pub(super) fn ends_without_poll(enabled: bool, round: u32, sent: bool, wake: Wake) -> bool {
    enabled && round > 1 && !sent && matches!(wake, Wake::Idle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_one_keeps_the_tail_poll() {
        assert!(skip(None));
        assert!(skip(Some("0")));
        assert!(!skip(Some("1")));
        assert!(!skip(Some(" 1\n")));
    }

    #[test]
    fn only_a_later_round_that_sent_nothing_to_an_idle_device_skips_its_poll() {
        assert!(ends_without_poll(true, 2, false, Wake::Idle));
        assert!(!ends_without_poll(true, 1, false, Wake::Idle), "the first round polls");
        assert!(!ends_without_poll(true, 2, true, Wake::Idle), "commands sent are polled for");
        assert!(!ends_without_poll(true, 2, false, Wake::Spin), "a busy device is polled");
        assert!(!ends_without_poll(true, 2, false, Wake::After(Duration::ZERO)), "a device due now is polled");
        assert!(!ends_without_poll(false, 2, false, Wake::Idle), "switched off");
    }
}

//! Work for an idle device goes out before the core takes its next message
//! (issue 35, an empty launch + sync's added time).
//!
//! The core's loop handles the messages waiting, up to `ROUND_MESSAGES`,
//! before it pumps the device: with many clients, one engine round then
//! serves many launches. For a client's launch + sync that batching puts the
//! sync before the launch command: the client writes the two frames back to
//! back, so the sync is already in the core's channel when the core takes
//! the launch (on one H200, the sync's `reader_read` came before the launch's
//! `core_read`; docs/daemon.md, "Where a launch + sync's time goes"), and its
//! handling (the session's bookkeeping, the engine's submit) delays the
//! launch command that the device waits for. Nothing the sync does is needed
//! before that command.
//!
//! So while the device is idle, a message that leaves the engine with
//! commands due (a launch, a copy) ends the core's taking of messages: the
//! pump sends the commands at once, and the messages behind it are taken
//! while the poll's answer is on its way (`core/device.rs`, "Requests during
//! a poll") or between the pump's rounds, as any that arrive during a pump
//! are. A busy device keeps the batching: its launches wait for a running
//! kernel anyway, and a round that takes many of them is what a device busy
//! with many clients needs.
//!
//! `GPUMUX_LAUNCH_FIRST=0` in the daemon's environment keeps the batching
//! for an idle device too, for an A/B in one build.

use crate::backend::Wake;

/// The variable; `0` turns the early pump off.
pub const VAR: &str = "GPUMUX_LAUNCH_FIRST";

/// Whether [`VAR`] leaves the early pump on (read when a core is made).
pub(super) fn from_env() -> bool {
    on(std::env::var(VAR).ok().as_deref())
}

/// On unless the value is `0`.
fn on(value: Option<&str>) -> bool {
    value.is_none_or(|v| v.trim() != "0")
}

/// Whether the core pumps now rather than take another message: the early
/// pump `enabled`, the device idle before this turn's messages (its
/// `wake_before`), and the engine holding commands for it.
pub(super) fn pump_now(enabled: bool, wake_before: Wake, commands_due: bool) -> bool {
    enabled && matches!(wake_before, Wake::Idle) && commands_due
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn only_zero_turns_it_off() {
        assert!(on(None));
        assert!(on(Some("1")));
        assert!(on(Some("")));
        assert!(!on(Some("0")));
        assert!(!on(Some(" 0 ")));
    }

    #[test]
    fn only_an_idle_device_given_commands_is_pumped_early() {
        assert!(pump_now(true, Wake::Idle, true));
        assert!(!pump_now(true, Wake::Idle, false), "no commands: nothing to send");
        assert!(!pump_now(true, Wake::Spin, true), "a busy device keeps the batching");
        assert!(!pump_now(true, Wake::After(Duration::from_micros(5)), true), "nor one with work due later");
        assert!(!pump_now(false, Wake::Idle, true), "switched off");
    }
}

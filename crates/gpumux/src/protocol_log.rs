//! `GPUMUX_LOG_PROTOCOL=1`: every command and event between the engine and
//! the device of `gpumux run`, on stderr, for debugging a device or a policy.
//! A hook on the driver loop: the engine itself does no I/O.

use gpumux_engine::device::{Command, Event};
use gpumux_engine::driver::DriverHooks;
use gpumux_engine::time::Nanos;

/// Set (to anything) to turn the log on.
pub const ENV: &str = "GPUMUX_LOG_PROTOCOL";

/// Prints each command (`->`) and event (`<-`) with its device time, when on.
#[derive(Clone, Copy, Debug)]
pub struct ProtocolLog {
    on: bool,
}

impl ProtocolLog {
    /// On when [`ENV`] is set.
    pub fn from_env() -> Self {
        ProtocolLog { on: std::env::var_os(ENV).is_some() }
    }
}

impl DriverHooks for ProtocolLog {
    fn on_command(&mut self, now: Nanos, command: &Command) {
        if self.on {
            eprintln!("{now:>14} -> {command:?}");
        }
    }

    fn on_event(&mut self, now: Nanos, event: &Event) {
        if self.on {
            eprintln!("{now:>14} <- {event:?}");
        }
    }
}

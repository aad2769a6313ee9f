//! How long the daemon's threads poll before they sleep (`gpumuxd --spin-us`).
//!
//! Every hop of a request polls for a while after traffic before it blocks
//! (docs/daemon.md, "Latency and the CPU it costs"): a thread that has to be
//! woken instead costs the request a wake-up, tens of µs in a virtual machine
//! (on the H100 machine a launch + sync 2 ms after the last took 193 µs
//! through the daemon against 50 µs back to back, run 45). Each poll has its
//! own default window; `--spin-us` sets them all, so that a client whose
//! requests come at most that far apart finds every thread awake, at the price
//! of those threads keeping a core busy each for that long after its traffic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The window in µs for every poll; 0: each keeps its own default.
static SPIN_US: AtomicU64 = AtomicU64::new(0);

/// Sets every poll's window (0: the defaults again).
pub fn set(us: u64) {
    SPIN_US.store(us, Ordering::Relaxed);
}

/// The window set with [`set`] (0: none).
pub fn get() -> u64 {
    SPIN_US.load(Ordering::Relaxed)
}

/// How long a poll whose own default is `default` polls.
pub fn window(default: Duration) -> Duration {
    match get() {
        0 => default,
        us => Duration::from_micros(us),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_replaces_every_default_and_zero_restores_them() {
        assert_eq!(window(Duration::from_micros(100)), Duration::from_micros(100));
        set(5000);
        assert_eq!(window(Duration::from_micros(100)), Duration::from_millis(5));
        assert_eq!(window(Duration::from_micros(500)), Duration::from_millis(5));
        set(0);
        assert_eq!(window(Duration::from_micros(500)), Duration::from_micros(500));
    }
}

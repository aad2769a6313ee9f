//! How long the daemon's threads poll before they sleep: for urgent clients,
//! and for everyone with `gpumuxd --spin-us`.
//!
//! Every hop of a request polls for a while after traffic before it blocks
//! (docs/daemon.md, "Latency and the CPU it costs"): a thread that has to be
//! woken instead costs the request a wake-up, tens of µs in a virtual machine
//! (on the H100 machine a launch + sync 2 ms after the last took 193 µs
//! through the daemon against 50 µs back to back, run 45). Each poll has its
//! own default window; `--spin-us` sets them all, so that a client whose
//! requests come at most that far apart finds every thread awake, at the price
//! of those threads keeping a core busy each for that long after its traffic.
//!
//! Without `--spin-us`, a client of priority above 0 (an urgent one) gets
//! [`URGENT_WINDOW`] on its own threads (its connection's reader and writer),
//! and the core and the device process poll that long too while such a client
//! is connected: latency is what it asks for, and the CPU it costs is spent
//! only while urgent clients are there (the client library does the same on
//! its side).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long the threads serving an urgent client poll after its traffic: above
/// the gaps between the kernels of a client that launches every few ms.
pub const URGENT_WINDOW: Duration = Duration::from_millis(5);

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

/// [`window`] for a thread that serves urgent work when `urgent`.
pub fn window_for(default: Duration, urgent: bool) -> Duration {
    match get() {
        0 if urgent => default.max(URGENT_WINDOW),
        _ => window(default),
    }
}

/// Whether one connection's client is urgent: set by the core (from its
/// priority), read by the connection's reader and writer threads.
#[derive(Clone, Debug, Default)]
pub struct ConnSpin(Arc<AtomicBool>);

impl ConnSpin {
    /// Marks the client urgent (priority above 0) or not.
    pub fn set_urgent(&self, urgent: bool) {
        self.0.store(urgent, Ordering::Relaxed);
    }
    /// This connection's window for a poll whose own default is `default`.
    pub fn window(&self, default: Duration) -> Duration {
        window_for(default, self.0.load(Ordering::Relaxed))
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
        let urgent = ConnSpin::default();
        urgent.set_urgent(true);
        assert_eq!(urgent.window(Duration::from_micros(100)), Duration::from_millis(5));
        set(0);
        assert_eq!(window(Duration::from_micros(500)), Duration::from_micros(500));
        assert_eq!(urgent.window(Duration::from_micros(100)), URGENT_WINDOW);
        urgent.set_urgent(false);
        assert_eq!(urgent.window(Duration::from_micros(100)), Duration::from_micros(100));
    }
}

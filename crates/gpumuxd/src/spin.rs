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
/// priority), read by the connection's reader and writer threads; and until
/// when its reader polls whatever its window (a copy the client waits for,
/// [`ConnSpin::hold_for`]).
#[derive(Clone, Debug, Default)]
pub struct ConnSpin(Arc<AtomicBool>, Arc<AtomicU64>);

/// Where [`ConnSpin`]'s hold counts from.
fn origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

impl ConnSpin {
    /// Marks the client urgent (priority above 0) or not.
    pub fn set_urgent(&self, urgent: bool) {
        self.0.store(urgent, Ordering::Relaxed);
    }
    /// This connection's window for a poll whose own default is `default`.
    pub fn window(&self, default: Duration) -> Duration {
        window_for(default, self.0.load(Ordering::Relaxed))
    }
    /// Keeps the connection's reader polling for `d` from now (at most
    /// [`URGENT_WINDOW`]): the client waits for a copy that long and sends
    /// its next request right after the reply, which a reader asleep since
    /// the copy's request would take a doorbell and a wake-up to read.
    pub fn hold_for(&self, d: Duration) {
        let until = (origin().elapsed() + d.min(URGENT_WINDOW)).as_nanos() as u64;
        self.1.fetch_max(until, Ordering::Relaxed);
    }
    /// Whether a [`ConnSpin::hold_for`] is still under way.
    pub fn held(&self) -> bool {
        let until = self.1.load(Ordering::Relaxed);
        until != 0 && (origin().elapsed().as_nanos() as u64) < until
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

    #[test]
    fn a_hold_lasts_its_time_and_no_longer_than_the_urgent_window() {
        let spin = ConnSpin::default();
        assert!(!spin.held(), "none at first");
        spin.hold_for(Duration::from_millis(50));
        assert!(spin.held());
        std::thread::sleep(URGENT_WINDOW + Duration::from_millis(2));
        assert!(!spin.held(), "capped at the urgent window");
        spin.hold_for(Duration::from_secs(1));
        spin.hold_for(Duration::from_micros(1));
        assert!(spin.held(), "a shorter hold does not cut a longer one");
    }
}

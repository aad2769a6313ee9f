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
//!
//! **A client's cadence** (issue 35): any client whose requests come back
//! within [`URGENT_WINDOW`] of each other keeps its path awake for 1.5 times
//! its last such gap (at most that window, and shorter when more than four
//! clients hold one: `gpumux_ring::cadence`), learned by its connection's
//! reader ([`ConnSpin::note_request`]); the core and the device process poll
//! that long after its requests too. A client that launches every 2 ms then
//! pays no wake-up on its path; one that stops is slept on again one window
//! after its last request, so an idle connection still costs nothing.

use gpumux_ring::cadence::{cap_for, Cadence};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long the threads serving an urgent client poll after its traffic: above
/// the gaps between the kernels of a client that launches every few ms.
pub const URGENT_WINDOW: Duration = gpumux_ring::cadence::CADENCE_CAP;

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
/// priority), read by the connection's reader and writer threads; until
/// when its reader polls whatever its window (a copy the client waits for,
/// [`ConnSpin::hold_for`]); and the client's cadence, which its reader learns
/// from the gaps between its requests ([`ConnSpin::note_request`]).
#[derive(Clone, Debug, Default)]
pub struct ConnSpin(Arc<SpinState>);

/// What [`ConnSpin`] shares between a connection's threads and the core.
#[derive(Debug, Default)]
pub struct SpinState {
    urgent: AtomicBool,
    hold_until: AtomicU64,
    cadence: Cadence,
    /// Counted in [`REGULAR`] (its cadence holds a learned window).
    regular: AtomicBool,
}

impl Drop for SpinState {
    fn drop(&mut self) {
        if *self.regular.get_mut() {
            REGULAR.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Connections whose cadence holds a learned window now: the more there are,
/// the shorter each one's cap (`gpumux_ring::cadence::cap_for`).
static REGULAR: AtomicUsize = AtomicUsize::new(0);

/// How many connections hold a learned cadence window.
pub fn regular_clients() -> usize {
    REGULAR.load(Ordering::Relaxed)
}

/// Where [`ConnSpin`]'s times count from.
fn origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// Now, in ns after [`origin`] (at least 1: 0 means "none").
fn now_ns() -> u64 {
    origin().elapsed().as_nanos() as u64 + 1
}

impl ConnSpin {
    /// Marks the client urgent (priority above 0) or not.
    pub fn set_urgent(&self, urgent: bool) {
        self.0.urgent.store(urgent, Ordering::Relaxed);
    }
    /// This connection's window for a poll whose own default is `default`.
    pub fn window(&self, default: Duration) -> Duration {
        window_for(default, self.0.urgent.load(Ordering::Relaxed))
    }
    /// Keeps the connection's reader polling for `d` from now (at most
    /// [`URGENT_WINDOW`]): the client waits for a copy that long and sends
    /// its next request right after the reply, which a reader asleep since
    /// the copy's request would take a doorbell and a wake-up to read.
    pub fn hold_for(&self, d: Duration) {
        let until = now_ns() + d.min(URGENT_WINDOW).as_nanos() as u64;
        self.0.hold_until.fetch_max(until, Ordering::Relaxed);
    }
    /// Whether a [`ConnSpin::hold_for`] is still under way, or the window
    /// learned from the client's cadence since its last request. Past that
    /// window the connection no longer counts in `REGULAR`: its reader
    /// asks this before it sleeps, so a client that went idle stops
    /// shortening the others' caps then, not at its next request or its end.
    pub fn held(&self) -> bool {
        self.held_at(now_ns())
    }
    fn held_at(&self, now: u64) -> bool {
        let until = self.0.hold_until.load(Ordering::Relaxed);
        let awake = now < self.0.cadence.awake_until();
        if !awake && self.0.regular.swap(false, Ordering::Relaxed) {
            REGULAR.fetch_sub(1, Ordering::Relaxed);
        }
        (until != 0 && now < until) || awake
    }
    /// A request came (called by the connection's reader for each one): the
    /// cadence learns from its gap to the last (module doc of
    /// `gpumux_ring::cadence`). With `--spin-us` set, every window is that
    /// and nothing is learned; nor with `GPUMUX_CADENCE=0`.
    pub fn note_request(&self) {
        if get() == 0 && gpumux_ring::cadence::enabled() {
            self.note_request_at(now_ns());
        }
    }
    fn note_request_at(&self, now: u64) {
        let cap = cap_for(REGULAR.load(Ordering::Relaxed), CADENCE_FLOOR);
        let learned = !self.0.cadence.note(now, CADENCE_FLOOR, cap).is_zero();
        if self.0.regular.swap(learned, Ordering::Relaxed) != learned {
            if learned {
                REGULAR.fetch_add(1, Ordering::Relaxed);
            } else {
                REGULAR.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
    /// The window learned from the client's cadence (zero: none).
    pub fn cadence_window(&self) -> Duration {
        self.0.cadence.window()
    }
}

/// Gaps between a client's requests up to this are bursts, not a cadence:
/// the daemon's threads poll about this long after traffic anyway (the
/// connection's reader and writer 100 µs).
pub const CADENCE_FLOOR: Duration = Duration::from_micros(100);

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

    #[test]
    fn a_regular_client_holds_its_reader_awake_for_its_window_and_is_counted_until_it_goes() {
        let spin = ConnSpin::default();
        let t0 = now_ns();
        spin.note_request_at(t0);
        assert!(!spin.held(), "one request teaches nothing");
        // Its next request 2 ms later (times given: the test does not sleep 2 ms).
        spin.note_request_at(t0 + 2_000_000);
        assert_eq!(spin.cadence_window(), Duration::from_millis(3));
        assert!(spin.held(), "awake until 3 ms after that request");
        assert!(regular_clients() >= 1, "counted while it holds a window");
        assert!(spin.0.regular.load(Ordering::Relaxed));
        // Gone for longer than the cap: the window is forgotten, the count too.
        spin.note_request_at(t0 + 2_000_000 + 6_000_000);
        assert_eq!(spin.cadence_window(), Duration::ZERO);
        assert!(!spin.0.regular.load(Ordering::Relaxed));
        // Its window over with no request since: it no longer counts once asked.
        spin.note_request_at(t0 + 10_000_000);
        spin.note_request_at(t0 + 12_000_000);
        assert!(spin.0.regular.load(Ordering::Relaxed));
        assert!(spin.held_at(t0 + 12_000_000 + 2_999_999));
        assert!(spin.0.regular.load(Ordering::Relaxed), "counted while its window lasts");
        assert!(!spin.held_at(t0 + 12_000_000 + 3_000_000));
        assert!(!spin.0.regular.load(Ordering::Relaxed), "idle past its window: not counted");
        let again = ConnSpin::default();
        again.note_request_at(t0);
        again.note_request_at(t0 + 1_000_000);
        assert!(again.0.regular.load(Ordering::Relaxed));
        drop(again);
        // A dropped connection no longer counts (others' tests may hold windows: no exact count).
        assert!(regular_clients() < usize::MAX / 2, "no underflow");
    }
}

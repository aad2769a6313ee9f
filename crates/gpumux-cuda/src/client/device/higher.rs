//! Which priorities started launches lately, and which kernels of a lower
//! priority are held from being queued natively ahead while a higher one is
//! active (issue 39).
//!
//! **Why.** Kernels queued natively ahead ([`super::ahead`], "Deep") run on
//! the GPU whatever the engine decides next, and cannot be called back. The
//! engine keeps an urgent client's SMs from a lower level of long blocks
//! while the urgent client is active (`gpumux_engine::policies::reserve`);
//! a run of the lower level's kernels queued natively behind one launch the
//! engine made (before the urgent client came, or before the engine had
//! measured the level's blocks) goes on regardless: on an H200 (the lead's
//! run of f3ec956, `oversubscribe-gpu.sh`, 11.3 % lost) 16 kernels of a
//! neighbour's run, 28 ms each, ran beside 16 of the urgent client's
//! kernels, each of which then took 28 ms instead of 2. Hardware stream
//! priority orders only blocks waiting for a slot, and a neighbour's blocks
//! that took the slots first hold them for their whole run. Such a kernel
//! of a lower priority while a higher one is active is therefore started by
//! the engine's launch command, one at a time, as without queueing ahead.
//!
//! **Which kernels are held** ([`Hold::All`], the default: every kernel;
//! [`Hold::Long`] on request). What an urgent
//! kernel waits for beside a lower priority's native grid is one of that
//! grid's blocks: its own blocks are placed first as slots free (hardware
//! stream priority). A kernel whose blocks are known short costs it as
//! little queued ahead as launched by the engine's command, while holding
//! it back costs the lower priority a round trip through the daemon per
//! kernel (tens of µs: the low-priority client of `bench daemon --only
//! priority`, 2 ms kernels of 20 µs blocks, kept 0.92-0.95 of its rate beside
//! the urgent one after the hold came, 0.969 before). So a kernel is held
//! only unless its shape's blocks are known shorter than [`SHORT_BLOCK_NS`],
//! the bound under which the engine keeps no reserve either (taking such an
//! SM back costs an urgent kernel less than a few launch round trips). A
//! shape's block time is known from its timed launches as workers (the
//! profile cache) or from its native grids the engine's commands started
//! ([`Higher::ran_native`]: the time from the command to the end seen over
//! the grid's waves, which can only overstate it); the latter stands for
//! [`MEASURE_FOR`] (a shape queued ahead is seen by no command, so it is held
//! again for one kernel, measured afresh, now and then). A shape never
//! measured is held: native kernels are never timed as workers, and the
//! 28 ms kernels above were such ones. `GPUMUX_HIGHER_HOLD` ([`HOLD_VAR`])
//! picks [`Hold::Long`] (this rule) or [`Hold::Off`] (none), to A/B on a GPU.
//!
//! **Why every kernel is held by default.** The rule above did not give the
//! lower priority its rate back: on one H200 (2026-11-29, 1ce7bf1, the
//! priority part twice per setting, alternating) the low-priority client kept
//! 0.936 and 0.937 of its rate beside the urgent one at 20 µs blocks with
//! `long`, against 0.947 and 0.949 with `all`, the urgent p99 the same
//! (103-127 µs against 111-121); at 100 and 1000 µs blocks the two were
//! level. The cost of holding is not the round trip per kernel alone.

use crate::launch_plan::ProfileKey;
use gpumux_engine::policies::reserve::{DRAIN_MEMORY, MIN_DRAIN};
use std::time::{Duration, Instant};

/// A priority that started a launch this recently counts as active: longer
/// than an urgent client's gaps between its kernels and rounds (tens of
/// microseconds to a few milliseconds through the daemon).
pub const ACTIVE_FOR: Duration = Duration::from_millis(100);

/// Blocks known shorter than this (ns) are queued natively ahead beside an
/// active higher priority ([`Hold::Long`]): the engine's own bound for
/// keeping no reserve against a level (`policies::reserve::MIN_DRAIN`).
pub const SHORT_BLOCK_NS: f64 = MIN_DRAIN as f64;

/// How long a block time measured from a native grid stands (the engine's
/// `reserve::DRAIN_MEMORY`).
pub const MEASURE_FOR: Duration = Duration::from_nanos(DRAIN_MEMORY);

/// The daemon's environment (its device process inherits it): which kernels
/// of a lower priority are held from being queued natively ahead while a
/// higher priority is active. Unset, `1` or `all`: [`Hold::All`]; `long`:
/// [`Hold::Long`]; `0` or `off`: [`Hold::Off`].
pub const HOLD_VAR: &str = "GPUMUX_HIGHER_HOLD";

/// What [`HOLD_VAR`] asks for (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Hold {
    /// Nothing held: a lower priority queues ahead as if alone.
    Off,
    /// Kernels not known to have short blocks held.
    Long,
    /// Every kernel held (the rule of issue 39 as it landed; the default).
    #[default]
    All,
}

impl Hold {
    /// From [`HOLD_VAR`]'s value (`None`: unset); an unknown value is the
    /// default, with a warning.
    pub fn parse(v: Option<&str>) -> Hold {
        match v.map(str::trim) {
            Some("long") => Hold::Long,
            None | Some("") | Some("1") | Some("all") => Hold::All,
            Some("0") | Some("off") => Hold::Off,
            Some(other) => {
                tracing::warn!("{HOLD_VAR}={other:?} is not all (1), long or off (0): all");
                Hold::All
            }
        }
    }

    /// From the environment.
    pub fn from_env() -> Hold {
        Hold::parse(std::env::var(HOLD_VAR).ok().as_deref())
    }
}

/// A kernel shape's block time as its native grids showed it.
#[derive(Debug)]
struct Measured {
    kernel: String,
    key: ProfileKey,
    block_ns: f64,
    at: Instant,
}

/// The last launch start of each priority (a few priorities), and the
/// block times of the kernel shapes run natively lately.
#[derive(Debug, Default)]
pub struct Higher {
    hold: Hold,
    last: Vec<(i32, Instant)>,
    measured: Vec<Measured>,
}

impl Higher {
    /// Holding kernels as `hold` says.
    pub fn new(hold: Hold) -> Higher {
        Higher { hold, ..Higher::default() }
    }

    /// A launch of `priority` started at `now`.
    pub fn started(&mut self, priority: i32, now: Instant) {
        match self.last.iter_mut().find(|e| e.0 == priority) {
            Some(e) => e.1 = now,
            None => self.last.push((priority, now)),
        }
    }

    /// A priority above `priority` started a launch within [`ACTIVE_FOR`] of `now`.
    pub fn active_above(&self, priority: i32, now: Instant) -> bool {
        self.last.iter().any(|&(p, t)| p > priority && now.saturating_duration_since(t) < ACTIVE_FOR)
    }

    /// A native grid of `kernel` at shape `key`, started by a launch command,
    /// was seen ended at `now` having taken `block_ns` a wave. Up at once to
    /// a longer measure, down by a quarter of the way to a shorter one (the
    /// longest matters, as for the engine's reserves).
    pub fn ran_native(&mut self, kernel: &str, key: ProfileKey, block_ns: f64, now: Instant) {
        if !(block_ns.is_finite() && block_ns > 0.0) {
            return;
        }
        self.measured.retain(|m| now.saturating_duration_since(m.at) < MEASURE_FOR);
        match self.measured.iter_mut().find(|m| m.key == key && m.kernel == kernel) {
            Some(m) => {
                m.block_ns = if block_ns >= m.block_ns { block_ns } else { m.block_ns - (m.block_ns - block_ns) / 4.0 };
                m.at = now;
            }
            None => self.measured.push(Measured { kernel: kernel.to_string(), key, block_ns, at: now }),
        }
    }

    /// The block time of `kernel` at `key` known at `now`: the longer of its
    /// native grids' (within [`MEASURE_FOR`]) and its timed one (`timed`).
    fn block_ns(&self, kernel: &str, key: ProfileKey, timed: Option<f64>, now: Instant) -> Option<f64> {
        let fresh = |m: &&Measured| now.saturating_duration_since(m.at) < MEASURE_FOR;
        let native =
            self.measured.iter().filter(fresh).find(|m| m.key == key && m.kernel == kernel).map(|m| m.block_ns);
        match (native, timed) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// A kernel of `priority`, `kernel` at `key` (`timed`: its profile's
    /// block time, asked only while a higher priority is active), is held
    /// from being queued natively ahead at `now` (module doc).
    pub fn holds(
        &self,
        priority: i32,
        kernel: &str,
        key: ProfileKey,
        timed: impl FnOnce() -> Option<f64>,
        now: Instant,
    ) -> bool {
        match self.hold {
            Hold::Off => false,
            Hold::All => self.active_above(priority, now),
            Hold::Long => {
                self.active_above(priority, now)
                    && !self.block_ns(kernel, key, timed(), now).is_some_and(|ns| ns < SHORT_BLOCK_NS)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: ProfileKey = ProfileKey { block: [256, 1, 1], smem: 0 };

    #[test]
    fn a_higher_priority_counts_as_active_for_a_while_after_its_last_launch() {
        let t0 = Instant::now();
        let mut h = Higher::default();
        assert!(!h.active_above(0, t0));
        h.started(5, t0);
        h.started(0, t0);
        assert!(h.active_above(0, t0 + ACTIVE_FOR / 2), "priority 5 launched lately");
        assert!(!h.active_above(5, t0), "nothing above 5");
        assert!(!h.active_above(0, t0 + ACTIVE_FOR), "idle for the window: no longer active");
        h.started(5, t0 + ACTIVE_FOR);
        assert!(h.active_above(0, t0 + ACTIVE_FOR), "a new launch renews it");
    }

    #[test]
    fn beside_an_active_higher_priority_only_kernels_known_to_have_short_blocks_are_queued_ahead() {
        let t0 = Instant::now();
        let mut h = Higher::new(Hold::Long);
        h.ran_native("spin", KEY, 21_000.0, t0);
        h.ran_native("stride", KEY, 28_000_000.0, t0);
        assert!(!h.holds(0, "spin", KEY, || None, t0), "nothing above priority 0 is active");
        h.started(1, t0);
        assert!(!h.holds(0, "spin", KEY, || None, t0), "20 µs blocks: an urgent kernel waits one of them at most");
        assert!(h.holds(0, "stride", KEY, || None, t0), "28 ms blocks hold the urgent kernel's slots");
        assert!(h.holds(0, "never-run", KEY, || None, t0), "unknown blocks are held");
        assert!(!h.holds(0, "never-run", KEY, || Some(5_000.0), t0), "timed as workers: known short");
        assert!(h.holds(0, "spin", KEY, || Some(SHORT_BLOCK_NS), t0), "the longer of the two measures counts");
        let other = ProfileKey { block: [128, 1, 1], smem: 0 };
        assert!(h.holds(0, "spin", other, || None, t0), "another shape of the kernel is not known");
        assert!(!h.holds(1, "stride", KEY, || None, t0), "nothing above priority 1");
    }

    #[test]
    fn a_longer_measure_counts_at_once_a_shorter_one_slowly_and_old_ones_lapse() {
        let t0 = Instant::now();
        let mut h = Higher::new(Hold::Long);
        h.started(1, t0);
        h.ran_native("k", KEY, 20_000.0, t0);
        h.ran_native("k", KEY, 1_000_000.0, t0);
        assert!(h.holds(0, "k", KEY, || None, t0), "one long grid is enough to hold it");
        h.ran_native("k", KEY, 20_000.0, t0);
        assert!(h.holds(0, "k", KEY, || None, t0), "a quarter of the way down: 755 µs");
        for _ in 0..12 {
            h.ran_native("k", KEY, 20_000.0, t0);
        }
        assert!(!h.holds(0, "k", KEY, || None, t0), "many short grids since");
        let later = t0 + MEASURE_FOR;
        h.started(1, later);
        assert!(h.holds(0, "k", KEY, || None, later), "the measure lapsed: held until a grid measures it again");
        h.ran_native("k", KEY, f64::NAN, later);
        assert!(h.holds(0, "k", KEY, || None, later), "no measure from a bad time");
    }

    #[test]
    fn the_switch_holds_every_kernel_or_none() {
        let t0 = Instant::now();
        for (v, hold) in [(None, Hold::All), (Some("long"), Hold::Long), (Some("1"), Hold::All)] {
            assert_eq!(Hold::parse(v), hold);
        }
        assert_eq!(Hold::parse(Some(" off ")), Hold::Off);
        assert_eq!(Hold::parse(Some("0")), Hold::Off);
        assert_eq!(Hold::parse(Some("maybe")), Hold::All);
        let mut all = Higher::new(Hold::All);
        let mut off = Higher::new(Hold::Off);
        for h in [&mut all, &mut off] {
            h.started(1, t0);
            h.ran_native("spin", KEY, 20_000.0, t0);
        }
        assert!(all.holds(0, "spin", KEY, || None, t0), "all: short blocks held too");
        assert!(!off.holds(0, "never-run", KEY, || None, t0), "off: nothing held");
    }
}

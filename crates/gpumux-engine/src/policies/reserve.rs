//! Reserves: the SMs a higher priority level used lately, kept from the
//! levels below it while taking them back would be slow (issue 39; used by
//! [`super::ppq_even`]).
//!
//! **Why.** PPQ lets lower levels use the SMs a higher level leaves idle
//! and takes them back when it wants them again. Taking back costs one
//! *drain*: the lower level's blocks on those SMs run to their end first.
//! With blocks of microseconds that is nothing; with a grid-stride kernel
//! whose blocks each cover the whole grid's work (one wave of blocks, each
//! tens or hundreds of milliseconds) it is the lower kernel's whole run.
//! An urgent client that syncs between rounds, or whose next kernel comes
//! a daemon round trip after the last one ended, leaves its SMs idle for
//! microseconds; a long-block neighbour takes them, and the urgent
//! client's next kernel waits for the neighbour's blocks. On an H200 that
//! cost an urgent client 31 % of its rate beside one such neighbour
//! (docs/oversubscription.md, "The urgent client").
//!
//! **What.** The policy measures how long taking an SM back from a lower
//! level takes (from its `Preempt` to the SM leaving that kernel), and
//! while that *drain time* is long ([`MIN_DRAIN`]) a process of a higher
//! level holds a **reserve** of the SMs it used at its peak since it last
//! became active (SMs held plus SMs its kernels could still use): lower
//! levels are given no idle SM that would leave its reserve short, while it
//! is active and for one drain time after it goes idle. That is ski rental:
//! keeping the SMs idle for as long as taking them back would cost, then
//! letting them go, costs at most twice the better of the two choices made
//! knowing the future. SMs a lower level already holds are not taken back
//! for a reserve, only when the higher level wants them (PPQ as before).
//!
//! **What it costs.** While the reserve is held the lower levels lose those
//! SMs: an urgent client that uses the whole GPU and is never idle for a
//! drain time leaves them nothing until it is. A drain measured long is
//! remembered for [`DRAIN_MEMORY`]: after that the reserves lapse, a lower
//! level may take the SMs again, and the next take-back measures afresh (one
//! drain's cost at most per [`DRAIN_MEMORY`]), so reserves do not outlive
//! the long blocks that called for them.

use crate::ids::{KernelId, Slot, SmId};
use crate::policy::{SchedView, SmState};
use crate::time::{Nanos, NS_PER_S, NS_PER_US};

/// Drains shorter than this keep no reserve: taking an SM back then costs
/// an urgent kernel less than a few of its own launch round trips through
/// the daemon (30-50 µs), and lower levels keep every idle SM as before.
pub const MIN_DRAIN: Nanos = 200 * NS_PER_US;

/// How long a measured drain time stands with no new measurement.
pub const DRAIN_MEMORY: Nanos = 5 * NS_PER_S;

/// The reserves' state (module doc): drains under way and measured, and the
/// reserves of processes gone idle.
#[derive(Debug, Default)]
pub struct Reserves {
    /// SMs being taken back from a lower level: (SM, the kernel they are
    /// taken from, since when). A few hundred at most (one per SM).
    draining: Vec<(SmId, KernelId, Nanos)>,
    /// The drain time lately: up at once to a longer drain, down by a
    /// quarter of the difference to a shorter one (the longest matters).
    drain_ns: Nanos,
    /// When the last drain was measured.
    measured_at: Nanos,
    /// Processes gone idle holding their reserve: (slot, priority, SMs,
    /// until when), in slot order.
    idle: Vec<(Slot, i32, u32, Nanos)>,
}

impl Reserves {
    /// The drain time lately (0 before any drain was measured).
    pub fn drain_ns(&self) -> Nanos {
        self.drain_ns
    }

    /// Reserves are held at `now`: a drain measured within [`DRAIN_MEMORY`] was long.
    pub fn on(&self, now: Nanos) -> bool {
        self.drain_ns >= MIN_DRAIN && now < self.measured_at.saturating_add(DRAIN_MEMORY)
    }

    /// SM `sm`, running `kernel`, is being taken back from a lower level at `now`.
    pub fn preempted(&mut self, sm: SmId, kernel: KernelId, now: Nanos) {
        self.draining.retain(|e| e.0 != sm);
        self.draining.push((sm, kernel, now));
    }

    /// Measures the drains that ended since the last round: an SM no longer
    /// leaving the kernel it was taken from.
    pub fn observe(&mut self, view: &SchedView<'_>) {
        let now = view.now;
        let mut i = 0;
        while i < self.draining.len() {
            let (sm, kernel, since) = self.draining[i];
            let leaving = matches!(view.sms.get(sm.0 as usize), Some(SmState::Reserved { kernel: k, .. }) if *k == kernel);
            if leaving {
                i += 1;
                continue;
            }
            self.draining.swap_remove(i);
            self.sample(now.saturating_sub(since), now);
        }
    }

    fn sample(&mut self, took: Nanos, now: Nanos) {
        self.drain_ns = if took >= self.drain_ns { took } else { self.drain_ns - (self.drain_ns - took) / 4 };
        self.measured_at = now;
    }

    /// A process of `priority` that used `sms` SMs at its peak went idle at
    /// `now`: it keeps them from lower levels for one drain time.
    pub fn went_idle(&mut self, slot: Slot, priority: i32, sms: u32, now: Nanos) {
        if !self.on(now) || sms == 0 {
            return;
        }
        let entry = (slot, priority, sms, now.saturating_add(self.drain_ns));
        match self.idle.binary_search_by_key(&slot, |e| e.0) {
            Ok(i) => self.idle[i] = entry,
            Err(i) => self.idle.insert(i, entry),
        }
    }

    /// Drops the idle reserves that ended by `now`, those of processes
    /// `active` again, and all of them once reserves are off.
    pub fn expire(&mut self, now: Nanos, active: impl Fn(Slot) -> bool) {
        let on = self.on(now);
        self.idle.retain(|&(slot, _, _, until)| on && until > now && !active(slot));
    }

    /// SMs reserved by idle processes of priority above `level`.
    pub fn idle_above(&self, level: i32) -> u32 {
        self.idle.iter().filter(|e| e.1 > level).map(|e| e.2).sum()
    }

    /// When a reserve lapses (the policy must run then to give its SMs out).
    pub fn wake_at(&self) -> Option<Nanos> {
        let until = self.idle.iter().map(|e| e.3).min()?;
        Some(until.min(self.measured_at.saturating_add(DRAIN_MEMORY)))
    }

    /// The process in `slot` left.
    pub fn removed(&mut self, slot: Slot) {
        self.idle.retain(|e| e.0 != slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NS_PER_MS;

    #[test]
    fn a_long_drain_turns_reserves_on_for_a_while_and_a_short_one_does_not() {
        let mut r = Reserves::default();
        r.sample(50 * NS_PER_US, 0);
        assert!(!r.on(0), "a 50 µs drain keeps no reserve");
        r.sample(40 * NS_PER_MS, NS_PER_MS);
        assert_eq!(r.drain_ns(), 40 * NS_PER_MS, "a longer drain counts at once");
        assert!(r.on(NS_PER_MS + DRAIN_MEMORY - 1));
        assert!(!r.on(NS_PER_MS + DRAIN_MEMORY), "a drain measured long ago lapses");
        r.sample(0, 2 * NS_PER_MS);
        assert_eq!(r.drain_ns(), 30 * NS_PER_MS, "a shorter one pulls it down by a quarter");
    }

    #[test]
    fn an_idle_reserve_lasts_one_drain_time_and_only_against_lower_levels() {
        let mut r = Reserves::default();
        r.went_idle(Slot::new(1, 0), 5, 100, 0);
        assert_eq!(r.idle_above(0), 0, "no drain measured: no reserve");
        r.sample(20 * NS_PER_MS, 0);
        r.went_idle(Slot::new(1, 0), 5, 100, NS_PER_MS);
        assert_eq!((r.idle_above(0), r.idle_above(4), r.idle_above(5)), (100, 100, 0));
        assert_eq!(r.wake_at(), Some(21 * NS_PER_MS));
        r.expire(21 * NS_PER_MS - 1, |_| false);
        assert_eq!(r.idle_above(0), 100);
        r.expire(21 * NS_PER_MS, |_| false);
        assert_eq!(r.idle_above(0), 0, "idle for a drain time: the SMs go");
        r.went_idle(Slot::new(1, 0), 5, 100, 30 * NS_PER_MS);
        r.expire(31 * NS_PER_MS, |s| s == Slot::new(1, 0));
        assert_eq!(r.idle_above(0), 0, "active again: its reserve is its kernels' share, not an idle one");
    }
}

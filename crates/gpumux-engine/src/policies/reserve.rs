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
//! **What.** The policy estimates how long a level's blocks hold an SM,
//! per priority level: from the kernels of that level that end (the time
//! from their launch to their end over their waves of blocks on the SMs
//! they held) and from the SMs taken back from it (the time from the
//! `Preempt` to the SM leaving the kernel). While a level's estimate is long
//! ([`MIN_DRAIN`]), a process of a higher level holds a **reserve** against
//! it: the SMs it used at its peak since it last became active (SMs held
//! plus SMs its kernels could still use). The level is given no idle SM
//! that would leave the reserve short, while the process is active and for
//! one block time of the level after it goes idle. That is ski rental:
//! keeping the SMs idle for as long as taking them back would cost, then
//! letting them go, costs at most twice the better of the two choices made
//! knowing the future. SMs a lower level already holds are not taken back
//! for a reserve, only when the higher level wants them (PPQ as before).
//!
//! Both measures matter: the CUDA device gives a launch's SMs back at its
//! end, so a take-back is a `Preempt` that waits for the blocks; the
//! simulator by default gives an SM back once a kernel's last block there is
//! issued, so a one-wave kernel holds no SM in the engine's eyes while its
//! blocks run, and only its end says how long they ran.
//!
//! **What it costs.** While a reserve is held the levels below lose those
//! SMs: an urgent client that uses the whole GPU and is never idle for a
//! block time leaves them nothing until it is. An estimate stands for
//! [`DRAIN_MEMORY`] after its last measure: then the level's reserves lapse,
//! it may take idle SMs again, and its next kernel's end measures afresh (a
//! block's cost to the urgent client at most once per [`DRAIN_MEMORY`] while
//! the level is held off), so reserves do not outlive the long blocks that
//! called for them.

use crate::ids::{KernelId, Slot, SmId};
use crate::policy::{SchedView, SmState};
use crate::time::{Nanos, NS_PER_S, NS_PER_US};

/// Block times shorter than this keep no reserve: taking an SM back then
/// costs an urgent kernel less than a few of its own launch round trips
/// through the daemon (30-50 µs), and lower levels keep every idle SM as
/// before.
pub const MIN_DRAIN: Nanos = 200 * NS_PER_US;

/// How long a level's estimate stands with no new measure.
pub const DRAIN_MEMORY: Nanos = 5 * NS_PER_S;

/// A kernel seen launched, until it ends.
#[derive(Debug)]
struct Launched {
    id: KernelId,
    priority: i32,
    /// When it was first seen launched.
    since: Nanos,
    blocks: u64,
    per_sm: u32,
    /// The most SMs it was seen holding (0: none seen).
    sms: u32,
}

/// The reserves' state (module doc): measures under way and made, and the
/// reserves of processes gone idle.
#[derive(Debug, Default)]
pub struct Reserves {
    /// SMs being taken back from a lower level: (SM, the kernel they are
    /// taken from, its priority, since when). One per SM at most.
    draining: Vec<(SmId, KernelId, i32, Nanos)>,
    /// Kernels launched and not ended (a few: the active ones).
    launched: Vec<Launched>,
    /// Per priority level: (level, how long its blocks hold an SM lately,
    /// when last measured). Up at once to a longer measure, down by a
    /// quarter of the difference to a shorter one (the longest matters).
    levels: Vec<(i32, Nanos, Nanos)>,
    /// Processes gone idle holding their reserve: (slot, priority, SMs,
    /// until when), in slot order.
    idle: Vec<(Slot, i32, u32, Nanos)>,
}

impl Reserves {
    /// How long blocks of `level` hold an SM lately, if measured (stale or not).
    pub fn block_ns(&self, level: i32) -> Option<Nanos> {
        self.levels.iter().find(|e| e.0 == level).map(|e| e.1)
    }

    /// Level `level`'s blocks are long, measured within [`DRAIN_MEMORY`]:
    /// reserves above it hold at `now`.
    pub fn held_against(&self, level: i32, now: Nanos) -> bool {
        self.levels.iter().any(|&(l, ns, at)| l == level && ns >= MIN_DRAIN && now < at.saturating_add(DRAIN_MEMORY))
    }

    /// Some level's blocks are long, measured within [`DRAIN_MEMORY`]: a
    /// reserve may hold at `now` (none does otherwise).
    pub fn any_held(&self, now: Nanos) -> bool {
        self.levels.iter().any(|&(_, ns, at)| ns >= MIN_DRAIN && now < at.saturating_add(DRAIN_MEMORY))
    }

    /// The longest block time among the levels below `priority` that
    /// reserves hold against at `now` (0: none).
    fn window_below(&self, priority: i32, now: Nanos) -> Nanos {
        self.levels
            .iter()
            .filter(|&&(l, _, _)| l < priority && self.held_against(l, now))
            .map(|e| e.1)
            .max()
            .unwrap_or(0)
    }

    /// SM `sm`, running `kernel` of `priority`, is being taken back from it at `now`.
    pub fn preempted(&mut self, sm: SmId, kernel: KernelId, priority: i32, now: Nanos) {
        self.draining.retain(|e| e.0 != sm);
        self.draining.push((sm, kernel, priority, now));
    }

    /// Measures what ended since the last round: SMs no longer leaving the
    /// kernel they were taken from, and kernels gone from the view; and
    /// notes the kernels launched since.
    pub fn observe(&mut self, view: &SchedView<'_>) {
        let now = view.now;
        let mut i = 0;
        while i < self.draining.len() {
            let (sm, kernel, priority, since) = self.draining[i];
            let leaving =
                matches!(view.sms.get(sm.0 as usize), Some(SmState::Reserved { kernel: k, .. }) if *k == kernel);
            if leaving {
                i += 1;
                continue;
            }
            self.draining.swap_remove(i);
            self.sample(priority, now.saturating_sub(since), now);
        }
        let n = view.device.num_sms as u32;
        let mut i = 0;
        while i < self.launched.len() {
            if view.position(self.launched[i].id).is_some() {
                i += 1;
                continue;
            }
            let k = self.launched.swap_remove(i);
            // Its blocks came in waves over the SMs it held (the whole
            // device if it was never seen holding one: ended before the
            // next round, or given its SMs back once its blocks issued).
            let sms = if k.sms == 0 { n } else { k.sms };
            let waves = k.blocks.div_ceil(k.per_sm.max(1) as u64 * sms.max(1) as u64).max(1);
            self.sample(k.priority, now.saturating_sub(k.since) / waves, now);
        }
        for k in view.kernels() {
            let held = k.sms_committed() + k.leaving().len();
            let total = k.desc().shape.blocks;
            if held == 0 && k.pending_blocks() >= total {
                continue; // not launched yet
            }
            match self.launched.iter_mut().find(|e| e.id == k.id()) {
                Some(e) => e.sms = e.sms.max(held),
                None => self.launched.push(Launched {
                    id: k.id(),
                    priority: k.priority(),
                    since: now,
                    blocks: total,
                    per_sm: k.blocks_per_sm(),
                    sms: held,
                }),
            }
        }
    }

    fn sample(&mut self, level: i32, took: Nanos, now: Nanos) {
        match self.levels.iter_mut().find(|e| e.0 == level) {
            Some(e) => {
                e.1 = if took >= e.1 { took } else { e.1 - (e.1 - took) / 4 };
                e.2 = now;
            }
            None => self.levels.push((level, took, now)),
        }
    }

    /// A process of `priority` that used `sms` SMs at its peak went idle at
    /// `now`: it keeps them from lower levels of long blocks for the
    /// longest of their block times.
    pub fn went_idle(&mut self, slot: Slot, priority: i32, sms: u32, now: Nanos) {
        let window = self.window_below(priority, now);
        if window == 0 || sms == 0 {
            return;
        }
        let entry = (slot, priority, sms, now.saturating_add(window));
        match self.idle.binary_search_by_key(&slot, |e| e.0) {
            Ok(i) => self.idle[i] = entry,
            Err(i) => self.idle.insert(i, entry),
        }
    }

    /// Drops the idle reserves that ended by `now` and those of processes
    /// `active` again.
    pub fn expire(&mut self, now: Nanos, active: impl Fn(Slot) -> bool) {
        self.idle.retain(|&(slot, _, _, until)| until > now && !active(slot));
    }

    /// SMs reserved by idle processes of priority above `level`.
    pub fn idle_above(&self, level: i32) -> u32 {
        self.idle.iter().filter(|e| e.1 > level).map(|e| e.2).sum()
    }

    /// When a reserve lapses (the policy must run then to give its SMs out).
    pub fn wake_at(&self) -> Option<Nanos> {
        let idle = self.idle.iter().map(|e| e.3).min()?;
        let stale = self.levels.iter().map(|e| e.2.saturating_add(DRAIN_MEMORY)).min().unwrap_or(idle);
        Some(idle.min(stale))
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
    fn a_level_of_long_blocks_is_held_against_for_a_while_and_one_of_short_blocks_is_not() {
        let mut r = Reserves::default();
        r.sample(0, 50 * NS_PER_US, 0);
        assert!(!r.held_against(0, 0), "50 µs blocks: no reserve against them");
        r.sample(0, 40 * NS_PER_MS, NS_PER_MS);
        assert_eq!(r.block_ns(0), Some(40 * NS_PER_MS), "a longer measure counts at once");
        assert!(r.held_against(0, NS_PER_MS + DRAIN_MEMORY - 1));
        assert!(!r.held_against(0, NS_PER_MS + DRAIN_MEMORY), "a measure made long ago lapses");
        assert!(!r.held_against(1, NS_PER_MS), "another level's blocks were never measured");
        r.sample(0, 0, 2 * NS_PER_MS);
        assert_eq!(r.block_ns(0), Some(30 * NS_PER_MS), "a shorter one pulls it down by a quarter");
    }

    #[test]
    fn an_idle_reserve_lasts_one_lower_block_time_and_only_against_lower_levels() {
        let mut r = Reserves::default();
        r.went_idle(Slot::new(1, 0), 5, 100, 0);
        assert_eq!(r.idle_above(0), 0, "nothing measured: no reserve");
        r.sample(0, 20 * NS_PER_MS, 0);
        r.sample(7, 90 * NS_PER_MS, 0);
        r.went_idle(Slot::new(1, 0), 5, 100, NS_PER_MS);
        assert_eq!((r.idle_above(0), r.idle_above(4), r.idle_above(5)), (100, 100, 0));
        assert_eq!(r.wake_at(), Some(21 * NS_PER_MS), "level 0's block time; level 7 is above it");
        r.expire(21 * NS_PER_MS - 1, |_| false);
        assert_eq!(r.idle_above(0), 100);
        r.expire(21 * NS_PER_MS, |_| false);
        assert_eq!(r.idle_above(0), 0, "idle for a block time: the SMs go");
        r.went_idle(Slot::new(1, 0), 5, 100, 30 * NS_PER_MS);
        r.expire(31 * NS_PER_MS, |s| s == Slot::new(1, 0));
        assert_eq!(r.idle_above(0), 0, "active again: its reserve is its kernels' peak, not an idle one");
    }
}

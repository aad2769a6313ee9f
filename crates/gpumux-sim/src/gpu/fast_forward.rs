//! Waves of a lone grid skipped in one step, with the state and counters
//! event-by-event simulation would have reached.
//!
//! **Why.** Each block end is an event: a grid of 2^31 − 2 one-µs blocks on
//! an H100 (issue 36's huge-grids abuser) is 264 events per simulated µs,
//! and the daemon's simulated device ran ~30x slower than real time under
//! it, so the hostile soak on `sim:h100` measured the simulator, not the
//! daemon.
//!
//! **When.** The device is in lockstep: every internal event waiting is
//! the end of a resident block of one launch, all at the same instant, and
//! that launch is all there is on the SMs it holds blocks on (it owns them,
//! nothing else is resident there, none is being saved or drained). Its
//! blocks all take the same time (no spread, no memory intensity, so no
//! contention either) and DRAM demand is zero. Then each wave ends at one
//! instant, every SM issues one new block per block ended (the lowest
//! index first, in the order the ends are processed), and the next wave
//! ends one block time later in the same order. Nothing reaches the
//! engine until the grid runs out of blocks, which the skip stops short of
//! (the last wave is simulated), and it stops at the caller's `until` too,
//! so commands come at the same instants as without it.
//!
//! **Exactly the same.** After the skip the simulator holds what the last
//! skipped instant would have left: the same block indices resident with
//! the same tokens, in the same order in each SM's list (which a context
//! save reads: [`order_after`] replays the list's `swap_remove`s), the
//! same pending issues, the same counters (events, blocks completed, SM
//! busy time, issued and alone time) and the same event sequence numbers.
//! `tests/fast_forward.rs` checks it against runs without it.
//! The audit (which lists every block) turns it off.

use super::{Pending, Resident, SimEvent, SimGpu};
use gpumux_engine::ids::LaunchId;
use gpumux_engine::time::Nanos;
use std::cmp::Reverse;

/// Fewer waves than this are simulated event by event (nothing to gain).
const MIN_WAVES: u64 = 2;

/// Sums of integral nanoseconds kept in an `f64` stay exact below this.
const EXACT_F64: f64 = (1u64 << 53) as f64;

/// What a skip reuses from one to the next (a skip every few µs of a
/// daemon's wall clock must not allocate per block), and when to look again.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    /// The ends waiting, (seq, SM, token), and in processing order (SM, token).
    waiting: Vec<(u64, usize, u64)>,
    order: Vec<(usize, u64)>,
    /// Per SM, where its ends start in `by_sm` (counting sort by SM).
    starts: Vec<usize>,
    /// Processing places (in `order`) of each SM's ends, grouped by SM.
    by_sm: Vec<usize>,
    /// List orders after a skip, by list order before it (one or two patterns).
    memo: Vec<(Vec<usize>, u64, Vec<usize>)>,
    ranks: Vec<usize>,
    /// No lockstep is possible before this instant: an event then was
    /// waiting at the last look that found none.
    not_before: Nanos,
}

impl SimGpu {
    /// Skips whole waves of a lone grid if the device is in lockstep (module
    /// doc) and at least [`MIN_WAVES`] end by `until`; says whether it did.
    /// Called with no pending issue and nothing to report; cheap when it
    /// cannot apply (it runs before every instant).
    pub(super) fn fast_forward(&mut self, until: Option<Nanos>) -> bool {
        if !self.fast_forward || self.audit.is_some() || self.mem_demand != 0.0 || !self.pending.is_empty() {
            return false;
        }
        let Some(&Reverse((at, _, SimEvent::BlockDone { sm, token }))) = self.queue.peek() else { return false };
        if at < self.ff.not_before {
            return false;
        }
        // The first end's launch must hold every resident block and have an
        // end waiting for each (no stale end of a preempted block either).
        let Some(lid) = self.sms[sm as usize].resident.iter().find(|r| r.token == token).map(|r| r.launch) else {
            return false;
        };
        let Some(l) = self.launches.get(&lid) else { return false };
        let period = l.timing.block_time_ns.max(1);
        let uniform = l.timing.block_time_spread <= 0.0 && l.mem.intensity <= 0.0 && l.mem.demand_per_block == 0.0;
        if !uniform || !l.restore.is_empty() || !l.leaving.is_empty() || l.exhausted {
            return false;
        }
        let others = self.launches.iter().any(|(&o, x)| o != lid && x.resident > 0);
        if others || l.resident as usize != self.queue.len() || self.copies.iter().any(|c| c.current.is_some()) {
            return false;
        }
        // Every end waiting is now: else none can be before the latest waiting.
        let latest = self.queue.iter().map(|Reverse((t, _, _))| *t).max().unwrap_or(at);
        if latest != at {
            self.ff.not_before = latest;
            return false;
        }
        // The ends in processing order (their sequence numbers).
        let mut waiting = std::mem::take(&mut self.ff.waiting);
        waiting.clear();
        for Reverse((_, seq, ev)) in self.queue.iter() {
            let SimEvent::BlockDone { sm, token } = *ev else {
                self.ff.waiting = waiting;
                return false;
            };
            waiting.push((*seq, sm as usize, token));
        }
        waiting.sort_unstable_by_key(|w| w.0);
        let mut order = std::mem::take(&mut self.ff.order);
        order.clear();
        order.extend(waiting.iter().map(|&(_, sm, token)| (sm, token)));
        self.ff.waiting = waiting;
        // Each is a resident block (no stale end) ending now; each SM
        // holding some is the launch's own and full: an end makes room for
        // exactly one block, the one `fill_sm` issues.
        let ok = order.iter().all(|&(sm, token)| self.sms[sm].resident.iter().any(|r| r.token == token && r.end == at))
            && self.sms.iter().enumerate().all(|(i, s)| {
                s.resident.is_empty() || (s.owner == Some(lid) && s.saving == 0 && !self.fits(i, lid, l))
            });
        // Waves ending by `until`, leaving the grid blocks to issue after them.
        let per_wave = order.len() as u64;
        let by_time = until.map_or(u64::MAX, |u| if u < at { 0 } else { (u - at) / period + 1 });
        let by_blocks = l.blocks.len().saturating_sub(1) / per_wave.max(1);
        let issued_ns = per_wave as f64 * period as f64;
        let by_exactness = ((EXACT_F64 - self.mem_stats.issued_ns.max(self.mem_stats.alone_ns)) / issued_ns).max(0.0);
        let waves = by_time.min(by_blocks).min(by_exactness as u64);
        let last = (waves.max(1) - 1).checked_mul(period).and_then(|d| at.checked_add(d));
        let fits_clock = last.is_some_and(|t| t.checked_add(period).is_some());
        let go = ok && per_wave > 0 && waves >= MIN_WAVES && fits_clock;
        if go {
            if let Some(last) = last {
                self.skip(lid, &order, waves, last);
            }
        }
        self.ff.order = order;
        go
    }

    /// Carries out `waves` waves of `lid`, the last ending at `last` (the
    /// conditions checked by [`SimGpu::fast_forward`]); `order`: the ends in
    /// the order they are processed, (SM, token).
    fn skip(&mut self, lid: LaunchId, order: &[(usize, u64)], waves: u64, last: Nanos) {
        let per_wave = order.len() as u64;
        let skipped = waves * per_wave;
        self.queue.clear();
        // Time moves (no DRAM demand: nothing to integrate).
        self.step_to(last);
        // The last wave's blocks: the lowest indices after the earlier waves',
        // the j-th processed end's new block getting the j-th of them.
        let Some(l) = self.launches.get_mut(&lid) else { return };
        l.blocks.take_prefix((waves - 1) * per_wave);
        let fresh = l.blocks.take_prefix(per_wave);
        let mut fresh = fresh.ranges().iter().flat_map(|r| r.clone());
        l.completed += skipped;
        let (base, mem) = (l.timing.block_time_ns, l.mem);
        let tok0 = self.next_token + (waves - 1) * per_wave;
        self.next_token += skipped;
        let end = last + base.max(1);
        // Each SM's ends in processing order (counting sort by SM).
        let n = self.sms.len();
        let ff = &mut self.ff;
        ff.starts.clear();
        ff.starts.resize(n + 1, 0);
        for &(sm, _) in order {
            ff.starts[sm + 1] += 1;
        }
        for i in 0..n {
            ff.starts[i + 1] += ff.starts[i];
        }
        ff.by_sm.clear();
        ff.by_sm.resize(order.len(), 0);
        let mut next = ff.starts.clone();
        for (j, &(sm, _)) in order.iter().enumerate() {
            ff.by_sm[next[sm]] = j;
            next[sm] += 1;
        }
        // The j-th end's successor: the j-th fresh block.
        let blocks: Vec<u64> = fresh.by_ref().take(order.len()).collect();
        for sm in 0..n {
            let js = &ff.by_sm[ff.starts[sm]..ff.starts[sm + 1]];
            if js.is_empty() {
                continue;
            }
            let s = &mut self.sms[sm];
            // The list now, as each block's rank among the SM's ends (every
            // resident block has one: checked).
            ff.ranks.clear();
            ff.ranks.extend(s.resident.iter().map(|r| js.iter().position(|&j| order[j].1 == r.token).unwrap_or(0)));
            let found = ff.memo.iter().position(|(before, w, _)| *w == waves && *before == ff.ranks);
            let memo_at = match found {
                Some(i) => i,
                None => {
                    if ff.memo.len() >= 4 {
                        ff.memo.clear();
                    }
                    ff.memo.push((ff.ranks.clone(), waves, order_after(&ff.ranks, waves)));
                    ff.memo.len() - 1
                }
            };
            s.resident.clear();
            for &rank in &ff.memo[memo_at].2 {
                let j = js[rank];
                s.resident.push(Resident { token: tok0 + j as u64, launch: lid, index: blocks[j], end });
            }
            // One block at a time: the SM was empty between each end and the
            // issue after it (`evict`), its busy time counted to each end.
            if s.resident.len() == 1 {
                if let Some(since) = s.busy_since.replace(last) {
                    self.stats.sm_busy_ns += (last - since) as u128;
                }
            }
        }
        // The last instant's issues wait for its end, as `fill_sm` leaves them.
        for (j, &(sm, _)) in order.iter().enumerate() {
            self.pending.push(Pending { sm: sm as u16, token: tok0 + j as u64, base, mem });
        }
        // What the flushes of the earlier waves' issues added.
        let flushed = (waves - 1) * per_wave;
        self.seq += flushed;
        self.mem_stats.issued_ns += (flushed * base.max(1)) as f64;
        self.mem_stats.alone_ns += (flushed * base) as f64;
        self.stats.events += skipped;
        self.stats.blocks_completed += skipped;
        self.waves_skipped += waves;
    }
}

/// The order of an SM's resident list after `waves` waves: `ranks[i]` is the
/// processing rank (among the SM's ends of a wave) of the block at position
/// `i`; each wave processes ranks 0, 1, ... in turn, each end a
/// `swap_remove` of its block and a push of its successor (which keeps the
/// rank). The list's state repeats within a few waves: found, the rest of
/// the waves are a whole number of cycles plus a remainder.
pub(super) fn order_after(ranks: &[usize], waves: u64) -> Vec<usize> {
    let k = ranks.len();
    let wave = |list: &[usize]| -> Vec<usize> {
        // Old blocks are 0..k, their successors k..2k, then renamed.
        let mut l = list.to_vec();
        for r in 0..k {
            if let Some(p) = l.iter().position(|&x| x == r) {
                l.swap_remove(p);
            }
            l.push(k + r);
        }
        l.iter().map(|&x| x - k).collect()
    };
    let mut seen: Vec<Vec<usize>> = vec![ranks.to_vec()];
    let mut cur = ranks.to_vec();
    for done in 1..=waves {
        cur = wave(&cur);
        if let Some(first) = seen.iter().position(|s| *s == cur) {
            let cycle = done - first as u64;
            let left = (waves - done) % cycle;
            return seen[first + left as usize].clone();
        }
        seen.push(cur.clone());
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::order_after;

    /// `order_after` against the list's own `swap_remove`s, wave by wave.
    #[test]
    fn the_list_order_after_many_waves_is_the_one_wave_by_wave() {
        for k in 1..=6usize {
            // A few starting orders of k blocks.
            let starts: Vec<Vec<usize>> =
                vec![(0..k).collect(), (0..k).rev().collect(), (0..k).map(|i| (i * 2 + 1) % k).collect()];
            for start in starts {
                // Only permutations of 0..k (the third is one for odd k).
                let mut sorted = start.clone();
                sorted.sort_unstable();
                if sorted != (0..k).collect::<Vec<_>>() {
                    continue;
                }
                let mut list = start.clone();
                for waves in 1..40u64 {
                    let mut l = list.clone();
                    for r in 0..k {
                        let p = l.iter().position(|&x| x == r).expect("present");
                        l.swap_remove(p);
                        l.push(k + r);
                    }
                    list = l.iter().map(|&x| x - k).collect();
                    assert_eq!(order_after(&start, waves), list, "k {k}, from {start:?}, {waves} waves");
                }
            }
        }
    }
}

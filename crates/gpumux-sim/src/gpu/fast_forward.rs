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
use std::collections::HashMap;

/// Fewer waves than this are simulated event by event (nothing to gain).
const MIN_WAVES: u64 = 2;

/// Sums of integral nanoseconds kept in an `f64` stay exact below this.
const EXACT_F64: f64 = (1u64 << 53) as f64;

impl SimGpu {
    /// Skips whole waves of a lone grid if the device is in lockstep (module
    /// doc) and at least [`MIN_WAVES`] end by `until`; says whether it did.
    /// Called with no pending issue and nothing to report.
    pub(super) fn fast_forward(&mut self, until: Option<Nanos>) -> bool {
        if !self.fast_forward || self.audit.is_some() || self.mem_demand != 0.0 || !self.pending.is_empty() {
            return false;
        }
        // The events, in the order they would be processed.
        let mut waiting: Vec<(Nanos, u64, SimEvent)> = self.queue.iter().map(|Reverse(e)| *e).collect();
        waiting.sort_unstable();
        let Some(&(at, _, _)) = waiting.first() else { return false };
        let mut order: Vec<(usize, u64)> = Vec::with_capacity(waiting.len());
        let mut lid: Option<LaunchId> = None;
        for &(t, _, ev) in &waiting {
            let SimEvent::BlockDone { sm, token } = ev else { return false };
            let sm = sm as usize;
            let Some(r) = self.sms[sm].resident.iter().find(|r| r.token == token) else { return false };
            if t != at || r.end != at || lid.is_some_and(|l| l != r.launch) {
                return false;
            }
            lid = Some(r.launch);
            order.push((sm, token));
        }
        let Some(lid) = lid else { return false };
        let Some(l) = self.launches.get(&lid) else { return false };
        let period = l.timing.block_time_ns.max(1);
        let uniform = l.timing.block_time_spread <= 0.0 && l.mem.intensity <= 0.0 && l.mem.demand_per_block == 0.0;
        if !uniform || !l.restore.is_empty() || !l.leaving.is_empty() || l.exhausted {
            return false;
        }
        // Every resident block of the device ends now (one event each), and
        // each SM holding some is the launch's own, issuing one block per end.
        let resident: usize = self.sms.iter().map(|s| s.resident.len()).sum();
        if resident != order.len() || resident == 0 {
            return false;
        }
        // Full: each end makes room for exactly one block, the one `fill_sm` issues.
        let lone = self.sms.iter().enumerate().all(|(i, s)| {
            s.resident.is_empty()
                || (s.owner == Some(lid)
                    && s.saving == 0
                    && s.resident.iter().all(|r| r.launch == lid)
                    && !self.fits(i, lid, l))
        });
        if !lone || self.copies.iter().any(|c| c.current.is_some()) {
            return false;
        }
        // Waves ending by `until`, leaving the grid blocks to issue after them.
        let per_wave = order.len() as u64;
        let by_time = until.map_or(u64::MAX, |u| if u < at { 0 } else { (u - at) / period + 1 });
        let by_blocks = l.blocks.len().saturating_sub(1) / per_wave;
        let issued_ns = per_wave as f64 * period as f64;
        let by_exactness = ((EXACT_F64 - self.mem_stats.issued_ns.max(self.mem_stats.alone_ns)) / issued_ns).max(0.0);
        let waves = by_time.min(by_blocks).min(by_exactness as u64);
        if waves < MIN_WAVES {
            return false;
        }
        let Some(last) = (waves - 1).checked_mul(period).and_then(|d| at.checked_add(d)) else { return false };
        if last.checked_add(period).is_none() {
            return false;
        }
        self.skip(lid, &order, waves, last);
        true
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
        let fresh: Vec<u64> = l.blocks.take_prefix(per_wave).ranges().iter().flat_map(|r| r.clone()).collect();
        l.completed += skipped;
        let (base, mem) = (l.timing.block_time_ns, l.mem);
        let tok0 = self.next_token + (waves - 1) * per_wave;
        self.next_token += skipped;
        // Each SM's ends in processing order (their places in `order`), and
        // each block's rank among its SM's.
        let mut js_of_sm: HashMap<usize, Vec<usize>> = HashMap::new();
        let mut rank_of_token: HashMap<u64, usize> = HashMap::with_capacity(order.len());
        for (j, &(sm, token)) in order.iter().enumerate() {
            let js = js_of_sm.entry(sm).or_default();
            rank_of_token.insert(token, js.len());
            js.push(j);
        }
        // SMs in a fixed order: `busy_since` sums below must not depend on a map's.
        let mut sms: Vec<(usize, Vec<usize>)> = js_of_sm.into_iter().collect();
        sms.sort_unstable_by_key(|e| e.0);
        let mut memo: HashMap<Vec<usize>, Vec<usize>> = HashMap::new();
        for (sm, js) in &sms {
            let s = &mut self.sms[*sm];
            // The list now, as each block's rank in the SM's processing order
            // (every resident block has its end in `order`: checked).
            let now_ranks: Vec<usize> =
                s.resident.iter().map(|r| rank_of_token.get(&r.token).copied().unwrap_or(0)).collect();
            let after = memo.entry(now_ranks.clone()).or_insert_with(|| order_after(&now_ranks, waves)).clone();
            let end = last + base.max(1);
            s.resident = after
                .iter()
                .map(|&rank| {
                    let j = js[rank];
                    Resident { token: tok0 + j as u64, launch: lid, index: fresh[j], end }
                })
                .collect();
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
                if {
                    let mut s = start.clone();
                    s.sort_unstable();
                    s != (0..k).collect::<Vec<_>>()
                } {
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

//! Which kernel is queued natively behind which (issue 35): the launch
//! command that adopts a kernel hands what is queued behind it over to its
//! launch (`Behind::Queued(op)` becomes `Behind::Launch(lid)`), and finding
//! that one was a walk of every kernel queued or seen ended, on every
//! launch command that adopted one (every answered launch among them: up to
//! ~160 entries with [`super::ENDED_WAITING_MAX`]). This index names it at
//! once.
//!
//! **Exact, not a guess.** An entry is queued behind `prev` only by
//! `ClientDevice::queue_one_deeper`, and `behind` is rewritten only by the
//! hand-over; entries leave the queued map only when adopted or dropped
//! (moved to the orphans, which the hand-over still walks: they are few).
//! The index follows each of these, and every look is checked against the
//! entry itself. Should a second kernel ever be queued behind one `prev`
//! while the first still waits there (a stream's kernel has one successor,
//! so this is not expected), the index cannot name both: it gives up and
//! every hand-over walks the map as before.

use super::{Ahead, Behind};
use gpumux_engine::id_map::IdMap;
use gpumux_engine::ids::{LaunchId, OpId};

/// The kernel queued natively behind each kernel (module doc).
#[derive(Default)]
pub(in crate::client) struct BehindIndex {
    /// `prev` → the kernel queued with `Behind::Queued(prev)`.
    next: IdMap<OpId, OpId>,
    /// Two kernels were queued behind one: every hand-over walks the map.
    walk: bool,
}

impl BehindIndex {
    /// `op` was queued behind `prev`, before it goes into `ahead`.
    pub(super) fn queued(&mut self, ahead: &IdMap<OpId, Ahead>, prev: OpId, op: OpId) {
        if let Some(old) = self.next.insert(prev, op) {
            if old != op && ahead.get(&old).is_some_and(|a| a.behind == Behind::Queued(prev)) {
                tracing::debug!("CUDA device: {old} and {op} both queued behind {prev}: hand-overs walk the queue");
                self.walk = true;
            }
        }
    }

    /// `a` (kernel `op`) left the queued map (adopted, or dropped to the orphans).
    pub(super) fn left(&mut self, op: OpId, a: &Ahead) {
        if let Behind::Queued(prev) = a.behind {
            if self.next.get(&prev) == Some(&op) {
                self.next.remove(&prev);
            }
        }
    }

    /// `op` is launched as `lid` (and has left `ahead`): what was queued
    /// behind it waits for that launch now, in `ahead` and in `orphans`.
    pub(super) fn hand_over(
        &mut self,
        ahead: &mut IdMap<OpId, Ahead>,
        orphans: &mut [(OpId, Ahead)],
        op: OpId,
        lid: LaunchId,
    ) {
        let hand = |b: &mut Ahead| {
            if b.behind == Behind::Queued(op) {
                b.behind = Behind::Launch(lid);
            }
        };
        let next = self.next.remove(&op);
        if self.walk {
            ahead.values_mut().for_each(hand);
        } else if let Some(b) = next.and_then(|n| ahead.get_mut(&n)) {
            hand(b);
        }
        orphans.iter_mut().for_each(|o| hand(&mut o.1));
    }

    /// Entries held (tests: the index stays small).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.next.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Placement;
    use super::*;
    use gpumux_engine::ranges::BlockRanges;
    use gpumux_engine::smset::SmSet;

    fn entry(behind: Behind) -> Ahead {
        Ahead {
            behind,
            chain: 0,
            held: SmSet::EMPTY,
            place: Placement { mask: SmSet::EMPTY, share: None },
            covers: BlockRanges::default(),
            stream: None,
            segs: Vec::new(),
            cancelled: false,
            priority: 0,
            ended: false,
            expect_ns: 0.0,
            on_stream: 0,
            native: true,
        }
    }

    /// xorshift64*: a seeded stream of choices.
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    /// Two copies of the queue: one handed over by the walk the index
    /// replaces, one by the index; after every step their `behind`s agree.
    fn run(seed: u64, steps: usize, twice_behind: bool) -> bool {
        let mut rng = Rng(seed);
        let (mut walked, mut indexed) = (IdMap::<OpId, Ahead>::default(), IdMap::<OpId, Ahead>::default());
        let (mut orphans_w, mut orphans_i) = (Vec::new(), Vec::new());
        let mut index = BehindIndex::default();
        let (mut next_op, mut next_lid) = (1u64, 1u64);
        for _ in 0..steps {
            let keys: Vec<OpId> = {
                let mut k: Vec<OpId> = walked.keys().copied().collect();
                k.sort();
                k
            };
            let pick = |rng: &mut Rng| (!keys.is_empty()).then(|| keys[rng.below(keys.len() as u64) as usize]);
            match rng.below(4) {
                // Queue a new kernel behind a queued one (or, rarely, a second behind the same).
                0 | 1 => {
                    let prev = match pick(&mut rng) {
                        Some(p) if twice_behind || !walked.values().any(|a| a.behind == Behind::Queued(p)) => p,
                        Some(_) => continue,
                        None => {
                            let op = OpId(next_op);
                            next_op += 1;
                            walked.insert(op, entry(Behind::Launch(LaunchId(0))));
                            indexed.insert(op, entry(Behind::Launch(LaunchId(0))));
                            continue;
                        }
                    };
                    let op = OpId(next_op);
                    next_op += 1;
                    index.queued(&indexed, prev, op);
                    walked.insert(op, entry(Behind::Queued(prev)));
                    indexed.insert(op, entry(Behind::Queued(prev)));
                }
                // Adopt one: it leaves, and what was behind it is handed over.
                2 => {
                    let Some(op) = pick(&mut rng) else { continue };
                    let lid = LaunchId(next_lid);
                    next_lid += 1;
                    walked.remove(&op);
                    for b in walked.values_mut().chain(orphans_w.iter_mut().map(|o: &mut (OpId, Ahead)| &mut o.1)) {
                        if b.behind == Behind::Queued(op) {
                            b.behind = Behind::Launch(lid);
                        }
                    }
                    if let Some(a) = indexed.remove(&op) {
                        index.left(op, &a);
                    }
                    index.hand_over(&mut indexed, &mut orphans_i, op, lid);
                }
                // Drop one to the orphans.
                _ => {
                    let Some(op) = pick(&mut rng) else { continue };
                    if let Some(a) = walked.remove(&op) {
                        orphans_w.push((op, a));
                    }
                    if let Some(a) = indexed.remove(&op) {
                        index.left(op, &a);
                        orphans_i.push((op, a));
                    }
                }
            }
            let same = walked.len() == indexed.len()
                && walked.iter().all(|(op, a)| indexed.get(op).is_some_and(|b| b.behind == a.behind))
                && orphans_w.iter().zip(&orphans_i).all(|(a, b)| a.0 == b.0 && a.1.behind == b.1.behind);
            assert!(same, "seed {seed}: the index and the walk disagree");
            assert!(
                index.len() <= walked.len(),
                "seed {seed}: {} index entries for {} queued",
                index.len(),
                walked.len()
            );
        }
        index.walk
    }

    #[test]
    fn the_index_hands_over_what_the_walk_of_every_queued_kernel_would() {
        for seed in 1..=200 {
            assert!(!run(seed, 300, false), "seed {seed}: one successor per kernel never needs the walk");
        }
    }

    #[test]
    fn two_kernels_queued_behind_one_fall_back_to_the_walk_and_still_agree() {
        let fell_back = (1..=200).filter(|&seed| run(seed, 300, true)).count();
        assert!(fell_back > 0, "no seed queued two kernels behind one: the fallback went untested");
    }
}

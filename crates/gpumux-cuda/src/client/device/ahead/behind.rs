//! Which queued kernel waits for what (issue 35): for each launch and each
//! kernel queued natively, the kernel queued behind it on its stream.
//! Three looks needed it, and each walked every kernel queued or seen ended
//! (up to ~160 entries with [`super::ENDED_WAITING_MAX`]): the launch
//! command that adopts a kernel hands what is queued behind it over to its
//! launch (`Behind::Queued(op)` becomes `Behind::Launch(lid)`; every
//! answered launch adopts), and each launch that ends at a poll asks
//! whether workers are queued behind it and hands its stream to them
//! (`take_stream`, `queued_behind`). This index names the one at once.
//!
//! **Exact, not a guess.** `behind` is set when a kernel is queued
//! (`try_queue_ahead`, `queue_one_deeper`) and rewritten only by the
//! hand-over; entries leave the queued map only when adopted or dropped to
//! the orphans (which the looks still walk: they are few). The index
//! follows each of these, and every look is checked against the entry
//! itself. Should a second kernel ever wait for the same launch or kernel
//! while the first still does (a stream's kernel has one successor, so
//! this is not expected), the index cannot name both: it gives up, and
//! every look walks the map as before, in the map's order.

use super::{Ahead, Behind};
use gpumux_engine::id_map::IdMap;
use gpumux_engine::ids::{LaunchId, OpId};

/// The kernel queued behind each launch or kernel (module doc).
#[derive(Default)]
pub(in crate::client) struct BehindIndex {
    /// What an entry waits for → that entry's operation.
    waiting: IdMap<Behind, OpId>,
    /// Two kernels waited for the same: every look walks the map.
    walk: bool,
}

impl BehindIndex {
    /// `op` is queued (or handed over) behind `behind`, before or after it
    /// goes into `ahead` with it.
    pub(super) fn queued(&mut self, ahead: &IdMap<OpId, Ahead>, behind: Behind, op: OpId) {
        if let Some(old) = self.waiting.insert(behind, op) {
            if old != op && ahead.get(&old).is_some_and(|a| a.behind == behind) {
                tracing::debug!("CUDA device: {old} and {op} both queued behind {behind:?}: looks walk the queue");
                self.walk = true;
            }
        }
    }

    /// `a` (kernel `op`) left the queued map (adopted, or dropped to the orphans).
    pub(super) fn left(&mut self, op: OpId, a: &Ahead) {
        if self.waiting.get(&a.behind) == Some(&op) {
            self.waiting.remove(&a.behind);
        }
    }

    /// The first kernel of `ahead` (in the map's order) queued behind
    /// `behind` for which `also` holds: what a walk of the map would find.
    pub(super) fn find(
        &self,
        ahead: &IdMap<OpId, Ahead>,
        behind: Behind,
        also: impl Fn(&Ahead) -> bool,
    ) -> Option<OpId> {
        let fits = |a: &Ahead| a.behind == behind && also(a);
        if self.walk {
            return ahead.iter().find(|(_, a)| fits(a)).map(|(&op, _)| op);
        }
        self.waiting.get(&behind).copied().filter(|op| ahead.get(op).is_some_and(fits))
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
            let moved = b.behind == Behind::Queued(op);
            if moved {
                b.behind = Behind::Launch(lid);
            }
            moved
        };
        let next = self.waiting.remove(&Behind::Queued(op));
        if self.walk {
            ahead.values_mut().for_each(|b| {
                hand(b);
            });
        } else if let Some(n) = next {
            if ahead.get_mut(&n).is_some_and(hand) {
                self.queued(ahead, Behind::Launch(lid), n);
            }
        }
        orphans.iter_mut().for_each(|o| {
            hand(&mut o.1);
        });
    }

    /// Entries held (tests: the index stays small).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support;
    use super::*;

    fn entry(behind: Behind) -> Ahead {
        Ahead { behind, ..test_support::entry() }
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
    /// replaces, one by the index; after every step their `behind`s agree,
    /// and the index finds what a walk of its map finds.
    fn run(seed: u64, steps: usize, twice_behind: bool) -> bool {
        let mut rng = Rng(seed);
        let (mut walked, mut indexed) = (IdMap::<OpId, Ahead>::default(), IdMap::<OpId, Ahead>::default());
        let (mut orphans_w, mut orphans_i) = (Vec::new(), Vec::new());
        let mut index = BehindIndex::default();
        let (mut next_op, mut next_lid) = (1u64, 1u64);
        for _ in 0..steps {
            let mut keys: Vec<OpId> = walked.keys().copied().collect();
            keys.sort();
            let pick = |rng: &mut Rng| (!keys.is_empty()).then(|| keys[rng.below(keys.len() as u64) as usize]);
            let behind = match rng.below(6) {
                // Queued behind a launch (`try_queue_ahead`): a new one, or, rarely, one already waited for.
                0 => {
                    let lid = if twice_behind && next_lid > 1 { rng.below(next_lid) } else { next_lid };
                    next_lid += 1;
                    Some(Behind::Launch(LaunchId(lid)))
                }
                // Queued behind a queued kernel (`queue_one_deeper`).
                1 | 2 => pick(&mut rng).map(Behind::Queued),
                // Adopted as a new launch: it leaves, and what was behind it is handed over.
                3 => {
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
                    None
                }
                // Cancelled where it is.
                4 => {
                    let Some(op) = pick(&mut rng) else { continue };
                    for m in [&mut walked, &mut indexed] {
                        if let Some(a) = m.get_mut(&op) {
                            a.cancelled = true;
                        }
                    }
                    None
                }
                // Dropped to the orphans.
                _ => {
                    let Some(op) = pick(&mut rng) else { continue };
                    if let Some(a) = walked.remove(&op) {
                        orphans_w.push((op, a));
                    }
                    if let Some(a) = indexed.remove(&op) {
                        index.left(op, &a);
                        orphans_i.push((op, a));
                    }
                    None
                }
            };
            if let Some(b) = behind.filter(|&b| twice_behind || !walked.values().any(|a| a.behind == b)) {
                let op = OpId(next_op);
                next_op += 1;
                index.queued(&indexed, b, op);
                walked.insert(op, entry(b));
                indexed.insert(op, entry(b));
            }
            let same = walked.len() == indexed.len()
                && walked.iter().all(|(op, a)| indexed.get(op).is_some_and(|b| b.behind == a.behind))
                && orphans_w.iter().zip(&orphans_i).all(|(a, b)| a.0 == b.0 && a.1.behind == b.1.behind);
            assert!(same, "seed {seed}: the index and the walk disagree");
            // Every look the device makes, for what is waited for and for what is not.
            let mut looks: Vec<Behind> = indexed.values().map(|a| a.behind).collect();
            looks.extend([Behind::Launch(LaunchId(next_lid)), Behind::Queued(OpId(next_op))]);
            for b in looks {
                let walk = |also: fn(&Ahead) -> bool| {
                    indexed.iter().find(|(_, a)| a.behind == b && also(a)).map(|(&op, _)| op)
                };
                let any: fn(&Ahead) -> bool = |_| true;
                let live: fn(&Ahead) -> bool = |a| !a.cancelled;
                assert_eq!(index.find(&indexed, b, any), walk(any), "seed {seed}: {b:?}");
                assert_eq!(index.find(&indexed, b, live), walk(live), "seed {seed}: {b:?}, not cancelled");
            }
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
    fn the_index_finds_and_hands_over_what_the_walk_of_every_queued_kernel_would() {
        for seed in 1..=200 {
            assert!(!run(seed, 300, false), "seed {seed}: one successor per kernel never needs the walk");
        }
    }

    #[test]
    fn two_kernels_behind_one_fall_back_to_the_walk_and_still_agree() {
        let fell_back = (1..=200).filter(|&seed| run(seed, 300, true)).count();
        assert!(fell_back > 0, "no seed queued two kernels behind one: the fallback went untested");
    }
}

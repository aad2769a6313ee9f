//! How many queued kernels are not cancelled, by priority and by run
//! (issue 35). A run's next kernel's post asks whether a peer of its
//! priority is queued (`hw_native`: alone at its priority) and whether
//! another priority's workers are, and every launch command whether another
//! run's kernels are queued on its SMs (`cancel_ahead_on`): each was a walk
//! of every kernel queued or seen ended, most often to find none (one
//! client's chain: up to ~160 entries, all its own). These counts answer
//! "none" at once; where some exist, the walk still decides.
//!
//! **Exact.** A kernel enters the queued map not cancelled (counted), and
//! stops counting when it is cancelled there (`cancel_where`) or leaves it
//! (adopted, or dropped to the orphans); its priority and run never change.
//! Only the teardown cancels without counting (`Ahead::stop`, after which
//! nothing looks). Unit tests compare every answer with the walk.

use super::Ahead;
use gpumux_engine::id_map::IdMap;

/// Queued kernels not cancelled (module doc).
#[derive(Default)]
pub(in crate::client) struct Uncancelled {
    total: usize,
    by_priority: IdMap<i32, usize>,
    by_chain: IdMap<u64, usize>,
    by_both: IdMap<(i32, u64), usize>,
}

fn up(n: &mut usize) {
    *n += 1;
}

fn down(n: &mut usize) {
    *n = n.saturating_sub(1);
}

/// Moves `key`'s count `by` one; a count down to 0 goes (runs come and go).
fn bump<K: std::hash::Hash + Eq + Copy>(map: &mut IdMap<K, usize>, key: K, by: fn(&mut usize)) {
    let n = map.entry(key).or_default();
    by(n);
    if *n == 0 {
        map.remove(&key);
    }
}

impl Uncancelled {
    /// `a` goes into the queued map, not cancelled.
    pub(super) fn add(&mut self, a: &Ahead) {
        self.change(a, up);
    }

    /// `a`, not cancelled, is cancelled or leaves the queued map.
    pub(super) fn sub(&mut self, a: &Ahead) {
        self.change(a, down);
    }

    fn change(&mut self, a: &Ahead, by: fn(&mut usize)) {
        by(&mut self.total);
        bump(&mut self.by_priority, a.priority, by);
        bump(&mut self.by_chain, a.chain, by);
        bump(&mut self.by_both, (a.priority, a.chain), by);
    }

    /// Some are not cancelled.
    pub(super) fn any(&self) -> bool {
        self.total > 0
    }

    /// Some of `priority` are, not of run `chain` (`ahead::peers`' test).
    pub(super) fn peer(&self, priority: i32, chain: Option<u64>) -> bool {
        let of_priority = self.by_priority.get(&priority).copied().unwrap_or(0);
        let own = chain.and_then(|c| self.by_both.get(&(priority, c))).copied().unwrap_or(0);
        of_priority > own
    }

    /// Some are of a priority other than `priority`.
    pub(super) fn other_priority(&self, priority: i32) -> bool {
        self.total > self.by_priority.get(&priority).copied().unwrap_or(0)
    }

    /// Some are of a run other than `chain`.
    pub(super) fn other_chain(&self, chain: u64) -> bool {
        self.total > self.by_chain.get(&chain).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support;
    use super::super::test_support::xorshift;
    use super::*;
    use gpumux_engine::ids::OpId;

    fn entry(priority: i32, chain: u64) -> Ahead {
        Ahead { priority, chain, ..test_support::entry() }
    }

    #[test]
    fn the_counts_answer_as_a_walk_of_the_queued_kernels() {
        let mut looked = 0;
        for seed in 1..=100u64 {
            let mut below = xorshift(seed);
            let (mut map, mut counts) = (IdMap::<OpId, Ahead>::default(), Uncancelled::default());
            for step in 0..400u64 {
                let op = OpId(below(40));
                match below(3) {
                    0 if !map.contains_key(&op) => {
                        let a = entry(below(3) as i32, below(4));
                        counts.add(&a);
                        map.insert(op, a);
                    }
                    1 => {
                        if let Some(a) = map.get_mut(&op).filter(|a| !a.cancelled) {
                            counts.sub(a);
                            a.cancelled = true;
                        }
                    }
                    _ => {
                        if let Some(a) = map.remove(&op).filter(|a| !a.cancelled) {
                            counts.sub(&a);
                        }
                    }
                }
                let live = || map.values().filter(|a| !a.cancelled);
                assert_eq!(counts.any(), live().next().is_some(), "seed {seed}, step {step}");
                for p in 0..3 {
                    assert_eq!(counts.other_priority(p), live().any(|a| a.priority != p), "seed {seed}, step {step}");
                    for c in [None, Some(0), Some(1), Some(2), Some(3)] {
                        let walk = live().any(|a| a.priority == p && Some(a.chain) != c);
                        assert_eq!(counts.peer(p, c), walk, "seed {seed}, step {step}, priority {p}, run {c:?}");
                        // `peers` (whose walk the counts skip) lists what the walk finds, in its order.
                        let listed: Vec<OpId> = super::super::peers(&map, &counts, p, c).collect();
                        let walked: Vec<OpId> = map
                            .iter()
                            .filter(|(_, a)| a.priority == p && !a.cancelled && Some(a.chain) != c)
                            .map(|(&op, _)| op)
                            .collect();
                        assert_eq!(listed, walked, "seed {seed}, step {step}, priority {p}, run {c:?}");
                        looked += walk as u32;
                    }
                }
                for c in 0..4 {
                    assert_eq!(counts.other_chain(c), live().any(|a| a.chain != c), "seed {seed}, step {step}");
                }
            }
        }
        assert!(looked > 1000, "the walks found peers only {looked} times: the test saw too little");
    }
}

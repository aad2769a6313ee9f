//! The runs' tails without a walk of every queued kernel (issue 35). A
//! tail is a queued kernel, not cancelled, queued natively, whose next
//! kernel on its stream is bound and not queued: where its run may go on
//! (`deepen_tails`, at each poll that sees ends and after each unbind). The
//! list was a walk of every kernel queued or seen ended (up to ~160 in one
//! client's chain) with a look in the operations per entry.
//!
//! **Candidates.** A kernel becomes a tail only when it is queued, when
//! the kernel after it is bound (`follow`), or when the kernel after it
//! leaves the queued map (adopted or dropped: the kernel it was queued
//! behind is noted); it stops being one when cancelled or when its next is
//! queued, and neither flag nor next changes otherwise. Each of those notes
//! the kernel here, so the tails are among the candidates; a list taken
//! from them keeps only the tails, and those stay candidates.
//!
//! **Same order.** The walk lists the tails in the queued map's order, and
//! `deepen_tails` queues behind each in turn. With one tail (one run: the
//! chain) any order is that order; with more, the walk decides, as before.
//! **Checked.** Every [`CHECK_EVERY`]th list is also walked: if the two
//! ever differ (a transition missed above), the walk decides from then on.
//! Unit tests compare every list with the walk over seeded runs.

use super::Ahead;
use gpumux_engine::id_map::{IdMap, IdSet};
use gpumux_engine::ids::OpId;

/// Every `CHECK_EVERY`th list is compared with the walk (module doc).
const CHECK_EVERY: u64 = 64;

/// Kernels that may be tails (module doc).
#[derive(Default)]
pub(in crate::client) struct Tails {
    maybe: IdSet<OpId>,
    lists: u64,
    /// A list once differed from the walk: walks only.
    walk_only: bool,
    found: Vec<OpId>,
}

/// Whether `op` (queued as `a`) is a tail; `next_of`: the kernel after an operation.
fn is_tail(ahead: &IdMap<OpId, Ahead>, op: OpId, a: &Ahead, next_of: &impl Fn(OpId) -> Option<OpId>) -> bool {
    !a.cancelled && a.native() && next_of(op).is_some_and(|n| !ahead.contains_key(&n))
}

/// The walk [`Tails::list`] replaces, in the queued map's order.
fn walk(ahead: &IdMap<OpId, Ahead>, next_of: &impl Fn(OpId) -> Option<OpId>, out: &mut Vec<OpId>) {
    out.extend(ahead.iter().filter(|(&op, a)| is_tail(ahead, op, a, next_of)).map(|(&op, _)| op));
}

impl Tails {
    /// `op` may have become a tail (queued, its next bound, its next left).
    pub(super) fn note(&mut self, op: OpId) {
        self.maybe.insert(op);
    }

    /// The tails, into `out` (cleared first), in the order the walk of the
    /// queued map lists them.
    pub(super) fn list(
        &mut self,
        ahead: &IdMap<OpId, Ahead>,
        next_of: impl Fn(OpId) -> Option<OpId>,
        out: &mut Vec<OpId>,
    ) {
        out.clear();
        self.lists += 1;
        let check = self.lists.is_multiple_of(CHECK_EVERY);
        if !self.walk_only {
            self.found.clear();
            let found = &mut self.found;
            found.extend(
                self.maybe.iter().filter(|op| ahead.get(op).is_some_and(|a| is_tail(ahead, **op, a, &next_of))),
            );
            if found.len() <= 1 && !check {
                out.extend_from_slice(found);
                self.keep(out);
                return;
            }
        }
        walk(ahead, &next_of, out);
        if check && !self.walk_only {
            let mut from_candidates = self.found.clone();
            let mut walked = out.clone();
            from_candidates.sort_unstable();
            walked.sort_unstable();
            if from_candidates != walked {
                tracing::warn!(
                    "CUDA device: the runs' tails from their candidates ({from_candidates:?}) differ from the walk's \
                     ({walked:?}): walking from now on (a bug: ahead/tails.rs)"
                );
                self.walk_only = true;
            }
        }
        self.keep(out);
    }

    /// The candidates are the tails just listed (module doc).
    fn keep(&mut self, tails: &[OpId]) {
        self.maybe.clear();
        self.maybe.extend(tails.iter().copied());
    }

    /// Whether a list ever differed from the walk (for tests).
    #[cfg(test)]
    fn walks_only(&self) -> bool {
        self.walk_only
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support;
    use super::super::test_support::xorshift;
    use super::super::Behind;
    use super::*;
    use gpumux_engine::ids::LaunchId;

    fn entry(behind: Behind, native: bool) -> Ahead {
        Ahead { behind, native, ..test_support::entry() }
    }

    /// Seeded runs of the device's transitions (queue behind a launch or a
    /// queued kernel, bind a next kernel, cancel, adopt or drop), noted as
    /// the device notes them; every list must be the walk's, in its order.
    #[test]
    fn every_list_is_the_walks() {
        let (mut lists, mut some) = (0u32, 0u32);
        for seed in 1..=60u64 {
            let mut below = xorshift(seed);
            // Streams of operations 0..N: op i's next is i+1 once bound (`bound`).
            const N: u64 = 48;
            let mut bound = vec![false; N as usize];
            let mut ahead = IdMap::<OpId, Ahead>::default();
            let mut tails = Tails::default();
            let (mut out, mut walked) = (Vec::new(), Vec::new());
            for step in 0..600u64 {
                let i = below(N - 1);
                let op = OpId(i);
                match below(5) {
                    0 => {
                        // `follow`: the kernel after `op` is bound.
                        bound[i as usize] = true;
                        if ahead.contains_key(&op) {
                            tails.note(op);
                        }
                    }
                    1 if !ahead.contains_key(&op) && !ahead.contains_key(&OpId(i + 1)) => {
                        // Queued behind a launch, or behind its queued
                        // predecessor; never before its successor (a kernel
                        // queued behind a launch has its predecessor launched).
                        let behind = match i.checked_sub(1).map(OpId).filter(|p| ahead.contains_key(p)) {
                            Some(p) => Behind::Queued(p),
                            None => Behind::Launch(LaunchId(i)),
                        };
                        ahead.insert(op, entry(behind, below(6) != 0));
                        tails.note(op);
                    }
                    2 => {
                        if let Some(a) = ahead.get_mut(&op) {
                            a.cancelled = true;
                        }
                    }
                    3 => {
                        // Adopted or dropped: what it was queued behind is noted.
                        if let Some(a) = ahead.remove(&op) {
                            if let Behind::Queued(p) = a.behind {
                                tails.note(p);
                            }
                        }
                    }
                    _ => {
                        // A poll's list.
                        let next_of =
                            |o: OpId| bound.get(o.0 as usize).copied().unwrap_or(false).then_some(OpId(o.0 + 1));
                        tails.list(&ahead, next_of, &mut out);
                        walked.clear();
                        walk(&ahead, &next_of, &mut walked);
                        assert_eq!(out, walked, "seed {seed}, step {step}");
                        lists += 1;
                        some += (!out.is_empty()) as u32;
                    }
                }
            }
            assert!(!tails.walks_only(), "seed {seed}: a list differed from the walk");
        }
        assert!(some > 1000 && some < lists, "{some} of {lists} lists had tails: the test saw too little");
    }

    /// A transition not noted is caught by the check and the walk decides after.
    #[test]
    fn a_missed_note_is_caught_and_the_walk_decides_from_then_on() {
        let mut ahead = IdMap::<OpId, Ahead>::default();
        ahead.insert(OpId(1), entry(Behind::Launch(LaunchId(1)), true));
        ahead.insert(OpId(5), entry(Behind::Launch(LaunchId(5)), true));
        let mut tails = Tails::default();
        let next_of = |o: OpId| Some(OpId(o.0 + 1));
        let mut out = Vec::new();
        // Only 1 noted: 5 is a tail too but was never noted.
        tails.note(OpId(1));
        for _ in 0..CHECK_EVERY {
            tails.list(&ahead, next_of, &mut out);
        }
        assert!(tails.walks_only(), "the check must find the tail never noted");
        tails.list(&ahead, next_of, &mut out);
        let mut got = out.clone();
        got.sort_unstable();
        assert_eq!(got, vec![OpId(1), OpId(5)]);
    }
}

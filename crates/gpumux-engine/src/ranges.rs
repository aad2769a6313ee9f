//! Sets of block indices as sorted, disjoint ranges.
//!
//! Progress of a kernel is a block index (docs/architecture.md, "Progress is a
//! set of block ranges"): a kernel's work not yet done is a set of ranges of its
//! linearised grid. Preemption hands ranges back, a slice takes a prefix, a
//! multi-GPU split takes halves. In the common case there is one range, so
//! operations are O(1) amortised.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// A set of block indices (see the module doc).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockRanges {
    /// Sorted by start, disjoint and non-adjacent, none empty.
    ranges: Vec<Range<u64>>,
}

impl BlockRanges {
    /// No blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks `0..n`.
    pub fn full(n: u64) -> Self {
        let mut r = Self::new();
        r.insert(0..n);
        r
    }

    /// How many blocks.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The ranges, sorted, disjoint and not adjacent.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// Removes and returns the lowest block index.
    pub fn pop_first(&mut self) -> Option<u64> {
        let first = self.ranges.first_mut()?;
        let b = first.start;
        first.start += 1;
        if first.start == first.end {
            self.ranges.remove(0);
        }
        Some(b)
    }

    /// Removes and returns the lowest `n` blocks (fewer if there are fewer).
    pub fn take_prefix(&mut self, n: u64) -> BlockRanges {
        let mut out = BlockRanges::new();
        let mut want = n;
        while want > 0 {
            let Some(first) = self.ranges.first_mut() else { break };
            let len = first.end - first.start;
            if len <= want {
                want -= len;
                out.ranges.push(self.ranges.remove(0));
            } else {
                out.ranges.push(first.start..first.start + want);
                first.start += want;
                want = 0;
            }
        }
        out
    }

    /// Adds a range; overlapping an existing range is a logic error in the
    /// caller (a block would run twice) and is reported as `Err`.
    pub fn try_insert(&mut self, r: Range<u64>) -> Result<(), Range<u64>> {
        if r.start >= r.end {
            return Ok(());
        }
        // First range starting at or after r; only it and its predecessor can overlap.
        let pos = self.ranges.partition_point(|x| x.start < r.start);
        let overlaps = |x: &Range<u64>| x.start < r.end && r.start < x.end;
        if self.ranges.get(pos).is_some_and(overlaps) || (pos > 0 && overlaps(&self.ranges[pos - 1])) {
            return Err(r);
        }
        self.ranges.insert(pos, r);
        // Merge with the next and previous when adjacent.
        if pos + 1 < self.ranges.len() && self.ranges[pos].end == self.ranges[pos + 1].start {
            let next = self.ranges.remove(pos + 1);
            self.ranges[pos].end = next.end;
        }
        if pos > 0 && self.ranges[pos - 1].end == self.ranges[pos].start {
            let cur = self.ranges.remove(pos);
            self.ranges[pos - 1].end = cur.end;
        }
        Ok(())
    }

    /// Adds a range known not to overlap (debug-asserted).
    pub fn insert(&mut self, r: Range<u64>) {
        let res = self.try_insert(r);
        debug_assert!(res.is_ok(), "overlapping block range {res:?}");
    }

    /// Adds a single block.
    pub fn insert_block(&mut self, b: u64) {
        self.insert(b..b + 1);
    }

    /// Moves every range of `other` into `self`.
    pub fn absorb(&mut self, other: BlockRanges) {
        for r in other.ranges {
            self.insert(r);
        }
    }

    /// Whether block `b` is in the set.
    pub fn contains(&self, b: u64) -> bool {
        let pos = self.ranges.partition_point(|x| x.end <= b);
        self.ranges.get(pos).is_some_and(|x| x.start <= b)
    }

    /// The parts of the set inside `r`, in order (`self ∩ r`).
    pub fn within(&self, r: Range<u64>) -> impl Iterator<Item = Range<u64>> + '_ {
        let first = self.ranges.partition_point(|x| x.end <= r.start);
        self.ranges[first..].iter().map_while(move |x| {
            let (a, b) = (x.start.max(r.start), x.end.min(r.end));
            (a < b).then_some(a..b)
        })
    }

    /// Removes every block of `r` that the set holds (`self − r`).
    pub fn remove(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        let first = self.ranges.partition_point(|x| x.end <= r.start);
        let last = self.ranges.partition_point(|x| x.start < r.end);
        if first >= last {
            return;
        }
        // What is left of the first and last overlapping ranges, outside `r`.
        let head = self.ranges[first].start..r.start;
        let tail = r.end..self.ranges[last - 1].end;
        let kept = [head, tail].into_iter().filter(|x| x.start < x.end);
        self.ranges.splice(first..last, kept);
    }
}

impl std::fmt::Debug for BlockRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[")?;
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            write!(f, "{}..{}", r.start, r.end)?;
        }
        write!(f, "]")
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // a one-range set is what these tests mean
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn prefix_and_reinsert() {
        let mut r = BlockRanges::full(10);
        let head = r.take_prefix(3);
        assert_eq!(head.ranges(), &[0..3]);
        assert_eq!(r.ranges(), &[3..10]);
        r.insert_block(1);
        assert_eq!(r.ranges(), &[1..2, 3..10]);
        r.insert_block(2);
        assert_eq!(r.ranges(), &[1..10]);
        assert!(r.try_insert(5..6).is_err());
        assert_eq!(r.pop_first(), Some(1));
        assert_eq!(r.len(), 8);
    }

    #[test]
    fn within_clips_and_remove_cuts() {
        let mut r = BlockRanges::new();
        r.insert(0..10);
        r.insert(20..30);
        assert_eq!(r.within(3..27).collect::<Vec<_>>(), vec![3..10, 20..27]);
        assert_eq!(r.within(10..20).count(), 0);
        r.remove(5..25);
        assert_eq!(r.ranges(), &[0..5, 25..30]);
        r.remove(26..27);
        assert_eq!(r.ranges(), &[0..5, 25..26, 27..30]);
        r.remove(40..50);
        r.remove(7..7);
        assert_eq!(r.len(), 9);
        r.remove(0..100);
        assert!(r.is_empty());
    }

    proptest! {
        /// `within` and `remove` agree with the same operations on a set of single blocks.
        #[test]
        fn within_and_remove_match_single_blocks(
            parts in proptest::collection::vec((0u64..200, 1u64..20), 0..10),
            cut in (0u64..220, 0u64..60),
        ) {
            let mut r = BlockRanges::new();
            for (s, len) in parts {
                for b in s..s + len {
                    if !r.contains(b) {
                        r.insert_block(b);
                    }
                }
            }
            let cut = cut.0..cut.0 + cut.1;
            let want_in: Vec<u64> = (0..300).filter(|&b| r.contains(b) && cut.contains(&b)).collect();
            let got_in: Vec<u64> = r.within(cut.clone()).flatten().collect();
            prop_assert_eq!(got_in, want_in);
            let want_left: Vec<u64> = (0..300).filter(|&b| r.contains(b) && !cut.contains(&b)).collect();
            r.remove(cut);
            let got_left: Vec<u64> = r.ranges().iter().cloned().flatten().collect();
            prop_assert_eq!(got_left, want_left);
            prop_assert!(r.ranges().windows(2).all(|w| w[0].end < w[1].start));
        }


        /// Splitting a set into prefixes and putting blocks back in any order
        /// never loses or duplicates a block.
        #[test]
        fn split_and_merge_preserve_blocks(n in 1u64..500, cuts in proptest::collection::vec(1u64..50, 1..20)) {
            let mut r = BlockRanges::full(n);
            let mut parts = Vec::new();
            for c in cuts { parts.push(r.take_prefix(c)); }
            parts.reverse();
            for p in parts { r.absorb(p); }
            prop_assert_eq!(r.ranges(), &[0..n]);
        }

        /// Blocks put back one at a time in any order give sorted, merged
        /// ranges, and a block put back twice is refused.
        #[test]
        fn single_blocks_in_any_order(order in Just((0u64..64).collect::<Vec<_>>()).prop_shuffle()) {
            let mut r = BlockRanges::new();
            for (i, &b) in order.iter().enumerate() {
                prop_assert!(r.try_insert(b..b + 1).is_ok());
                prop_assert!(r.try_insert(b..b + 1).is_err());
                prop_assert_eq!(r.len(), i as u64 + 1);
                prop_assert!(r.ranges().windows(2).all(|w| w[0].end < w[1].start));
            }
            prop_assert_eq!(r.ranges(), &[0..64]);
        }
    }
}

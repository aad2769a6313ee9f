//! Sets of block indices as sorted, disjoint ranges.
//!
//! Progress of a kernel is a block index (docs/architecture.md, "Progress is a
//! set of block ranges"): a kernel's work not yet done is a set of ranges of its
//! linearised grid. Preemption hands ranges back, a slice takes a prefix, a
//! multi-GPU split takes halves. In the common case there is one range, so
//! operations are O(1) amortised.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::ops::Range;

/// A set of block indices (see the module doc).
///
/// One range is held in the value, more in a vector: every kernel's blocks
/// start as one range (`full`) and a launch mostly takes them whole, and the
/// vector allocated for that one range and freed at the launch's end was one
/// of the two allocations per launch of issue 35's 8 clients (callgrind).
#[derive(Clone, Default)]
pub struct BlockRanges {
    /// The ranges when there are two or more (sorted by start, disjoint and
    /// non-adjacent, none empty); empty otherwise. Never exactly one.
    many: Vec<Range<u64>>,
    /// The range when there is exactly one; empty (`0..0`) otherwise.
    one: Range<u64>,
}

impl BlockRanges {
    /// No blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks `0..n`.
    pub fn full(n: u64) -> Self {
        BlockRanges { many: Vec::new(), one: 0..n }
    }

    /// How many blocks.
    pub fn len(&self) -> u64 {
        if self.many.is_empty() {
            // One range or none (a policy asks this of every kernel each round).
            return self.one.end.saturating_sub(self.one.start);
        }
        self.many.iter().map(|r| r.end - r.start).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.one.is_empty() && self.many.is_empty()
    }

    /// The ranges, sorted, disjoint and not adjacent.
    pub fn ranges(&self) -> &[Range<u64>] {
        if !self.one.is_empty() {
            std::slice::from_ref(&self.one)
        } else {
            &self.many
        }
    }

    /// The ranges as one vector to change (the one range moved into it),
    /// to be put back in shape by [`BlockRanges::settle`].
    fn spill(&mut self) -> &mut Vec<Range<u64>> {
        if !self.one.is_empty() {
            let one = std::mem::replace(&mut self.one, 0..0);
            self.many.push(one);
        }
        &mut self.many
    }

    /// A single range left in the vector moves to the value.
    fn settle(&mut self) {
        if self.many.len() == 1 {
            self.one = self.many.pop().unwrap_or(0..0);
        }
    }

    /// Removes and returns the lowest block index.
    pub fn pop_first(&mut self) -> Option<u64> {
        if !self.one.is_empty() {
            let b = self.one.start;
            self.one.start += 1;
            if self.one.is_empty() {
                self.one = 0..0;
            }
            return Some(b);
        }
        let first = self.many.first_mut()?;
        let b = first.start;
        first.start += 1;
        if first.start == first.end {
            self.many.remove(0);
            self.settle();
        }
        Some(b)
    }

    /// Removes and returns the lowest `n` blocks (fewer if there are fewer).
    pub fn take_prefix(&mut self, n: u64) -> BlockRanges {
        if !self.one.is_empty() {
            // One range: its prefix, and the rest stays (no vector either side).
            let cut = self.one.start.saturating_add(n).min(self.one.end);
            let head = if cut > self.one.start { self.one.start..cut } else { 0..0 };
            self.one.start = cut;
            if self.one.is_empty() {
                self.one = 0..0;
            }
            return BlockRanges { many: Vec::new(), one: head };
        }
        let mut out = BlockRanges::new();
        let mut want = n;
        while want > 0 {
            let Some(first) = self.many.first_mut() else { break };
            let len = first.end - first.start;
            if len <= want {
                want -= len;
                out.many.push(self.many.remove(0));
            } else {
                out.many.push(first.start..first.start + want);
                first.start += want;
                want = 0;
            }
        }
        self.settle();
        out.settle();
        out
    }

    /// Adds a range; overlapping an existing range is a logic error in the
    /// caller (a block would run twice) and is reported as `Err`.
    pub fn try_insert(&mut self, r: Range<u64>) -> Result<(), Range<u64>> {
        if r.start >= r.end {
            return Ok(());
        }
        if self.is_empty() {
            self.one = r;
            return Ok(());
        }
        let ranges = self.spill();
        // First range starting at or after r; only it and its predecessor can overlap.
        let pos = ranges.partition_point(|x| x.start < r.start);
        let overlaps = |x: &Range<u64>| x.start < r.end && r.start < x.end;
        if ranges.get(pos).is_some_and(overlaps) || (pos > 0 && overlaps(&ranges[pos - 1])) {
            self.settle();
            return Err(r);
        }
        ranges.insert(pos, r);
        // Merge with the next and previous when adjacent.
        if pos + 1 < ranges.len() && ranges[pos].end == ranges[pos + 1].start {
            let next = ranges.remove(pos + 1);
            ranges[pos].end = next.end;
        }
        if pos > 0 && ranges[pos - 1].end == ranges[pos].start {
            let cur = ranges.remove(pos);
            ranges[pos - 1].end = cur.end;
        }
        self.settle();
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
        for r in other.ranges() {
            self.insert(r.clone());
        }
    }

    /// Whether block `b` is in the set.
    pub fn contains(&self, b: u64) -> bool {
        let ranges = self.ranges();
        let pos = ranges.partition_point(|x| x.end <= b);
        ranges.get(pos).is_some_and(|x| x.start <= b)
    }

    /// The parts of the set inside `r`, in order (`self ∩ r`).
    pub fn within(&self, r: Range<u64>) -> impl Iterator<Item = Range<u64>> + '_ {
        let ranges = self.ranges();
        let first = ranges.partition_point(|x| x.end <= r.start);
        ranges[first..].iter().map_while(move |x| {
            let (a, b) = (x.start.max(r.start), x.end.min(r.end));
            (a < b).then_some(a..b)
        })
    }

    /// Removes every block of `r` that the set holds (`self − r`).
    pub fn remove(&mut self, r: Range<u64>) {
        if r.start >= r.end {
            return;
        }
        let ranges = self.spill();
        let first = ranges.partition_point(|x| x.end <= r.start);
        let last = ranges.partition_point(|x| x.start < r.end);
        if first < last {
            // What is left of the first and last overlapping ranges, outside `r`.
            let head = ranges[first].start..r.start;
            let tail = r.end..ranges[last - 1].end;
            let kept = [head, tail].into_iter().filter(|x| x.start < x.end);
            ranges.splice(first..last, kept);
        }
        self.settle();
    }
}

impl PartialEq for BlockRanges {
    fn eq(&self, other: &Self) -> bool {
        self.ranges() == other.ranges()
    }
}

impl Eq for BlockRanges {}

/// On the wire and in files as it always was: `{ ranges: [..] }`.
#[derive(Serialize)]
#[serde(rename = "BlockRanges")]
struct WireRef<'a> {
    ranges: &'a [Range<u64>],
}

#[derive(Deserialize)]
#[serde(rename = "BlockRanges")]
struct Wire {
    ranges: Vec<Range<u64>>,
}

impl Serialize for BlockRanges {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        WireRef { ranges: self.ranges() }.serialize(s)
    }
}

impl<'de> Deserialize<'de> for BlockRanges {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut many = Wire::deserialize(d)?.ranges;
        // Taken as sent (the sender's set kept its invariant), in shape.
        let one = if many.len() == 1 { many.pop().unwrap_or(0..0) } else { 0..0 };
        Ok(BlockRanges { many, one })
    }
}

impl std::fmt::Debug for BlockRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[")?;
        for (i, r) in self.ranges().iter().enumerate() {
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

    /// The wire and file form is the one a `{ ranges: Vec<Range> }` struct
    /// had (before one range was held in the value), and reads back the same.
    #[test]
    fn serialises_as_its_ranges_and_reads_back() {
        #[derive(Serialize)]
        struct Before {
            ranges: Vec<Range<u64>>,
        }
        let mut three = BlockRanges::full(10);
        three.remove(2..3);
        three.remove(5..6);
        for set in [BlockRanges::new(), BlockRanges::full(7), three] {
            let json = serde_json::to_string(&set).expect("serialises");
            let before = serde_json::to_string(&Before { ranges: set.ranges().to_vec() }).expect("serialises");
            assert_eq!(json, before);
            let back: BlockRanges = serde_json::from_str(&json).expect("reads back");
            assert_eq!(back, set);
            assert_eq!(back.ranges(), set.ranges());
        }
    }

    #[test]
    fn one_range_gives_prefixes_and_blocks_and_empties() {
        let mut r = BlockRanges::full(5);
        assert!(r.take_prefix(0).is_empty());
        assert_eq!(r.take_prefix(2).ranges(), &[0..2]);
        assert_eq!(r.pop_first(), Some(2));
        assert_eq!(r.take_prefix(9).ranges(), &[3..5]);
        assert!(r.is_empty() && r.ranges().is_empty() && r == BlockRanges::new());
        assert_eq!(r.pop_first(), None);
        r.insert(4..6);
        r.insert(0..2);
        assert_eq!(r.ranges(), &[0..2, 4..6]);
        r.insert(2..4);
        assert_eq!(r.ranges(), &[0..6], "merged back into one");
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

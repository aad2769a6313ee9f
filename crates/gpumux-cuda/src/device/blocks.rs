//! Engine blocks and suite blocks.
//!
//! The engine's grid (`KernelDesc.blocks`, from the workload file) need not
//! equal the suite kernel's: engine block `i` of `N` stands for suite blocks
//! `[⌊iM/N⌋, ⌊(i+1)M/N⌋)` of `M`. The device keeps, per kernel invocation,
//! the suite blocks not yet run as [`BlockRanges`], so nothing is lost or run
//! twice whatever the mapping; an engine block is reported remaining while any
//! of its suite blocks is.

use gpumux_engine::ranges::BlockRanges;
use std::ops::Range;

/// Maps engine block indices (`engine` blocks) onto suite block indices (`suite`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockMap {
    /// Blocks of the engine's grid (at least 1).
    pub engine: u64,
    /// Blocks of the suite kernel's grid.
    pub suite: u64,
}

impl BlockMap {
    /// First suite block of engine block `i` (`i` may be `engine`).
    pub fn start(&self, i: u64) -> u64 {
        ((i as u128 * self.suite as u128) / self.engine.max(1) as u128) as u64
    }

    /// Suite blocks of engine blocks `r`.
    pub fn to_suite(&self, r: &Range<u64>) -> Range<u64> {
        self.start(r.start)..self.start(r.end)
    }

    /// The engine block holding suite block `s`.
    pub fn engine_of(&self, s: u64) -> u64 {
        // Largest i with ⌊iM/N⌋ ≤ s: i = ⌈(s+1)N/M⌉ − 1.
        let num = (s as u128 + 1) * self.engine as u128;
        (num.div_ceil(self.suite.max(1) as u128) as u64).saturating_sub(1)
    }

    /// The suite blocks of `left` inside engine blocks `requested`, in order:
    /// what a launch of `requested` still has to run.
    pub fn suite_work<'a>(
        self,
        requested: &'a BlockRanges,
        left: &'a BlockRanges,
    ) -> impl Iterator<Item = Range<u64>> + 'a {
        requested.ranges().iter().flat_map(move |er| left.within(self.to_suite(er)))
    }

    /// Engine blocks of `requested` that still hold suite blocks of `left`.
    pub fn engine_remaining(self, requested: &BlockRanges, left: &BlockRanges) -> BlockRanges {
        let mut out: Vec<Range<u64>> = Vec::new();
        for er in requested.ranges() {
            for s in left.within(self.to_suite(er)) {
                let a = self.engine_of(s.start).max(er.start);
                let b = (self.engine_of(s.end - 1) + 1).min(er.end);
                // Two runs of suite blocks may share an engine block: merge.
                match out.last_mut() {
                    Some(last) if last.end >= a => last.end = last.end.max(b),
                    _ => out.push(a..b),
                }
            }
        }
        let mut remaining = BlockRanges::new();
        for r in out {
            remaining.insert(r);
        }
        remaining
    }
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // a one-range set is what these tests mean
mod tests {
    use super::*;

    fn ranges(rs: &[Range<u64>]) -> BlockRanges {
        let mut b = BlockRanges::new();
        for r in rs {
            b.insert(r.clone());
        }
        b
    }

    #[test]
    fn block_map_partitions_suite_blocks() {
        for (n, m) in [(1024u64, 4096u64), (4096, 65536), (7, 3), (10, 10), (3, 1000), (1000, 7)] {
            let map = BlockMap { engine: n, suite: m };
            assert_eq!(map.start(0), 0);
            assert_eq!(map.start(n), m);
            for i in 0..n {
                assert!(map.start(i) <= map.start(i + 1));
            }
            for s in 0..m {
                let i = map.engine_of(s);
                assert!(map.to_suite(&(i..i + 1)).contains(&s), "n={n} m={m} s={s} i={i}");
            }
        }
    }

    #[test]
    fn remaining_engine_blocks_cover_every_suite_block_left() {
        let map = BlockMap { engine: 10, suite: 40 };
        let requested = BlockRanges::full(10);
        // Suite blocks 0..13 done: engine block 3 (12..16) is still partly left.
        let rem = map.engine_remaining(&requested, &ranges(&[13..40]));
        assert_eq!(rem.ranges(), &[3..10]);
        assert!(map.engine_remaining(&requested, &BlockRanges::new()).is_empty());
        let part = ranges(&[0..2, 5..7]);
        let rem = map.engine_remaining(&part, &BlockRanges::full(40));
        assert_eq!(rem.ranges(), &[0..2, 5..7]);
        // Two runs of suite blocks in one engine block (4: suite 16..20) give it once.
        let rem = map.engine_remaining(&requested, &ranges(&[16..17, 18..19]));
        assert_eq!(rem.ranges(), &[4..5]);
    }

    #[test]
    fn suite_work_is_what_is_left_of_the_requested_blocks() {
        let map = BlockMap { engine: 10, suite: 40 };
        let requested = ranges(&[1..3, 8..10]);
        let left = ranges(&[0..6, 10..35]);
        let work: Vec<Range<u64>> = map.suite_work(&requested, &left).collect();
        assert_eq!(work, vec![4..6, 10..12, 32..35]);
        assert_eq!(map.suite_work(&requested, &BlockRanges::new()).count(), 0);
    }
}

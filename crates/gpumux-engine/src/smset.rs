//! A set of SMs of one device, as a fixed-size bit set.
//!
//! Policies shuffle SM sets on every scheduling decision, so the set is `Copy`
//! and allocation-free. 256 SMs covers every GPU to date (H100/H200 have 132).

use crate::ids::SmId;
use serde::{Deserialize, Serialize};

/// Most SMs one device may have.
pub const MAX_SMS: usize = 256;
const WORDS: usize = MAX_SMS / 64;

/// A set of SMs (see the module doc).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SmSet {
    bits: [u64; WORDS],
}

impl SmSet {
    /// No SM.
    pub const EMPTY: SmSet = SmSet { bits: [0; WORDS] };

    /// Just `sm`.
    pub fn single(sm: SmId) -> Self {
        let mut s = Self::EMPTY;
        s.insert(sm);
        s
    }

    /// SMs `start..end` (end exclusive). Panics if `end > MAX_SMS`: device
    /// presets are checked against `MAX_SMS` when they are built.
    pub fn range(start: u16, end: u16) -> Self {
        assert!(end as usize <= MAX_SMS, "SM range end {end} past MAX_SMS {MAX_SMS}");
        let mut s = Self::EMPTY;
        if start >= end {
            return s;
        }
        // Whole words at a time: a scheduling round asks for the device's
        // every SM (its idle ones are that minus the busy ones).
        for (w, word) in s.bits.iter_mut().enumerate() {
            let (lo, hi) = (w * 64, w * 64 + 64);
            let (a, b) = ((start as usize).max(lo), (end as usize).min(hi));
            if a < b {
                let n = b - a;
                let ones = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
                *word = ones << (a - lo);
            }
        }
        s
    }

    /// Adds `sm`.
    pub fn insert(&mut self, sm: SmId) {
        let i = sm.0 as usize;
        self.bits[i / 64] |= 1 << (i % 64);
    }

    /// Removes `sm`.
    pub fn remove(&mut self, sm: SmId) {
        let i = sm.0 as usize;
        self.bits[i / 64] &= !(1 << (i % 64));
    }

    /// Whether `sm` is in the set.
    pub fn contains(&self, sm: SmId) -> bool {
        let i = sm.0 as usize;
        i < MAX_SMS && self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// How many SMs. Empty words are skipped: the build targets baseline
    /// x86-64, which has no `popcnt`, so each word's count is a dozen
    /// instructions, and the sets a round asks about (a kernel's SMs, the
    /// busy ones) mostly lie in one word of the four (issue 35's callgrind:
    /// ~128 instructions a call, several calls per kernel per round).
    pub fn len(&self) -> u32 {
        self.bits.iter().filter(|&&w| w != 0).map(|w| w.count_ones()).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|&w| w == 0)
    }

    /// SMs in either set.
    pub fn union(&self, other: &SmSet) -> SmSet {
        let mut s = *self;
        for (a, b) in s.bits.iter_mut().zip(other.bits.iter()) {
            *a |= *b;
        }
        s
    }

    /// SMs in both sets.
    pub fn intersection(&self, other: &SmSet) -> SmSet {
        let mut s = *self;
        for (a, b) in s.bits.iter_mut().zip(other.bits.iter()) {
            *a &= *b;
        }
        s
    }

    /// SMs in this set and not in `other`.
    pub fn difference(&self, other: &SmSet) -> SmSet {
        let mut s = *self;
        for (a, b) in s.bits.iter_mut().zip(other.bits.iter()) {
            *a &= !*b;
        }
        s
    }

    /// The SMs in index order.
    pub fn iter(&self) -> impl Iterator<Item = SmId> + '_ {
        self.into_iter()
    }

    /// The lowest SM.
    pub fn first(&self) -> Option<SmId> {
        self.iter().next()
    }
}

/// The SMs of a set in index order, by value: a few word operations per SM
/// and none per absent one, so walking the busy SMs of a mostly idle GPU
/// costs what is there, not 132 looks (issue 35).
#[derive(Clone, Debug)]
pub struct SmIter {
    bits: [u64; WORDS],
    word: usize,
}

impl Iterator for SmIter {
    type Item = SmId;
    fn next(&mut self) -> Option<SmId> {
        while self.word < WORDS {
            let w = &mut self.bits[self.word];
            if *w != 0 {
                let b = w.trailing_zeros();
                *w &= *w - 1;
                return Some(SmId((self.word * 64 + b as usize) as u16));
            }
            self.word += 1;
        }
        None
    }
}

impl IntoIterator for SmSet {
    type Item = SmId;
    type IntoIter = SmIter;
    fn into_iter(self) -> SmIter {
        SmIter { bits: self.bits, word: 0 }
    }
}

impl FromIterator<SmId> for SmSet {
    fn from_iter<I: IntoIterator<Item = SmId>>(iter: I) -> Self {
        let mut s = SmSet::EMPTY;
        for sm in iter {
            s.insert(sm);
        }
        s
    }
}

impl std::fmt::Debug for SmSet {
    /// Prints runs, e.g. `{0-3,8,10-11}`, which is how people read SM partitions.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{{")?;
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while let Some(&n) = it.peek() {
                if n.0 == end.0 + 1 {
                    end = n;
                    it.next();
                } else {
                    break;
                }
            }
            if !first {
                write!(f, ",")?;
            }
            first = false;
            if start == end {
                write!(f, "{}", start.0)?;
            } else {
                write!(f, "{}-{}", start.0, end.0)?;
            }
        }
        write!(f, "}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_operations() {
        let a = SmSet::range(0, 4);
        let b = SmSet::range(2, 70);
        assert_eq!(a.len(), 4);
        assert_eq!(b.len(), 68);
        assert_eq!(a.intersection(&b), SmSet::range(2, 4));
        assert_eq!(a.union(&b), SmSet::range(0, 70));
        assert_eq!(b.difference(&a), SmSet::range(4, 70));
        assert!(b.contains(SmId(69)) && !b.contains(SmId(70)));
        assert_eq!(format!("{:?}", a.union(&SmSet::single(SmId(9)))), "{0-3,9}");
        let ids: Vec<u16> = SmSet::range(62, 66).iter().map(|s| s.0).collect();
        assert_eq!(ids, vec![62, 63, 64, 65]);
    }

    #[test]
    fn a_range_is_its_sms_inserted_one_by_one_and_iterates_in_order() {
        for (start, end) in
            [(0u16, 0u16), (5, 5), (7, 3), (0, 1), (0, 64), (0, 132), (63, 65), (64, 128), (1, 256), (100, 200)]
        {
            let mut one_by_one = SmSet::EMPTY;
            for i in start..end {
                one_by_one.insert(SmId(i));
            }
            let r = SmSet::range(start, end);
            assert_eq!(r, one_by_one, "range {start}..{end}");
            let ids: Vec<u16> = r.into_iter().map(|s| s.0).collect();
            assert_eq!(ids, (start..end).collect::<Vec<_>>(), "range {start}..{end} in order");
        }
    }
}

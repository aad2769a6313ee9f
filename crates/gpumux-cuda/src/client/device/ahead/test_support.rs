//! Fixtures shared by the tests of the queued map's indexes (`behind`,
//! `holders`, `tails`, `uncancelled`): each compares its index with the walk
//! it replaces over seeded runs of queued entries.

use super::{Ahead, Behind, Placement};
use gpumux_engine::ids::LaunchId;
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;

/// A queued native kernel behind launch 0, chain 0, priority 0, neither
/// cancelled nor seen ended; a test sets the fields it varies
/// (`Ahead { chain, ..entry() }`).
pub(super) fn entry() -> Ahead {
    Ahead {
        behind: Behind::Launch(LaunchId(0)),
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

/// xorshift64 from `seed` (not 0): `below(n)` draws in `0..n`, the same
/// draws for the same seed.
pub(in crate::client::device) fn xorshift(seed: u64) -> impl FnMut(u64) -> u64 {
    let mut x = seed;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    }
}

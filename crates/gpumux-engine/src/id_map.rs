//! Hash maps keyed by the ids the engine and its front-ends hand out
//! themselves (operations, launches, copies), with a one-multiply hash
//! instead of SipHash: gpumuxd's core and the CUDA device look such ids up
//! several times per kernel, and SipHash was about a tenth of the core's
//! instructions per kernel of a chain (callgrind, issue 35). No client
//! chooses these keys, so flooding one bucket on purpose is not a concern
//! here; maps keyed by what a client names keep their ordered or SipHash
//! maps. Iteration order differs from SipHash's, which is random per map
//! (`RandomState`): nothing may depend on it either way.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FxHash's step (rustc's hasher): fold each word in with a rotate, xor and multiply.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by the core's or the engine's own ids (module doc).
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A set of the core's or the engine's own ids (module doc).
pub type IdSet<K> = std::collections::HashSet<K, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash_of(x: impl Hash) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(x)
    }

    #[test]
    fn sequential_ids_spread_over_the_high_bits_and_the_map_works() {
        // hashbrown picks a bucket group from the high bits: ids 0..1024 must not share them.
        let tops: std::collections::HashSet<u64> = (0u64..1024).map(|i| hash_of(i) >> 57).collect();
        assert!(tops.len() > 100, "only {} distinct top-7-bit values for 1024 ids", tops.len());
        let mut m: IdMap<u64, u64> = IdMap::default();
        for i in 0..10_000u64 {
            m.insert(i, i * 2);
        }
        assert!((0..10_000u64).all(|i| m.get(&i) == Some(&(i * 2))));
        assert_eq!(m.remove(&7), Some(14));
        assert_eq!(m.len(), 9_999);
        assert_ne!(hash_of([1u8, 2, 3].as_slice()), hash_of([1u8, 2, 4].as_slice()));
    }
}

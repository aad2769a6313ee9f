//! The pool of a core's split regions (`core/split.rs`): one shared pinned
//! region per split launch, kept when the split ends for the next one,
//! since every GPU's device pinned it the first time it saw it and a new
//! region costs that pinning again.
//!
//! Kept for ever, the pool only grew: a split larger than every kept region
//! made a new one and the smaller ones stayed, as did one per split that ran
//! at the same time, each pinned on every GPU. Now a region unused for
//! [`KEEP_IDLE`] is released, and when the pool passes [`KEEP_BYTES`] the
//! least recently used regions go until it is back within it (the region
//! just given back stays, whatever its size: the next split of that size
//! finds it pinned). The core unregisters what is released from its device
//! and has every other core do the same (`CoreMsg::SplitRegionGone`), and
//! logs it.

use crate::shm::ShmRegion;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A kept region unused this long is released.
pub(super) const KEEP_IDLE: Duration = Duration::from_secs(60);
/// The most bytes of regions kept (besides the one just given back): room
/// for a few clients' splits under way at once to find their regions pinned
/// the next time (a 1 GiB pin took 716 ms on the H100 machine), far below
/// the host memory of a machine with GPUs.
pub(super) const KEEP_BYTES: u64 = 4 << 30;

/// Kept regions and when each was last given back (module doc).
pub(super) struct RegionPool {
    kept: Vec<(Arc<ShmRegion>, Instant)>,
    keep_idle: Duration,
    keep_bytes: u64,
}

impl Default for RegionPool {
    fn default() -> RegionPool {
        RegionPool::new(KEEP_IDLE, KEEP_BYTES)
    }
}

impl RegionPool {
    /// A pool that releases regions idle for `keep_idle`, and keeps at most `keep_bytes`.
    pub(super) fn new(keep_idle: Duration, keep_bytes: u64) -> RegionPool {
        RegionPool { kept: Vec::new(), keep_idle, keep_bytes }
    }

    /// The smallest kept region of at least `bytes` bytes, taken out of the pool.
    pub(super) fn take(&mut self, bytes: u64) -> Option<Arc<ShmRegion>> {
        let fits = self.kept.iter().enumerate().filter(|(_, (r, _))| r.len() as u64 >= bytes);
        let (i, _) = fits.min_by_key(|(_, (r, _))| r.len())?;
        Some(self.kept.swap_remove(i).0)
    }

    /// Keeps `region` (its split ended at `now`); returns the regions that
    /// now leave the pool, least recently used first, for the caller to
    /// release: those idle past the limit, then, while the pool holds more
    /// than its bound, the oldest others.
    pub(super) fn give_back(&mut self, region: Arc<ShmRegion>, now: Instant) -> Vec<Arc<ShmRegion>> {
        let mut gone = self.expire(now);
        self.kept.sort_by_key(|(_, at)| *at);
        while !self.kept.is_empty() && self.bytes() + region.len() as u64 > self.keep_bytes {
            gone.push(self.kept.remove(0).0);
        }
        self.kept.push((region, now));
        gone
    }

    /// Takes out the regions unused for the idle limit at `now`.
    pub(super) fn expire(&mut self, now: Instant) -> Vec<Arc<ShmRegion>> {
        let idle = self.keep_idle;
        let (old, kept): (Vec<_>, Vec<_>) =
            self.kept.drain(..).partition(|(_, at)| now.saturating_duration_since(*at) >= idle);
        self.kept = kept;
        old.into_iter().map(|(r, _)| r).collect()
    }

    /// When the next region becomes idle for the limit, if any is kept.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.kept.iter().map(|(_, at)| *at + self.keep_idle).min()
    }

    /// The bytes of the regions kept.
    pub(super) fn bytes(&self) -> u64 {
        self.kept.iter().map(|(r, _)| r.len() as u64).sum()
    }

    /// How many regions are kept.
    pub(super) fn len(&self) -> usize {
        self.kept.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(bytes: usize) -> Arc<ShmRegion> {
        crate::backend::pieces::staging_region(bytes).expect("a memfd region")
    }

    /// A long run of splits of random sizes (1-64 MiB regions), up to 4 at
    /// a time, never keeps more than the bound plus the region just given
    /// back, and a pool left alone empties after the idle limit. Without the
    /// bound it kept every size it ever made, one per concurrent split.
    #[test]
    fn a_long_run_of_splits_keeps_the_pool_within_its_bound() {
        const MIB: u64 = 1 << 20;
        let mut pool = RegionPool::new(Duration::from_secs(60), 16 * MIB);
        let t0 = Instant::now();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let (mut made, mut released, mut most) = (0u64, 0u64, 0u64);
        let mut out: Vec<Arc<ShmRegion>> = Vec::new();
        for step in 0..2_000u64 {
            let now = t0 + Duration::from_millis(step);
            if out.len() < 4 && (out.is_empty() || rand(2) == 0) {
                let bytes = MIB << rand(7);
                let r = pool.take(bytes).unwrap_or_else(|| {
                    made += 1;
                    region(bytes as usize)
                });
                assert!(r.len() as u64 >= bytes);
                out.push(r);
            } else {
                let r = out.swap_remove(rand(out.len() as u64) as usize);
                let last = r.len() as u64;
                released += pool.give_back(r, now).len() as u64;
                assert!(pool.bytes() <= (16 * MIB).max(last), "{} bytes kept", pool.bytes());
            }
            most = most.max(pool.bytes());
        }
        assert!(released > 0 && made > 4, "the run made {made} regions and released {released}");
        assert!(most <= 64 * MIB, "at most the largest region alone past the bound: {most}");
        for r in out.drain(..) {
            pool.give_back(r, t0 + Duration::from_secs(3));
        }
        // Given back between 0 and 3 s: none idle for 60 s at 59 s, all at 63 s.
        assert!(pool.expire(t0 + Duration::from_secs(59)).is_empty());
        let due = pool.next_expiry().expect("regions kept");
        assert!(due >= t0 + Duration::from_secs(60) && due <= t0 + Duration::from_secs(63), "{:?}", due - t0);
        let kept = pool.len();
        assert_eq!(pool.expire(t0 + Duration::from_secs(63)).len(), kept);
        assert_eq!((pool.len(), pool.bytes(), pool.next_expiry()), (0, 0, None), "every region went after 60 s idle");
    }

    /// The smallest region that fits is taken; the region just given back
    /// stays even alone past the bound, and the least recently used go first.
    #[test]
    fn the_smallest_fit_is_taken_and_the_least_recently_used_go_first() {
        let mut pool = RegionPool::new(Duration::from_secs(60), 3 << 20);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert!(pool.give_back(region(1 << 20), at(0)).is_empty());
        assert!(pool.give_back(region(2 << 20), at(1)).is_empty());
        assert_eq!(pool.bytes(), 3 << 20);
        // A third region passes the bound: the oldest (1 MiB) goes.
        let gone = pool.give_back(region(1 << 20), at(2));
        assert_eq!(gone.iter().map(|r| r.len()).collect::<Vec<_>>(), vec![1 << 20]);
        assert_eq!(pool.take(1000).map(|r| r.len()), Some(1 << 20), "the smallest that fits");
        assert_eq!(pool.take(1 << 20).map(|r| r.len()), Some(2 << 20));
        assert!(pool.take(1).is_none());
        // Alone past the bound: kept, and what was there goes.
        assert!(pool.give_back(region(1 << 20), at(3)).is_empty());
        let gone = pool.give_back(region(4 << 20), at(4));
        assert_eq!((gone.len(), pool.len(), pool.bytes()), (1, 1, 4 << 20));
    }
}

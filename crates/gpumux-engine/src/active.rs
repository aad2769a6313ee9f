//! The engine's active kernels: what it keeps of each (`KernelState`), and
//! the list that holds them in arrival order, with cheap removal and
//! insertion near the front (`ActiveList`).
//!
//! Why not a plain `Vec`: a kernel finishes near the front of the arrival
//! order (FCFS runs the oldest first), and `Vec::remove(0)` shifts every
//! kernel behind it. With 10^5 processes waiting that made a run cost
//! O(processes²). Here removed kernels leave a gap at the front that is
//! closed once it is as large as the live part, so an operation costs the
//! distance to the nearer end, amortised. The slice and its order are exactly
//! what a `Vec` with `insert`/`remove` would hold.

use crate::device::SavedBlock;
use crate::ids::{KernelId, LaunchId, OpId, Slot};
use crate::kernel::KernelDesc;
use crate::ranges::BlockRanges;
use crate::time::Nanos;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// What the engine keeps of an active kernel: its identity and what is left
/// of it. Who holds SMs for it is in the SM table; its process's priority is
/// in the process table (`crate::view` puts them together for policies).
#[derive(Clone, Debug)]
pub(crate) struct KernelState {
    pub id: KernelId,
    /// The stream operation it is, passed to the device with each launch.
    pub op: OpId,
    /// The process whose stream it heads.
    pub slot: Slot,
    /// When it arrived (`ArrivalOrder`); the list is sorted by it.
    pub arrival: Nanos,
    pub desc: Arc<KernelDesc>,
    /// Occupancy on this device.
    pub blocks_per_sm: u32,
    /// Seeds the device's per-block timing (`StreamOp::Kernel`).
    pub time_key: u64,
    /// Blocks not handed to any launch.
    pub pending: BlockRanges,
    /// Context-switched blocks not handed to any launch.
    pub saved: Vec<SavedBlock>,
    /// Launches that have not ended.
    pub launches: Launches,
    /// The launch that can still issue blocks (a new SM grows it).
    pub live: Option<LiveLaunch>,
}

/// A launch that can still issue blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LiveLaunch {
    pub id: LaunchId,
    /// Blocks (and saved contexts) it was started with: an upper bound on
    /// what it has left.
    pub blocks: u64,
}

/// A kernel's launches that have not ended, in the order they started:
/// almost always one, held in the value; more (a kernel grown after a
/// retreat, its blocks run by several launches) go to a vector. A `Vec`
/// allocated at every kernel's first launch and freed at its end, one of
/// the two allocations per launch left in the engine (issue 35's callgrind).
#[derive(Clone, Debug, Default)]
pub(crate) struct Launches {
    /// The oldest; `None` only when there is none at all.
    first: Option<LaunchId>,
    /// The others, oldest first.
    more: Vec<LaunchId>,
}

impl Launches {
    /// Adds the newest launch.
    pub fn push(&mut self, id: LaunchId) {
        match self.first {
            None => self.first = Some(id),
            Some(_) => self.more.push(id),
        }
    }

    /// Keeps the launches for which `keep` holds, in their order.
    pub fn retain(&mut self, mut keep: impl FnMut(LaunchId) -> bool) {
        let keep_first = self.first.is_some_and(&mut keep);
        self.more.retain(|&l| keep(l));
        if !keep_first {
            self.first = if self.more.is_empty() { None } else { Some(self.more.remove(0)) };
        }
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Oldest first.
    pub fn iter(&self) -> impl Iterator<Item = LaunchId> + '_ {
        self.first.into_iter().chain(self.more.iter().copied())
    }
}

/// Smallest front gap worth compacting (below it a compaction costs more
/// than it saves).
const MIN_GAP: usize = 64;

/// A sequence with `Vec`'s `insert` and `remove`, fast near both ends.
pub(crate) struct ActiveList<T> {
    /// `v[head..]` are the live items; `v[..head]` are stale copies of
    /// removed ones, dropped at the next compaction.
    v: Vec<T>,
    head: usize,
}

impl<T> Default for ActiveList<T> {
    fn default() -> Self {
        ActiveList { v: Vec::new(), head: 0 }
    }
}

impl<T> ActiveList<T> {
    /// Inserts `k` at position `at` of the slice (`at <= len`).
    pub fn insert(&mut self, at: usize, k: T) {
        let len = self.len();
        assert!(at <= len, "insert at {at} beyond {len} active kernels");
        if at == len {
            self.v.push(k);
        } else if self.head > 0 && at < len / 2 {
            // Step into the gap and rotate the new kernel into place.
            self.head -= 1;
            self.v[self.head] = k;
            self.v[self.head..=self.head + at].rotate_left(1);
        } else {
            self.v.insert(self.head + at, k);
        }
    }

    /// Removes the item at position `at` of the slice and returns it. Near
    /// the front the item stays in the gap, where it is lent out until the
    /// list is next changed and dropped at a later compaction: a clone of a
    /// finished kernel to return by value, its `Arc` and vectors copied and
    /// later dropped twice over, was ~100 instructions a launch of issue 35's
    /// 8 clients (callgrind).
    pub fn remove(&mut self, at: usize) -> Removed<'_, T> {
        let len = self.len();
        assert!(at < len, "remove at {at} of {len} active kernels");
        if at >= len / 2 {
            return Removed::Owned(self.v.remove(self.head + at));
        }
        // Compacted before the removal, not after it, so that the item
        // removed is still in the gap to be lent out.
        if self.head >= MIN_GAP && self.head * 2 >= self.v.len() {
            self.v.drain(..self.head);
            self.head = 0;
        }
        // Rotate it to the front of the live part and leave it in the gap.
        self.v[self.head..=self.head + at].rotate_right(1);
        self.head += 1;
        Removed::Stale(&self.v[self.head - 1])
    }
}

/// An item [`ActiveList::remove`] took out: moved out of the list, or lent
/// from the gap where it waits to be dropped.
pub(crate) enum Removed<'a, T> {
    Owned(T),
    Stale(&'a T),
}

impl<T> Deref for Removed<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        match self {
            Removed::Owned(t) => t,
            Removed::Stale(t) => t,
        }
    }
}

impl<T> Deref for ActiveList<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v[self.head..]
    }
}

impl<T> DerefMut for ActiveList<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.v[self.head..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any sequence of inserts and removes leaves the same slice as a Vec.
        #[test]
        fn behaves_like_a_vec(ops in proptest::collection::vec((any::<bool>(), 0usize..1000), 0..600)) {
            let (mut list, mut model) = (ActiveList::default(), Vec::new());
            for (n, (insert, pos)) in ops.into_iter().enumerate() {
                // Mostly inserts, so the list grows past the compaction threshold.
                if insert || n % 3 != 0 || model.is_empty() {
                    let at = pos % (model.len() + 1);
                    list.insert(at, n as u64);
                    model.insert(at, n as u64);
                } else {
                    let at = pos % model.len();
                    prop_assert_eq!(*list.remove(at), model.remove(at));
                }
                prop_assert_eq!(&list[..], &model[..]);
            }
        }
    }

    proptest! {
        /// Any sequence of pushes and retains leaves the launches a Vec would hold.
        #[test]
        fn launches_behave_like_a_vec(ops in proptest::collection::vec((any::<bool>(), 0u64..8), 0..200)) {
            let (mut list, mut model) = (Launches::default(), Vec::new());
            for (n, (push, modulus)) in ops.into_iter().enumerate() {
                if push {
                    list.push(LaunchId(n as u64));
                    model.push(LaunchId(n as u64));
                } else {
                    let keep = |l: LaunchId| !l.0.is_multiple_of(modulus + 1);
                    list.retain(keep);
                    model.retain(|&l| keep(l));
                }
                prop_assert_eq!(list.iter().collect::<Vec<_>>(), model.clone());
                prop_assert_eq!(list.is_empty(), model.is_empty());
            }
        }
    }

    #[test]
    fn front_removals_compact_the_gap() {
        let mut list = ActiveList::default();
        for i in 0..1000u64 {
            list.insert(i as usize, i);
        }
        for i in 0..900 {
            assert_eq!(*list.remove(0), i);
        }
        assert_eq!(list.len(), 100);
        assert!(list.v.len() < 2 * 100 + MIN_GAP, "gap not closed: {} slots for 100", list.v.len());
        assert_eq!(&list[..], &(900..1000).collect::<Vec<_>>()[..]);
    }
}

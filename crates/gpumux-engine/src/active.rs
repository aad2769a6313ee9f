//! The engine's active kernels in arrival order, as one slice that policies
//! read, with cheap removal and insertion near the front.
//!
//! Why not a plain `Vec`: a kernel finishes near the front of the arrival
//! order (FCFS runs the oldest first), and `Vec::remove(0)` shifts every
//! kernel behind it. With 10^5 processes waiting that made a run cost
//! O(processes²). Here removed kernels leave a gap at the front that is
//! closed once it is as large as the live part, so an operation costs the
//! distance to the nearer end, amortised. The slice and its order are exactly
//! what a `Vec` with `insert`/`remove` would hold.

use crate::policy::ActiveKernel;
use std::ops::{Deref, DerefMut};

/// Smallest front gap worth compacting (below it a compaction costs more
/// than it saves).
const MIN_GAP: usize = 64;

#[derive(Default)]
pub struct ActiveList {
    /// `v[head..]` are the active kernels; `v[..head]` are stale copies of
    /// removed ones, dropped at the next compaction.
    v: Vec<ActiveKernel>,
    head: usize,
}

impl ActiveList {
    pub fn new() -> Self {
        Self::default()
    }

    /// Inserts `k` at position `at` of the slice (`at <= len`).
    pub fn insert(&mut self, at: usize, k: ActiveKernel) {
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

    /// Removes and returns the kernel at position `at` of the slice.
    pub fn remove(&mut self, at: usize) -> ActiveKernel {
        let len = self.len();
        assert!(at < len, "remove at {at} of {len} active kernels");
        if at >= len / 2 {
            return self.v.remove(self.head + at);
        }
        // Rotate it to the front of the live part and leave it in the gap.
        self.v[self.head..=self.head + at].rotate_right(1);
        let k = self.v[self.head].clone();
        self.head += 1;
        if self.head >= MIN_GAP && self.head * 2 >= self.v.len() {
            self.v.drain(..self.head);
            self.head = 0;
        }
        k
    }
}

impl Deref for ActiveList {
    type Target = [ActiveKernel];
    fn deref(&self) -> &[ActiveKernel] {
        &self.v[self.head..]
    }
}

impl DerefMut for ActiveList {
    fn deref_mut(&mut self) -> &mut [ActiveKernel] {
        &mut self.v[self.head..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{KernelId, ProcessId};
    use crate::kernel::{KernelDesc, KernelShape};
    use crate::smset::SmSet;
    use proptest::prelude::*;
    use std::sync::Arc;

    fn kernel(id: u64) -> ActiveKernel {
        ActiveKernel {
            id: KernelId(id),
            process: ProcessId(0),
            process_name: Arc::from("p"),
            priority: 0,
            weight: 1.0,
            arrival: 0,
            desc: Arc::new(KernelDesc::new("k", KernelShape::new(1, 32, 16))),
            blocks_per_sm: 1,
            pending_blocks: 1,
            saved_blocks: 0,
            running: SmSet::EMPTY,
            leaving: SmSet::EMPTY,
            incoming: 0,
            live_launch: None,
            live_launch_blocks: 0,
        }
    }

    fn ids(s: &[ActiveKernel]) -> Vec<u64> {
        s.iter().map(|k| k.id.0).collect()
    }

    proptest! {
        /// Any sequence of inserts and removes leaves the same slice as a Vec.
        #[test]
        fn behaves_like_a_vec(ops in proptest::collection::vec((any::<bool>(), 0usize..1000), 0..600)) {
            let (mut list, mut model) = (ActiveList::new(), Vec::new());
            for (n, (insert, pos)) in ops.into_iter().enumerate() {
                // Mostly inserts, so the list grows past the compaction threshold.
                if insert || n % 3 != 0 || model.is_empty() {
                    let at = pos % (model.len() + 1);
                    list.insert(at, kernel(n as u64));
                    model.insert(at, n as u64);
                } else {
                    let at = pos % model.len();
                    let k = list.remove(at);
                    prop_assert_eq!(k.id.0, model.remove(at));
                }
                prop_assert_eq!(ids(&list), model.clone());
            }
        }
    }

    #[test]
    fn front_removals_compact_the_gap() {
        let mut list = ActiveList::new();
        for i in 0..1000 {
            list.insert(i as usize, kernel(i));
        }
        for i in 0..900 {
            assert_eq!(list.remove(0).id.0, i);
        }
        assert_eq!(list.len(), 100);
        assert!(list.v.len() < 2 * 100 + MIN_GAP, "gap not closed: {} slots for 100", list.v.len());
        assert_eq!(ids(&list), (900..1000).collect::<Vec<_>>());
    }
}

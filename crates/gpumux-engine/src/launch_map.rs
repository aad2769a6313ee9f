//! The engine's launches that have not ended, by id (who owns each).
//!
//! A sorted list, not a `BTreeMap`: launch ids are given out in increasing
//! order and a launch mostly ends before those started after it, so an
//! insert is a push at the back, a removal is near the front (where
//! [`ActiveList`] removes cheaply) and a lookup is a binary search over the
//! few launches in flight. The map's insert and remove, with a node
//! allocated and freed now and then, were ~300 instructions a launch of
//! issue 35's 8 clients (callgrind).

use crate::active::ActiveList;
use crate::ids::LaunchId;

/// Values by launch id, in id order.
pub(crate) struct LaunchMap<V> {
    list: ActiveList<(LaunchId, V)>,
}

impl<V> Default for LaunchMap<V> {
    fn default() -> Self {
        LaunchMap { list: ActiveList::default() }
    }
}

impl<V: Clone> LaunchMap<V> {
    /// Sets `id`'s value; returns the one it replaces.
    pub fn insert(&mut self, id: LaunchId, value: V) -> Option<V> {
        // The usual case: a new launch, after every one in flight.
        if self.list.last().is_none_or(|e| e.0 < id) {
            let end = self.list.len();
            self.list.insert(end, (id, value));
            return None;
        }
        match self.position(id) {
            Ok(i) => Some(std::mem::replace(&mut self.list[i].1, value)),
            Err(i) => {
                self.list.insert(i, (id, value));
                None
            }
        }
    }

    /// `id`'s value.
    pub fn get(&self, id: LaunchId) -> Option<&V> {
        self.position(id).ok().map(|i| &self.list[i].1)
    }

    /// Takes `id` out; returns its value.
    pub fn remove(&mut self, id: LaunchId) -> Option<V> {
        let i = self.position(id).ok()?;
        Some(self.list.remove(i).1.clone())
    }

    fn position(&self, id: LaunchId) -> Result<usize, usize> {
        self.list.binary_search_by_key(&id, |e| e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        /// Any sequence of inserts (mostly new ids, as the engine gives them
        /// out; some again or out of order), lookups and removes answers as
        /// a `BTreeMap` does.
        #[test]
        fn answers_as_a_btree_map(ops in proptest::collection::vec((0u8..4, 0u64..300), 0..800)) {
            let (mut map, mut model) = (LaunchMap::default(), BTreeMap::new());
            let mut next = 0u64;
            for (n, (op, id)) in ops.into_iter().enumerate() {
                match op {
                    0 | 1 => {
                        let id = if op == 0 { next += 1; next + 1_000 } else { id };
                        prop_assert_eq!(map.insert(LaunchId(id), n), model.insert(LaunchId(id), n));
                    }
                    2 => {
                        // Mostly the oldest in flight, as launches end.
                        let id = model.keys().next().filter(|_| id % 3 != 0).copied().unwrap_or(LaunchId(id));
                        prop_assert_eq!(map.remove(id), model.remove(&id));
                    }
                    _ => prop_assert_eq!(map.get(LaunchId(id)), model.get(&LaunchId(id))),
                }
            }
            for (id, v) in &model {
                prop_assert_eq!(map.get(*id), Some(v));
            }
            prop_assert_eq!(map.list.len(), model.len());
        }
    }
}

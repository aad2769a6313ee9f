//! Which queued kernel holds which CUDA stream (issue 35). A run's next
//! kernel is queued only on the stream its kernel before it is on, held by
//! the run: its launch, or, once that launch ended, the run's first queued
//! kernel (`take_stream`). Each post looked for that kernel by a walk of
//! every kernel queued or seen ended (up to ~160 in one client's chain),
//! once per kernel of the chain; this map finds it in one look.
//!
//! **Exact.** A queued kernel gets a stream only from `take_stream`, and
//! keeps it until it leaves the queued map (adopted, or dropped to the
//! orphans); each of those notes it here. A look is checked against the
//! entry itself (still queued, holding that stream, of that run); a look
//! that finds none, or one that fails the check, walks as before, so a
//! stale or missing note costs a walk, never a different answer. A stream
//! (an owned handle, never copied) has one holder at most, so the kernel
//! found is the one the walk would find. Unit tests compare every look
//! with the walk over seeded runs.

use super::Ahead;
use crate::runtime::Stream;
use gpumux_engine::id_map::IdMap;
use gpumux_engine::ids::OpId;

/// The queued kernel holding each stream, by the stream's handle (module doc).
#[derive(Default)]
pub(in crate::client) struct StreamHolders {
    by_stream: IdMap<usize, OpId>,
}

impl StreamHolders {
    /// Queued kernel `op` was handed `stream` (a handle).
    pub(super) fn held(&mut self, stream: usize, op: OpId) {
        self.by_stream.insert(stream, op);
    }

    /// Queued kernel `op` left the queued map; `a` is its entry.
    pub(super) fn left(&mut self, op: OpId, a: &Ahead) {
        if let Some(s) = a.stream.as_ref().map(|s| s.raw as usize) {
            if self.by_stream.get(&s) == Some(&op) {
                self.by_stream.remove(&s);
            }
        }
    }

    /// The stream `stream` as held by a queued kernel of run `chain`, if
    /// one holds it: what `walk` finds, by one look when the note holds.
    pub(super) fn find<'a>(&self, ahead: &'a IdMap<OpId, Ahead>, stream: usize, chain: u64) -> Option<&'a Stream> {
        let noted = self.by_stream.get(&stream).and_then(|op| ahead.get(op)).filter(|a| a.chain == chain);
        match noted.and_then(|a| a.stream.as_ref()).filter(|s| s.raw as usize == stream) {
            Some(s) => Some(s),
            None => walk(ahead, stream, chain),
        }
    }
}

/// The walk [`StreamHolders::find`] replaces.
fn walk(ahead: &IdMap<OpId, Ahead>, stream: usize, chain: u64) -> Option<&Stream> {
    ahead.values().filter(|a| a.chain == chain).filter_map(|a| a.stream.as_ref()).find(|s| s.raw as usize == stream)
}

#[cfg(test)]
mod tests {
    use super::super::test_support;
    use super::super::test_support::xorshift;
    use super::*;

    fn entry(chain: u64) -> Ahead {
        Ahead { chain, ..test_support::entry() }
    }

    /// A stream with a made-up handle, never destroyed (no driver here):
    /// every one made is forgotten at the end of the test.
    fn fake(raw: usize) -> Stream {
        Stream { raw: raw as cudarc::driver::sys::CUstream, priority: 0 }
    }

    #[test]
    fn a_look_finds_what_the_walk_finds() {
        let (mut hits, mut looks) = (0u32, 0u32);
        let mut gone: Vec<Stream> = Vec::new();
        for seed in 1..=100u64 {
            let mut below = xorshift(seed);
            let (mut map, mut holders) = (IdMap::<OpId, Ahead>::default(), StreamHolders::default());
            // Streams 1..=6, each owned by at most one place: free, or one entry.
            let mut free: Vec<usize> = (1..=6).collect();
            for step in 0..400u64 {
                let op = OpId(below(30));
                match below(3) {
                    0 if !map.contains_key(&op) => {
                        map.insert(op, entry(below(3)));
                    }
                    1 => {
                        // `take_stream`: a free stream handed to a queued kernel holding none.
                        let Some(a) = map.get_mut(&op).filter(|a| a.stream.is_none()) else { continue };
                        if free.is_empty() {
                            continue;
                        }
                        let s = free.swap_remove(below(free.len() as u64) as usize);
                        a.stream = Some(fake(s));
                        holders.held(s, op);
                    }
                    _ => {
                        // Adopted or dropped: it leaves with its stream, which goes back.
                        let Some(mut a) = map.remove(&op) else { continue };
                        holders.left(op, &a);
                        if let Some(s) = a.stream.take() {
                            free.push(s.raw as usize);
                            gone.push(s);
                        }
                    }
                }
                for s in 0..=7usize {
                    for c in 0..3u64 {
                        let found = holders.find(&map, s, c).map(|x| x.raw as usize);
                        let walked = walk(&map, s, c).map(|x| x.raw as usize);
                        assert_eq!(found, walked, "seed {seed}, step {step}, stream {s}, run {c}");
                        looks += 1;
                        hits += found.is_some() as u32;
                    }
                }
            }
            gone.extend(map.into_values().filter_map(|mut a| a.stream.take()));
        }
        std::mem::forget(gone);
        assert!(hits > 1000 && hits < looks, "found {hits} of {looks} looks: the test saw too little");
    }
}

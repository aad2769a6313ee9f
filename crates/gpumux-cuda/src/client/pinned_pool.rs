//! Host copies pinned ahead of need and reused across moves (issue 39): the
//! mover DMAs an eviction straight into one and a restore straight out of
//! it, with no CPU copy and no pinning on the move's path.
//!
//! Why. Through the pinned ring ([`super::staging`]) every byte is copied
//! once more by the CPU, and host memory bandwidth bounds that copy: 16 copy
//! threads moved 23-33 GB/s out and 36-41 in on the H200 machine, against
//! 55 for the DMA from pinned memory. Pinning each host copy for its move
//! instead (the former `GPUMUX_SWAP_DIRECT=1`) ran slower still, 18.5 and
//! 24.6 GB/s: every move pinned (51.5 GB/s for memory already faulted in,
//! 7.8 for fresh) and unpinned (70 GB/s) all its bytes, one step after
//! another on the mover's thread, before and after the DMA (55 GB/s), so
//! the steps' times added up; and pinning takes the process's memory map
//! and the driver's locks that the device's launching thread needs too,
//! which is the likeliest reason the urgent client lost 36.9 % beside it.
//! Here a host copy is pinned once, while the mover has nothing to move, and
//! kept pinned across evictions and restores.
//!
//! How. The pool keeps pinned host copies that hold no buffer (`free`), and
//! the sizes the mover will need (`want`): a buffer born evicted waits (the
//! eviction that makes its room will need its size), or an eviction went
//! through the ring because no pinned copy fitted (the next one of its size
//! will not). While the mover is idle it grows the pool: a host copy for the
//! next size wanted, then its pieces, faulted in and pinned a few
//! [`PIN_PIECE`]s at a time, so a move sent meanwhile waits for a few pieces
//! at most. An eviction takes the smallest free copy that fits (from its size
//! to twice it), else a new one where the cap has room; its pinned part is
//! DMAed straight, and the rest is pinned on the move's path, overlapping
//! the DMAs ([`super::direct`]), and stays pinned. A restore's copy goes back to the pool, and so
//! does an evicted buffer's copy when its owner frees it. A free copy unused
//! for [`IDLE`] is unpinned and given back to the host.
//!
//! Cost: pinned memory is host memory the OS can neither page out nor move.
//! The pool holds at most its cap ([`PINNED_VAR`] in gpumuxd's environment;
//! the daemon sets it to each GPU's share of `swap_memory` unless it is
//! set), counting both the copies that hold evicted buffers and the free
//! ones. `0` turns it off: every move goes through the ring. When the
//! driver will not pin, the pool logs why and stops growing; moves go
//! through the ring as before.

use super::copy_pool::CopyPool;
use super::host_copy::{HostMem, PinStop, PIN_PIECE};
use crate::error::CudaError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The pool's cap in bytes (a size: `64GiB`, `512 MiB`, `0` for none), in
/// gpumuxd's environment; its device processes inherit it.
pub const PINNED_VAR: &str = "GPUMUX_SWAP_PINNED";

/// A free pinned copy unused this long is given back: holding pinned
/// memory no one moves through costs the host its RAM. Long enough that
/// clients which swap every few seconds keep theirs.
pub(crate) const IDLE: Duration = Duration::from_secs(120);

/// The cap [`PINNED_VAR`] sets; `None`: not set (then no pool: a device made
/// outside gpumuxd pins nothing it was not told to). An unreadable value
/// is logged and means no pool.
pub(crate) fn cap_from_env() -> Option<usize> {
    let v = std::env::var(PINNED_VAR).ok()?;
    match parse_size(&v) {
        Some(n) => Some(n),
        None => {
            tracing::warn!("{PINNED_VAR}={v:?} is not a size (e.g. 64GiB, 512MiB, 0): no pinned host pool");
            None
        }
    }
}

/// `123`, `64GiB`, `64 GB`, `512MiB`, `2 KiB`... in bytes.
pub(crate) fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim();
    let at = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: usize = v[..at].parse().ok()?;
    let unit: usize = match v[at..].trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

/// A copy of `len` bytes fits a range of `size`: from its size to twice it
/// (more would waste as much again). The rule of every host copy reused
/// for an eviction (`HostCopy::fits` too).
pub(crate) fn fits(len: usize, size: usize) -> bool {
    len >= size && len <= size.saturating_mul(2)
}

/// A host copy as the pool's accounting sees it.
pub(crate) trait Region {
    fn len(&self) -> usize;
}

impl Region for HostMem {
    fn len(&self) -> usize {
        HostMem::len(self)
    }
}

/// The pool's accounting (no CUDA, so it is tested anywhere): the cap, the
/// bytes of copies alive that it made (`held`, which a copy gives back when
/// dropped, wherever that is), the free copies and the sizes wanted.
pub(crate) struct Book<R> {
    cap: usize,
    held: Arc<AtomicUsize>,
    free: Vec<(R, Instant)>,
    want: VecDeque<usize>,
}

/// Pieces a step of growth pins ([`PinnedPool::grow_step`]): a move sent
/// meanwhile waits for them (512 MiB, about 10 ms at the rates pinning ran
/// on the H200 machine).
const STEP_PIECES: usize = 4;

/// Sizes remembered as wanted at most: the latest count.
const WANTS: usize = 8;

impl<R: Region> Book<R> {
    pub(crate) fn new(cap: usize) -> Book<R> {
        Book { cap, held: Arc::new(AtomicUsize::new(0)), free: Vec::new(), want: VecDeque::new() }
    }

    /// Bytes of the pool's copies alive, free or holding a buffer.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Bytes of free copies.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free.iter().map(|(r, _)| r.len()).sum()
    }

    /// Counts a new copy of `len` if the cap has room; the copy keeps the
    /// returned counter and takes its `len` off it when dropped.
    pub(crate) fn admit(&mut self, len: usize) -> Option<Arc<AtomicUsize>> {
        let held = self.held();
        (held.checked_add(len)? <= self.cap).then(|| {
            self.held.fetch_add(len, Ordering::AcqRel);
            Arc::clone(&self.held)
        })
    }

    /// The smallest free copy that fits a range of `size` (from its size to
    /// twice it: more would waste as much again), taken out.
    pub(crate) fn take(&mut self, size: usize) -> Option<R> {
        let i =
            self.free.iter().enumerate().filter(|(_, (r, _))| fits(r.len(), size)).min_by_key(|(_, (r, _))| r.len())?.0;
        Some(self.free.swap_remove(i).0)
    }

    /// A copy holds no buffer any more: free from `now`.
    pub(crate) fn put(&mut self, r: R, now: Instant) {
        self.free.push((r, now));
    }

    /// Free copies unused since `idle` before `now`, taken out (dropping
    /// them gives their bytes back).
    pub(crate) fn expire(&mut self, now: Instant, idle: Duration) -> Vec<R> {
        let (old, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.free).into_iter().partition(|(_, since)| now.duration_since(*since) >= idle);
        self.free = keep;
        old.into_iter().map(|(r, _)| r).collect()
    }

    /// A copy of `size` will be needed (the latest [`WANTS`] are kept).
    pub(crate) fn want(&mut self, size: usize) {
        if self.want.len() == WANTS {
            self.want.pop_front();
        }
        self.want.push_back(size);
    }

    /// The next size to make a copy for, taken out: sizes a free copy fits
    /// already, or that the cap has no room for, are dropped.
    pub(crate) fn next_want(&mut self) -> Option<usize> {
        while let Some(size) = self.want.pop_front() {
            let fitted = self.free.iter().any(|(r, _)| fits(r.len(), size));
            let room = self.held().checked_add(size).is_some_and(|n| n <= self.cap);
            if !fitted && room {
                return Some(size);
            }
        }
        None
    }

    /// A free copy `pending` says is not whole yet (to grow next): growing
    /// is using it, so its idle time starts again at `now`.
    pub(crate) fn growing(&mut self, pending: impl Fn(&R) -> bool, now: Instant) -> Option<&mut R> {
        let (r, since) = self.free.iter_mut().find(|(r, _)| pending(r))?;
        *since = now;
        Some(r)
    }

    /// Whether a free copy is not whole yet.
    pub(crate) fn any_growing(&self, pending: impl Fn(&R) -> bool) -> bool {
        self.free.iter().any(|(r, _)| pending(r))
    }
}

/// The pinned pool of one mover (module doc). It lives on the mover's
/// thread, whose context its copies are pinned in.
pub(crate) struct PinnedPool {
    book: Book<HostMem>,
    /// The driver refused to pin: grow no more (logged once).
    broken: bool,
}

impl PinnedPool {
    pub(crate) fn new(cap: usize) -> PinnedPool {
        PinnedPool { book: Book::new(cap), broken: false }
    }

    /// The smallest free copy for a range of `size`, pinned whole or in part.
    pub(crate) fn take(&mut self, size: usize) -> Option<HostMem> {
        self.book.take(size)
    }

    /// A new copy for a range of `size`, not pinned yet (a move pins it on
    /// its path, growth while idle), if the cap has room and pinning works.
    pub(crate) fn fresh(&mut self, size: usize) -> Option<HostMem> {
        if self.broken {
            return None;
        }
        let book = self.book.admit(size)?;
        match HostMem::new(size) {
            Ok(mut m) => {
                m.set_book(book);
                Some(m)
            }
            Err(e) => {
                // No copy to give the count back when dropped: given back here.
                book.fetch_sub(size, Ordering::AcqRel);
                tracing::warn!("no pinned host copy of {size} bytes: {e}");
                None
            }
        }
    }

    /// Whether moves may pin a pool's copy on their path.
    pub(crate) fn grows(&self) -> bool {
        !self.broken
    }

    /// Pinning failed: grow no more (logged once).
    pub(crate) fn fail(&mut self, e: &CudaError) {
        if !self.broken {
            self.broken = true;
            tracing::warn!(
                "pinning host memory failed ({e}); evictions and restores go through the pinned ring \
                 (host copies, {} bytes pinned)",
                self.book.held()
            );
        }
    }

    /// Back into the pool (a restore's copy, an evicted buffer freed); a
    /// copy the pool did not make is dropped.
    pub(crate) fn put(&mut self, m: HostMem) {
        if m.is_pooled() {
            self.book.put(m, Instant::now());
        }
    }

    /// An eviction of `size` will come (or came and went through the ring).
    pub(crate) fn want(&mut self, size: usize) {
        if !self.broken {
            self.book.want(size);
        }
    }

    /// Something to grow while idle.
    pub(crate) fn has_work(&self) -> bool {
        !self.broken && (self.book.any_growing(|m| m.next_pin() > 0) || !self.book.want.is_empty())
    }

    /// One step of growth while the mover is idle: pin the next piece of a
    /// free copy not pinned whole, else make a copy for the next size wanted.
    /// A step pins up to [`STEP_PIECES`] pieces, faulting each next one in on
    /// `pool`'s threads while the one before is pinned.
    pub(crate) fn grow_step(&mut self, pool: &CopyPool) {
        if self.broken {
            return;
        }
        if let Some(m) = self.book.growing(|m| m.next_pin() > 0, Instant::now()) {
            let upto = m.pinned() + STEP_PIECES * PIN_PIECE;
            let pinned = m.pin_upto(upto, pool, |_, _| Ok(()));
            let (len, whole) = (m.len(), m.next_pin() == 0);
            if let Err(PinStop::Pin(e) | PinStop::Dma(e)) = pinned {
                self.fail(&e);
            } else if whole {
                tracing::info!(
                    "pinned host pool: a copy of {} bytes pinned; {} bytes pinned in all, {} free",
                    len,
                    self.book.held(),
                    self.book.free_bytes()
                );
            }
            return;
        }
        let Some(size) = self.book.next_want() else { return };
        if let Some(m) = self.fresh(size) {
            self.book.put(m, Instant::now());
        }
    }

    /// Gives back free copies unused for [`IDLE`].
    pub(crate) fn expire(&mut self) {
        let old = self.book.expire(Instant::now(), IDLE);
        if !old.is_empty() {
            let bytes: usize = old.iter().map(HostMem::len).sum();
            drop(old);
            tracing::info!(
                "pinned host pool: {bytes} bytes unused for {} s given back; {} bytes pinned",
                IDLE.as_secs(),
                self.book.held()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy of `len` counted like a pinned one: gives its bytes back when dropped.
    struct Fake {
        len: usize,
        book: Arc<AtomicUsize>,
    }

    impl Region for Fake {
        fn len(&self) -> usize {
            self.len
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.book.fetch_sub(self.len, Ordering::AcqRel);
        }
    }

    fn make(b: &mut Book<Fake>, len: usize) -> Option<Fake> {
        b.admit(len).map(|book| Fake { len, book })
    }

    const G: usize = 1 << 30;

    #[test]
    fn the_cap_counts_free_copies_and_copies_holding_buffers_until_they_are_dropped() {
        let mut b: Book<Fake> = Book::new(10 * G);
        let a = make(&mut b, 6 * G).expect("6 of 10 GiB");
        assert!(make(&mut b, 5 * G).is_none(), "6 + 5 GiB is past the cap of 10");
        assert_eq!(b.held(), 6 * G, "a refused copy is not counted");
        let c = make(&mut b, 4 * G).expect("6 + 4 GiB is the cap exactly");
        b.put(c, Instant::now());
        assert_eq!((b.held(), b.free_bytes()), (10 * G, 4 * G), "a free copy still counts");
        drop(a); // a buffer's copy dropped where its owner freed it
        assert_eq!(b.held(), 4 * G, "a dropped copy gives its bytes back");
        assert!(make(&mut b, 6 * G).is_some(), "and makes room");
    }

    #[test]
    fn an_eviction_reuses_the_smallest_free_copy_from_its_size_to_twice_it() {
        let mut b: Book<Fake> = Book::new(100 * G);
        let now = Instant::now();
        for len in [8 * G, 3 * G, 5 * G] {
            let f = make(&mut b, len).expect("room");
            b.put(f, now);
        }
        assert!(b.take(9 * G).is_none(), "none holds 9 GiB");
        assert!(b.take(G).is_none(), "3 GiB for 1 would waste twice its size");
        assert_eq!(b.take(4 * G).map(|f| f.len), Some(5 * G), "5 fits 4 (3 is too small, 8 too large)");
        assert_eq!(b.take(3 * G).map(|f| f.len), Some(3 * G), "the smallest that fits");
        let back = b.take(4 * G).map(|f| f.len);
        assert_eq!(back, Some(8 * G), "8 fits 4, the last one");
        assert_eq!((b.free_bytes(), b.held()), (0, 0), "taken copies were dropped: nothing counted");
    }

    #[test]
    fn free_copies_unused_for_the_idle_time_are_given_back_and_used_ones_are_kept() {
        let mut b: Book<Fake> = Book::new(100 * G);
        let t0 = Instant::now();
        let old = make(&mut b, 2 * G).expect("room");
        b.put(old, t0);
        let used = make(&mut b, 3 * G).expect("room");
        b.put(used, t0 + Duration::from_secs(100));
        let gone = b.expire(t0 + Duration::from_secs(119), IDLE);
        assert!(gone.is_empty(), "nothing idle for 120 s yet");
        let gone = b.expire(t0 + Duration::from_secs(130), IDLE);
        assert_eq!(gone.iter().map(|f| f.len).collect::<Vec<_>>(), vec![2 * G], "the one idle since t0");
        drop(gone);
        assert_eq!((b.held(), b.free_bytes()), (3 * G, 3 * G), "given back: only the used one is pinned");
        // A copy still growing is in use: its idle time starts again.
        let grown = b.growing(|f| f.len == 3 * G, t0 + Duration::from_secs(200)).map(|f| f.len);
        assert_eq!(grown, Some(3 * G));
        assert!(b.expire(t0 + Duration::from_secs(300), IDLE).is_empty(), "grown 100 s ago: kept");
        assert_eq!(b.expire(t0 + Duration::from_secs(320), IDLE).len(), 1, "idle 120 s since: given back");
        assert_eq!(b.held(), 0, "nothing pinned");
    }

    #[test]
    fn a_size_wanted_is_grown_once_and_not_past_the_cap() {
        let mut b: Book<Fake> = Book::new(10 * G);
        b.want(4 * G);
        b.want(20 * G);
        assert_eq!(b.next_want(), Some(4 * G));
        let f = make(&mut b, 4 * G).expect("room");
        b.put(f, Instant::now());
        b.want(4 * G);
        assert_eq!(b.next_want(), None, "4 GiB: a free copy fits it; 20 GiB: past the cap");
        for k in 0..2 * WANTS {
            b.want(k + 1);
        }
        let mut n = 0;
        while b.next_want().is_some() {
            n += 1;
        }
        assert_eq!(n, WANTS, "only the latest sizes wanted are remembered");
    }

    #[test]
    fn sizes_are_read_with_their_units() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("64GiB"), Some(64 << 30));
        assert_eq!(parse_size(" 512 MiB "), Some(512 << 20));
        assert_eq!(parse_size("90 GB"), Some(90_000_000_000));
        assert_eq!(parse_size("12 parsecs"), None);
        assert_eq!(parse_size("GiB"), None);
    }
}

//! Pinned host memory kept ahead of need and reused across moves (issue 39):
//! the mover DMAs an eviction straight into it and a restore straight out
//! of it, with no CPU copy and no pinning on the move's path.
//!
//! Why. Through the pinned ring ([`super::staging`]) every byte is copied
//! once more by the CPU, and host memory bandwidth bounds that copy: 16 copy
//! threads moved 23-33 GB/s out and 36-41 in on the H200 machine, against
//! 55 for the DMA from pinned memory. Pinning each host copy for its move
//! instead (the former `GPUMUX_SWAP_DIRECT=1`) ran slower still, 18.5 and
//! 24.6 GB/s: pinning and unpinning every move's bytes added up with the
//! DMA, and took locks the device's launching thread needs too. And memory
//! pinned on a move's path must be faulted in first: fresh host memory
//! pinned at 6 GB/s, which held the first evictions of a cold start to
//! 25-35 GB/s on average while later ones, into memory pinned ahead, ran at
//! the link's 55.
//!
//! How. The pool is made of **chunks** of [`CHUNK`] bytes, each its own
//! mapping pinned as one registration, so any buffer's host copy can be
//! made of them ([`super::swap::HostCopy`]: its bytes laid end to end over
//! a list of chunks, one DMA per chunk each way), and the pool can be grown
//! before any buffer's size is known. A copy's tail shorter than half a
//! chunk is a piece of its own size, pinned on the move's path (small
//! buffers would otherwise take a whole chunk each).
//!
//! The pool grows towards a **level** while the mover has nothing to move:
//! two chunks a step, pinned (and so faulted in) by the driver, so a move
//! sent meanwhile waits for one step (tens of milliseconds). The device sets the level ([`Book::set_level`]): from its
//! start, [`AHEAD_VAR`] (0 unless set); once oversubscription is possible
//! (`ClientDevice::update_ahead`), the bytes of its address-stable buffers
//! if more; at most the cap. So the first eviction finds its chunks pinned. A level
//! below what the pool holds gives free chunks back at once (the clients
//! left). An eviction takes free chunks (pinned whole first), and where
//! none is free, new ones while the cap has room, pinned on its path; a
//! restore's chunks go back to the pool, and so do those of a buffer freed
//! while evicted. Free chunks unused for [`IDLE`] are unpinned and given
//! back, and the level drops with them.
//!
//! Cost: pinned memory is host memory the OS can neither page out nor move.
//! The pool holds at most its cap ([`PINNED_VAR`] in gpumuxd's environment;
//! the daemon sets it to each GPU's share of `swap_memory` unless it is
//! set), counting both the chunks that hold evicted buffers and the free
//! ones. `0` turns it off: every move goes through the ring. When the
//! driver will not pin, the pool logs why and stops growing; moves go
//! through the ring as before.

use super::copy_pool::CopyPool;
use super::host_copy::{HostMem, PinStop, PIN_PIECE};
use crate::error::CudaError;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of one chunk of the pool: one mapping, one registration, one DMA
/// each way. A move of 90 GB is 700 DMAs of 2.4 ms each at the link's rate
/// (a few microseconds each to queue), and a copy wastes less than a chunk.
pub(crate) const CHUNK: usize = PIN_PIECE;

/// Bytes the pool grows to from the device's start, before any client
/// allocates, per GPU (a size, in gpumuxd's environment; default 0: it grows
/// only once oversubscription is possible). What a cold start's evictions
/// need to run at the link's rate: the bytes its swapping clients will hold
/// in host copies (growth, at the 6-7 GB/s fresh memory pins at, does not
/// keep up with exchanges every few seconds).
pub const AHEAD_VAR: &str = "GPUMUX_SWAP_AHEAD";

/// The pool's cap in bytes (a size: `64GiB`, `512 MiB`, `0` for none), in
/// gpumuxd's environment; its device processes inherit it.
pub const PINNED_VAR: &str = "GPUMUX_SWAP_PINNED";

/// A free pinned chunk unused this long is given back: holding pinned
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

/// The bytes [`AHEAD_VAR`] says to grow from the start (0 when it is not
/// set; an unreadable value is logged and means 0).
pub(crate) fn ahead_from_env() -> usize {
    let Ok(v) = std::env::var(AHEAD_VAR) else { return 0 };
    parse_size(&v).unwrap_or_else(|| {
        tracing::warn!("{AHEAD_VAR}={v:?} is not a size (e.g. 64GiB, 512MiB, 0): nothing pinned from the start");
        0
    })
}

/// The device memory the daemon hands out, bytes (gpumuxd sets it from
/// `--device-memory` for its device processes), where it is less than the
/// device's: when oversubscription is possible.
pub const DEVICE_MEMORY_VAR: &str = "GPUMUX_DEVICE_MEMORY";

/// What [`DEVICE_MEMORY_VAR`] says, if it is set and readable.
pub(crate) fn device_memory_from_env() -> Option<usize> {
    std::env::var(DEVICE_MEMORY_VAR).ok().and_then(|v| parse_size(&v))
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

/// A chunk (or a copy's tail) as the pool's accounting sees it.
pub(crate) trait Region {
    fn len(&self) -> usize;
    /// Pinned whole: a move DMAs all of it straight.
    fn whole(&self) -> bool;
}

impl Region for HostMem {
    fn len(&self) -> usize {
        HostMem::len(self)
    }
    fn whole(&self) -> bool {
        self.next_pin() == 0
    }
}

/// The pool's accounting (no CUDA, so it is tested anywhere): the cap, the
/// bytes of chunks alive that it made (`held`, which a chunk gives back when
/// dropped, wherever that is), the free chunks and the level to grow to.
pub(crate) struct Book<R> {
    cap: usize,
    held: Arc<AtomicUsize>,
    free: Vec<(R, Instant)>,
    /// Bytes to hold, chunks in copies and free ones ([`Book::set_level`]).
    level: usize,
}

/// Chunks a step of growth makes and pins ([`PinnedPool::grow_step`]): a
/// move sent meanwhile waits for them (256 MiB, about 40 ms at the 6-7 GB/s
/// that pinning fresh memory ran at on the H200 machines).
const STEP_CHUNKS: usize = 2;

impl<R: Region> Book<R> {
    #[cfg(test)]
    pub(crate) fn new(cap: usize) -> Book<R> {
        Book::counting(cap, Arc::new(AtomicUsize::new(0)))
    }

    /// A book whose count of bytes held is `held` (read elsewhere too).
    pub(crate) fn counting(cap: usize, held: Arc<AtomicUsize>) -> Book<R> {
        Book { cap, held, free: Vec::new(), level: 0 }
    }

    /// Bytes of the pool's chunks alive, free or holding a buffer.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Bytes of free chunks.
    pub(crate) fn free_bytes(&self) -> usize {
        self.free.iter().map(|(r, _)| r.len()).sum()
    }

    /// The level the pool grows to.
    pub(crate) fn level(&self) -> usize {
        self.level
    }

    /// Counts a new chunk of `len` if the cap has room; the chunk keeps the
    /// returned counter and takes its `len` off it when dropped.
    pub(crate) fn admit(&mut self, len: usize) -> Option<Arc<AtomicUsize>> {
        let held = self.held();
        (held.checked_add(len)? <= self.cap).then(|| {
            self.held.fetch_add(len, Ordering::AcqRel);
            Arc::clone(&self.held)
        })
    }

    /// Up to `n` free chunks, those pinned whole first, taken out.
    pub(crate) fn take(&mut self, n: usize) -> Vec<R> {
        // Whole ones last in the list: taken first.
        self.free.sort_by_key(|(r, _)| r.whole());
        let keep = self.free.len().saturating_sub(n);
        self.free.split_off(keep).into_iter().rev().map(|(r, _)| r).collect()
    }

    /// A chunk holds no buffer any more: free from `now`.
    pub(crate) fn put(&mut self, r: R, now: Instant) {
        self.free.push((r, now));
    }

    /// Grow to hold `bytes` (at most the cap); held beyond it, free chunks
    /// are taken out (dropping them gives their bytes back).
    pub(crate) fn set_level(&mut self, bytes: usize) -> Vec<R> {
        self.level = bytes.min(self.cap);
        let mut gone = Vec::new();
        let mut held = self.held();
        while held > self.level {
            let Some((r, _)) = self.free.pop() else { break };
            held -= r.len();
            gone.push(r);
        }
        gone
    }

    /// Whether one more chunk of `len` is to be made: below the level, and
    /// the cap has room.
    pub(crate) fn below_level(&self, len: usize) -> bool {
        let held = self.held();
        held < self.level && held.checked_add(len).is_some_and(|n| n <= self.cap)
    }

    /// Free chunks unused since `idle` before `now`, taken out (dropping
    /// them gives their bytes back); the level drops by them, so that they
    /// are not grown again.
    pub(crate) fn expire(&mut self, now: Instant, idle: Duration) -> Vec<R> {
        let (old, keep): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.free).into_iter().partition(|(_, since)| now.duration_since(*since) >= idle);
        self.free = keep;
        if !old.is_empty() {
            // Held still counts them until the caller drops them.
            let bytes: usize = old.iter().map(|(r, _)| r.len()).sum();
            self.level = self.level.min(self.held().saturating_sub(bytes));
        }
        old.into_iter().map(|(r, _)| r).collect()
    }

    /// A free chunk `pending` says is not whole yet (to grow next): growing
    /// is using it, so its idle time starts again at `now`.
    pub(crate) fn growing(&mut self, pending: impl Fn(&R) -> bool, now: Instant) -> Option<&mut R> {
        let (r, since) = self.free.iter_mut().find(|(r, _)| pending(r))?;
        *since = now;
        Some(r)
    }

    /// Whether a free chunk is not whole yet.
    pub(crate) fn any_growing(&self, pending: impl Fn(&R) -> bool) -> bool {
        self.free.iter().any(|(r, _)| pending(r))
    }
}

/// What a copy of `size` bytes is made of: whole chunks, and a tail of its
/// own size when the rest is shorter than half a chunk (a whole chunk would
/// waste more than it holds).
pub(crate) fn layout(size: usize) -> (usize, usize) {
    chunk_layout(size, CHUNK)
}

/// The rule of `layout` for chunks of `chunk` bytes (> 0): how many whole
/// chunks, and the tail's bytes (0: none). The simulated device's host
/// copies follow it too, with smaller chunks.
pub fn chunk_layout(size: usize, chunk: usize) -> (usize, usize) {
    let chunk = chunk.max(1);
    let (n, rest) = (size / chunk, size % chunk);
    if rest >= chunk.div_ceil(2) {
        (n + 1, 0)
    } else {
        (n, rest)
    }
}

/// The growth under way towards the level, for its log line.
struct Growth {
    start: Instant,
    held: usize,
    /// CPU time of this process and of the mover's thread at the start.
    cpu: (Duration, Duration),
}

/// CPU time used so far by the whole process, and by the calling thread.
fn cpu_times() -> (Duration, Duration) {
    let of = |who| {
        // SAFETY: an out-pointer to a local.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::getrusage(who, &mut u) } != 0 {
            return Duration::ZERO;
        }
        let t = |v: libc::timeval| Duration::new(v.tv_sec.max(0) as u64, (v.tv_usec.max(0) as u32) * 1000);
        t(u.ru_utime) + t(u.ru_stime)
    };
    (of(libc::RUSAGE_SELF), of(libc::RUSAGE_THREAD))
}

/// The pinned pool of one mover (module doc). It lives on the mover's
/// thread, whose context its chunks are pinned in.
pub(crate) struct PinnedPool {
    book: Book<HostMem>,
    /// The driver refused to pin: grow no more (logged once).
    broken: bool,
    growth: Option<Growth>,
}

impl PinnedPool {
    /// A pool of at most `cap` bytes, counting what it holds in `held`
    /// (which the device's thread reads: [`super::mover::Mover::pinned_held`]).
    pub(crate) fn new(cap: usize, held: Arc<AtomicUsize>) -> PinnedPool {
        PinnedPool { book: Book::counting(cap, held), broken: false, growth: None }
    }

    /// Chunks for a copy of `size` bytes ([`layout`]): free ones, pinned
    /// whole first, then new ones (pinned on the move's path) while the
    /// cap has room. Fewer bytes than `size` when the cap is reached (the
    /// rest goes through the ring); none when the pool is off or broken.
    pub(crate) fn take(&mut self, size: usize) -> Vec<HostMem> {
        if self.broken {
            return Vec::new();
        }
        let (n, tail) = layout(size);
        let mut got = self.book.take(n);
        while got.len() < n {
            match self.fresh(CHUNK) {
                Some(m) => got.push(m),
                None => break,
            }
        }
        if got.len() == n && tail > 0 {
            got.extend(self.fresh(tail));
        }
        got
    }

    /// A new chunk (or tail) of `len`, not pinned yet (a move pins it on its
    /// path, growth while idle), if the cap has room and pinning works.
    fn fresh(&mut self, len: usize) -> Option<HostMem> {
        if self.broken {
            return None;
        }
        let book = self.book.admit(len)?;
        match HostMem::new(len) {
            Ok(mut m) => {
                m.set_book(book);
                Some(m)
            }
            Err(e) => {
                // No chunk to give the count back when dropped: given back here.
                book.fetch_sub(len, Ordering::AcqRel);
                tracing::warn!("no pinned host chunk of {len} bytes: {e}");
                None
            }
        }
    }

    /// Whether moves may pin a pool's chunk on their path.
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

    /// Back into the pool (a restore's chunks, an evicted buffer freed); a
    /// tail, or memory the pool did not make, is dropped.
    pub(crate) fn put(&mut self, m: HostMem) {
        if m.is_pooled() && m.len() == CHUNK {
            self.book.put(m, Instant::now());
        }
    }

    /// The level to grow to (module doc): free chunks past it are given back now.
    pub(crate) fn set_level(&mut self, bytes: usize) {
        let gone = self.book.set_level(bytes);
        if !gone.is_empty() {
            let n: usize = gone.iter().map(HostMem::len).sum();
            drop(gone);
            tracing::info!(
                "pinned host pool: {n} free bytes given back (level {} bytes); {} bytes pinned",
                self.book.level(),
                self.book.held()
            );
        }
    }

    /// Something to grow while idle.
    pub(crate) fn has_work(&self) -> bool {
        !self.broken && (self.book.any_growing(|m| m.next_pin() > 0) || self.book.below_level(CHUNK))
    }

    /// One step of growth while the mover is idle: pin the rest of a free
    /// chunk not pinned whole, else make up to [`STEP_CHUNKS`] chunks towards
    /// the level and pin them ([`pin_all`]). Logs the growth's rate and CPU
    /// time when the level is reached.
    pub(crate) fn grow_step(&mut self, pool: &CopyPool) {
        if self.broken {
            return;
        }
        if self.growth.is_none() {
            self.growth = Some(Growth { start: Instant::now(), held: self.book.held(), cpu: cpu_times() });
        }
        if let Some(m) = self.book.growing(|m| m.next_pin() > 0, Instant::now()) {
            let len = m.len();
            if let Err(PinStop::Pin(e) | PinStop::Dma(e)) = m.pin_upto(len, pool, |_, _| Ok(())) {
                self.fail(&e);
            }
        } else {
            let mut made = Vec::new();
            while made.len() < STEP_CHUNKS && self.book.below_level(CHUNK) {
                match self.fresh(CHUNK) {
                    Some(m) => made.push(m),
                    None => break,
                }
            }
            if let Err(e) = pin_all(&mut made, pool) {
                self.fail(&e);
            }
            let now = Instant::now();
            for m in made {
                self.book.put(m, now);
            }
        }
        if !self.has_work() {
            self.grown();
        }
    }

    /// Logs a growth that reached its level (or stopped).
    fn grown(&mut self) {
        let Some(g) = self.growth.take() else { return };
        let bytes = self.book.held().saturating_sub(g.held);
        if bytes == 0 {
            return;
        }
        let secs = g.start.elapsed().as_secs_f64();
        let (process, thread) = cpu_times();
        tracing::info!(
            "pinned host pool grown ahead by {bytes} bytes in {:.1} ms ({:.1} GB/s; CPU {:.2} s on the mover's thread, \
             {:.2} s in the device process meanwhile); {} bytes pinned, {} free, level {}",
            secs * 1e3,
            bytes as f64 / secs.max(1e-9) / 1e9,
            thread.saturating_sub(g.cpu.1).as_secs_f64(),
            process.saturating_sub(g.cpu.0).as_secs_f64(),
            self.book.held(),
            self.book.free_bytes(),
            self.book.level()
        );
    }

    /// Gives back free chunks unused for [`IDLE`].
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

/// Pins new chunks whole, one registration each; the driver faults their
/// pages in as it pins them (fresh memory pinned at 6.7 GB/s on the H200
/// machines, on this thread). Faulting the next chunk in on the copy pool
/// while one is pinned (`HostMem::pin_upto`'s overlap) may be faster where
/// `MADV_POPULATE_WRITE` works; not measured apart (the first GPU runs of
/// this pool were held to one step of growth by a bug in `Book::expire`).
fn pin_all(made: &mut [HostMem], pool: &CopyPool) -> Result<(), CudaError> {
    for m in made {
        // Its pages are faulted in by the pinning below, not by the copy pool.
        m.mark_written();
        let len = m.len();
        if let Err(PinStop::Pin(e) | PinStop::Dma(e)) = m.pin_upto(len, pool, |_, _| Ok(())) {
            return Err(e);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk of `len` counted like a pinned one: gives its bytes back when dropped.
    struct Fake {
        len: usize,
        whole: bool,
        book: Arc<AtomicUsize>,
    }

    impl Region for Fake {
        fn len(&self) -> usize {
            self.len
        }
        fn whole(&self) -> bool {
            self.whole
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.book.fetch_sub(self.len, Ordering::AcqRel);
        }
    }

    fn make(b: &mut Book<Fake>, len: usize, whole: bool) -> Option<Fake> {
        b.admit(len).map(|book| Fake { len, whole, book })
    }

    /// Grows `b` the way the mover does while idle: chunks until the level.
    fn grow(b: &mut Book<Fake>) -> usize {
        let mut n = 0;
        while b.below_level(CHUNK) {
            let f = make(b, CHUNK, true).expect("below the level and the cap");
            b.put(f, Instant::now());
            n += 1;
        }
        n
    }

    const G: usize = 1 << 30;

    #[test]
    fn the_cap_counts_free_chunks_and_chunks_holding_buffers_until_they_are_dropped() {
        let mut b: Book<Fake> = Book::new(10 * CHUNK);
        let held: Vec<Fake> = (0..6).map(|_| make(&mut b, CHUNK, true).expect("6 of 10")).collect();
        assert!(make(&mut b, 5 * CHUNK, true).is_none(), "6 + 5 chunks is past the cap of 10");
        assert_eq!(b.held(), 6 * CHUNK, "a refused chunk is not counted");
        let c = make(&mut b, 4 * CHUNK, true).expect("6 + 4 is the cap exactly");
        b.put(c, Instant::now());
        assert_eq!((b.held(), b.free_bytes()), (10 * CHUNK, 4 * CHUNK), "a free chunk still counts");
        drop(held); // a buffer's chunks dropped where its owner freed it
        assert_eq!(b.held(), 4 * CHUNK, "dropped chunks give their bytes back");
    }

    #[test]
    fn a_copy_is_whole_chunks_and_a_tail_shorter_than_half_a_chunk() {
        assert_eq!(layout(CHUNK), (1, 0));
        assert_eq!(layout(3 * CHUNK + 5), (3, 5), "5 bytes past 3 chunks: a tail of 5");
        assert_eq!(layout(3 * CHUNK + CHUNK / 2), (4, 0), "half a chunk past 3: a fourth chunk");
        assert_eq!(layout(2 << 20), (0, 2 << 20), "a 2 MiB buffer takes no chunk");
        assert_eq!(layout(90_000_000_000), (90_000_000_000 / CHUNK + 1, 0));
        for size in [1, CHUNK - 1, CHUNK + 1, 7 * CHUNK + CHUNK / 2 - 1, 90 * G + 12345] {
            let (n, tail) = layout(size);
            let room = n * CHUNK + tail;
            assert!(room >= size && room - size < CHUNK / 2 + 1, "{size}: {n} chunks and {tail} hold {room}");
        }
    }

    #[test]
    fn the_pool_grows_to_its_level_before_any_size_is_known_and_serves_any_size_from_it() {
        let mut b: Book<Fake> = Book::new(64 * CHUNK);
        assert_eq!(grow(&mut b), 0, "no level: nothing grown");
        b.set_level(20 * CHUNK + 1);
        assert_eq!(grow(&mut b), 21, "to the level, in whole chunks");
        // Two evictions of sizes never seen find their chunks free.
        let (n1, _) = layout(7 * CHUNK + 3 * CHUNK / 4);
        let a = b.take(n1);
        let (n2, _) = layout(13 * CHUNK);
        let c = b.take(n2);
        assert_eq!((a.len(), c.len()), (8, 13), "every chunk taken was free");
        assert!(a.iter().chain(&c).all(|f| f.len == CHUNK && f.whole));
        assert_eq!(b.free_bytes(), 0);
        assert!(b.take(1).is_empty(), "none left");
        let now = Instant::now();
        for f in a {
            b.put(f, now); // restored: back into the pool
        }
        let again = b.take(3);
        assert_eq!(again.len(), 3, "reused");
        assert_eq!(grow(&mut b), 0, "at the level: the chunks in copies count");
        drop((again, c)); // freed while evicted, say: their bytes are given back
        assert_eq!(grow(&mut b), 16, "and grown again to the level");
    }

    /// The mover looks for chunks to give back after every step of growth:
    /// when none is idle long enough, the level stays (it was clamped to
    /// what was held, and growth stopped after one step on the GPU).
    #[test]
    fn looking_for_idle_chunks_between_steps_of_growth_leaves_the_level_alone() {
        let mut b: Book<Fake> = Book::new(64 * CHUNK);
        b.set_level(6 * CHUNK);
        let t0 = Instant::now();
        for step in 0..3 {
            assert!(b.below_level(CHUNK), "step {step}: below the level");
            for _ in 0..2 {
                let f = make(&mut b, CHUNK, true).expect("room");
                b.put(f, t0);
            }
            assert!(b.expire(t0 + Duration::from_secs(1), IDLE).is_empty());
            assert_eq!(b.level(), 6 * CHUNK, "step {step}: the level stays");
        }
        assert!(!b.below_level(CHUNK), "grown to the level in three steps");
        assert_eq!(b.held(), 6 * CHUNK);
    }

    #[test]
    fn chunks_pinned_whole_are_taken_first() {
        let mut b: Book<Fake> = Book::new(64 * CHUNK);
        let now = Instant::now();
        for whole in [false, true, false, true] {
            let f = make(&mut b, CHUNK, whole).expect("room");
            b.put(f, now);
        }
        let got = b.take(2);
        assert!(got.iter().all(|f| f.whole), "the two pinned whole");
        assert!(b.take(2).iter().all(|f| !f.whole));
    }

    #[test]
    fn the_level_is_bounded_by_the_cap_and_a_lower_one_gives_free_chunks_back_at_once() {
        let mut b: Book<Fake> = Book::new(10 * CHUNK);
        b.set_level(100 * CHUNK);
        assert_eq!(b.level(), 10 * CHUNK, "never past the cap");
        assert_eq!(grow(&mut b), 10);
        let in_copy = b.take(4);
        let gone = b.set_level(6 * CHUNK);
        assert_eq!(gone.len(), 4, "10 held, 6 wanted: 4 free chunks go");
        drop(gone);
        assert_eq!(b.held(), 6 * CHUNK);
        let gone = b.set_level(0);
        assert_eq!(gone.len(), 2, "the free ones; those holding a buffer stay");
        drop(gone);
        assert_eq!(b.held(), 4 * CHUNK, "only the chunks holding a buffer are left");
        drop(in_copy); // the clients left
        assert_eq!((b.held(), b.free_bytes()), (0, 0), "nothing pinned");
    }

    #[test]
    fn free_chunks_unused_for_the_idle_time_are_given_back_and_not_grown_again() {
        let mut b: Book<Fake> = Book::new(100 * G);
        let t0 = Instant::now();
        b.set_level(3 * CHUNK);
        grow(&mut b);
        let used = b.take(1);
        let gone = b.expire(t0 + Duration::from_secs(119), IDLE);
        assert!(gone.is_empty(), "nothing idle for 120 s yet");
        for f in used {
            b.put(f, t0 + Duration::from_secs(100));
        }
        let gone = b.expire(t0 + Duration::from_secs(130), IDLE);
        assert_eq!(gone.len(), 2, "the two idle since t0");
        drop(gone);
        assert_eq!((b.held(), b.free_bytes()), (CHUNK, CHUNK), "the used one is kept");
        assert_eq!(grow(&mut b), 0, "the level dropped with them");
        // A chunk still growing is in use: its idle time starts again.
        assert!(b.growing(|f| f.len == CHUNK, t0 + Duration::from_secs(200)).is_some());
        assert!(b.expire(t0 + Duration::from_secs(300), IDLE).is_empty(), "grown 100 s ago: kept");
        assert_eq!(b.expire(t0 + Duration::from_secs(320), IDLE).len(), 1, "idle 120 s since: given back");
        assert_eq!(b.held(), 0, "nothing pinned");
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

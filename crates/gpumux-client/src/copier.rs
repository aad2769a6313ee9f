//! The staging copies' `memcpy`, split across a few threads (issue 35).
//!
//! A copy through the shared region costs one `memcpy` per byte in the
//! client, between the caller's memory and the region: on one thread that
//! is 6-10 GB/s, a fraction of what the bus moves (50+ GB/s on an H100's
//! PCIe 5.0), so it bounded the whole copy. A [`Copier`] splits each chunk's
//! `memcpy` into page-aligned parts: the calling thread copies the first,
//! helper threads the others, and the call returns once every part is there.
//!
//! The helpers are started on the first copy large enough to be split
//! ([`PARALLEL_FROM`]) and live as long as the client. Between chunks they
//! poll a little ([`POLL`], so the next chunk of a copy finds them awake),
//! then sleep on a condition variable. Copies smaller than [`PARALLEL_FROM`],
//! and every copy of a copier of one thread, are a plain `memcpy` here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Copies below this go on the calling thread alone: waking the helpers
/// costs more than they save.
pub const PARALLEL_FROM: usize = 1 << 20;

/// The most threads a copier uses, the caller's included.
pub const MAX_THREADS: usize = 16;

/// How long a helper polls for the next part before it sleeps: the chunks
/// of one copy come a request apart (tens of µs), and a wake-up from a
/// futex costs about as much again.
const POLL: Duration = Duration::from_micros(200);

/// The parts of a split copy start at multiples of this (whole pages).
const ALIGN: usize = 4096;

/// The threads a copier uses when not told: `GPUMUX_COPY_THREADS` if set
/// (1 to [`MAX_THREADS`]), else half the machine's hardware threads, 1 to
/// [`DEFAULT_MAX_THREADS`]. Measured on an H100 machine's host (16 cores),
/// one thread moves 7-8 GB/s, 4 threads 26-30 and 6-8 threads 34-40: a copy
/// is bound by memory bandwidth long before it has every core.
pub fn default_threads() -> usize {
    if let Some(n) =
        std::env::var("GPUMUX_COPY_THREADS").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n > 0)
    {
        return n.min(MAX_THREADS);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).clamp(1, DEFAULT_MAX_THREADS)
}

/// The most threads [`default_threads`] picks.
pub const DEFAULT_MAX_THREADS: usize = 8;

/// One copy's parts, for the helpers.
#[derive(Clone, Copy, Default)]
struct Job {
    src: usize,
    dst: usize,
    len: usize,
    /// Bytes per part (a multiple of [`ALIGN`]); part `i` starts at `i * part`.
    part: usize,
}

impl Job {
    /// Part `i`'s range, if it has bytes.
    fn range(&self, i: usize) -> Option<(usize, usize)> {
        let start = i.checked_mul(self.part)?;
        (start < self.len).then(|| (start, self.part.min(self.len - start)))
    }

    /// Copies part `i`.
    ///
    /// # Safety
    /// `src` and `dst` are valid for `len` bytes and do not overlap, and no
    /// one else writes `dst`'s part `i` meanwhile.
    unsafe fn copy_part(&self, i: usize) {
        if let Some((start, n)) = self.range(i) {
            // SAFETY: inside both ranges (the caller's guarantee).
            unsafe { std::ptr::copy_nonoverlapping((self.src + start) as *const u8, (self.dst + start) as *mut u8, n) }
        }
    }
}

/// What the caller and the helpers share.
struct Shared {
    /// Bumped for each job (and once more to stop); the helpers poll it.
    epoch: AtomicU64,
    state: Mutex<State>,
    /// A new job (or the stop).
    work: Condvar,
    /// The last helper finished its part.
    finished: Condvar,
}

struct State {
    epoch: u64,
    job: Job,
    /// Helpers not yet done with the current job.
    pending: usize,
    stop: bool,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The helper threads.
struct Pool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts `helpers` threads; `None` if not one started.
    fn start(helpers: usize) -> Option<Pool> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            state: Mutex::new(State { epoch: 0, job: Job::default(), pending: 0, stop: false }),
            work: Condvar::new(),
            finished: Condvar::new(),
        });
        let mut pool = Pool { shared, helpers: Vec::with_capacity(helpers) };
        for i in 1..=helpers {
            let shared = Arc::clone(&pool.shared);
            match std::thread::Builder::new().name(format!("gpumux-copy-{i}")).spawn(move || helper(&shared, i)) {
                Ok(h) => pool.helpers.push(h),
                Err(_) => break,
            }
        }
        (!pool.helpers.is_empty()).then_some(pool)
    }

    /// Copies `len` bytes in `1 + helpers` parts and returns when all are there.
    ///
    /// # Safety
    /// As [`Job::copy_part`], for the whole range.
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, len: usize) {
        let parts = self.helpers.len() + 1;
        let part = len.div_ceil(parts).next_multiple_of(ALIGN);
        let job = Job { src: src as usize, dst: dst as usize, len, part };
        {
            let mut s = lock(&self.shared.state);
            s.epoch += 1;
            s.job = job;
            s.pending = self.helpers.len();
            self.shared.epoch.store(s.epoch, Ordering::Release);
            self.shared.work.notify_all();
        }
        // SAFETY: the caller's guarantee; part 0 is the caller's.
        unsafe { job.copy_part(0) };
        // The helpers' parts must be there before the caller's memory may go.
        let mut s = lock(&self.shared.state);
        while s.pending > 0 {
            s = self.shared.finished.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let mut s = lock(&self.shared.state);
            s.stop = true;
            s.epoch += 1;
            self.shared.epoch.store(s.epoch, Ordering::Release);
            self.shared.work.notify_all();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Helper `index` (part `index` of each job): polls for a new job for
/// [`POLL`], then sleeps until one comes.
fn helper(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let since = Instant::now();
        let mut looks = 0u32;
        while shared.epoch.load(Ordering::Acquire) == seen && since.elapsed() < POLL {
            gpumux_ring::relax(looks);
            looks = looks.saturating_add(1);
        }
        let job = {
            let mut s = lock(&shared.state);
            while s.epoch == seen && !s.stop {
                s = shared.work.wait(s).unwrap_or_else(PoisonError::into_inner);
            }
            if s.stop {
                return;
            }
            seen = s.epoch;
            s.job
        };
        // SAFETY: the caller of `Pool::copy` keeps both ranges valid and
        // untouched until every helper has reported its part (below).
        unsafe { job.copy_part(index) };
        let mut s = lock(&shared.state);
        s.pending -= 1;
        if s.pending == 0 {
            shared.finished.notify_one();
        }
    }
}

/// A `memcpy` on up to `threads` threads (module doc). One per client: its
/// staging copies take turns already.
pub struct Copier {
    threads: usize,
    pool: OnceLock<Option<Pool>>,
}

impl std::fmt::Debug for Copier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copier").field("threads", &self.threads).finish_non_exhaustive()
    }
}

impl Copier {
    /// A copier of `threads` threads (clamped to 1 ..= [`MAX_THREADS`]); none is started yet.
    pub fn new(threads: usize) -> Copier {
        Copier { threads: threads.clamp(1, MAX_THREADS), pool: OnceLock::new() }
    }

    /// The threads it copies with, the caller's included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Copies `src` into `dst` (the same length), split across the threads
    /// when it is at least [`PARALLEL_FROM`] bytes.
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn copy(&self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "a copy between slices of different lengths");
        // SAFETY: two live slices of that length; `&mut` makes them disjoint.
        unsafe { self.copy_raw(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
    }

    /// [`Copier::copy`] between raw ranges.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `len` bytes, they do
    /// not overlap, and nothing else writes `dst` (or `src`) during the call.
    pub(crate) unsafe fn copy_raw(&self, src: *const u8, dst: *mut u8, len: usize) {
        if len >= PARALLEL_FROM && self.threads > 1 {
            if let Some(pool) = self.pool.get_or_init(|| Pool::start(self.threads - 1)) {
                // SAFETY: the caller's guarantee.
                unsafe { pool.copy(src, dst, len) };
                return;
            }
        }
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u32) -> Vec<u8> {
        (0..len).map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed).to_le_bytes()[1]).collect()
    }

    #[test]
    fn parts_cover_the_copy_exactly_on_page_boundaries() {
        for (len, parts) in [(1usize, 4usize), (4096, 4), (4097, 4), (PARALLEL_FROM + 1, 3), (10 << 20, 4), (123, 1)] {
            let part = len.div_ceil(parts).next_multiple_of(ALIGN);
            let job = Job { src: 0, dst: 0, len, part };
            let mut next = 0;
            for i in 0..parts {
                if let Some((start, n)) = job.range(i) {
                    assert_eq!(start, next, "{len} in {parts}: part {i} follows the one before");
                    assert_eq!(start % ALIGN, 0);
                    assert!(n > 0);
                    next += n;
                }
            }
            assert_eq!(next, len, "{len} in {parts}");
            assert_eq!(job.range(parts), None, "no part past the last");
        }
    }

    #[test]
    fn split_copies_are_bitwise_whatever_the_size_and_thread_count() {
        for threads in [1, 2, 3, 4] {
            let copier = Copier::new(threads);
            for len in [0, 1, 4095, PARALLEL_FROM - 1, PARALLEL_FROM, PARALLEL_FROM + 12_345, 5 << 20] {
                let src = pattern(len, threads as u32);
                let mut dst = vec![0u8; len];
                copier.copy(&mut dst, &src);
                assert!(dst == src, "{len} bytes on {threads} threads");
            }
        }
    }

    #[test]
    fn many_copies_in_a_row_each_wait_for_all_their_parts() {
        // Back to back, as a copy's chunks come: a helper that missed a job
        // or finished late would leave stale bytes in some part.
        let copier = Copier::new(4);
        let len = PARALLEL_FROM * 3 + 17;
        let mut dst = vec![0u8; len];
        for round in 0..50u32 {
            let src = pattern(len, round);
            copier.copy(&mut dst, &src);
            assert!(dst == src, "round {round}");
            if round % 10 == 9 {
                // Long enough for the helpers to go to sleep.
                std::thread::sleep(POLL * 3);
            }
        }
    }

    #[test]
    fn threads_are_clamped_and_the_default_is_sane() {
        assert_eq!(Copier::new(0).threads(), 1);
        assert_eq!(Copier::new(1000).threads(), MAX_THREADS);
        let d = default_threads();
        assert!((1..=MAX_THREADS).contains(&d), "{d}");
    }
}

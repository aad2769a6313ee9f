//! A persistent pool of host copy threads for the pinned ring (issue 39,
//! [`super::staging`]).
//!
//! The ring's CPU copies bound both move directions: with 8 threads
//! spawned per 64 MiB chunk, evictions and restores ran at 22-28 GB/s
//! against 55 for the link (H200 machine, 84 GB buffers). Here the threads
//! live as long as the mover, a copy is cut into pieces of [`PIECE`] bytes
//! that the threads (and the caller, which works too) claim one at a time
//! from a shared counter, so a slow thread holds back no one's share, and
//! no thread is spawned per chunk.
//!
//! Fresh host memory (a host copy never written) is faulted in piece by
//! piece with `MADV_POPULATE_WRITE` by the thread that copies the piece,
//! in parallel: one call per 2 MiB instead of one fault per page where the
//! kernel gives no huge pages. A kernel without it (before 5.14) refuses
//! the advice and the copy faults the pages in as before.
//!
//! **Sharing the host.** The pool's threads are the host's to take back:
//! each runs at the lowest CPU priority (`SCHED_BATCH`, nice 19), so the
//! daemon's core, the device's launching thread and the clients run first
//! wherever CPUs are short; and the pool takes a quarter of the cores, at
//! most [`MOST`]. Measured on the H200 x4 machine (64 cores; d805194,
//! `scripts/oversubscribe-gpu.sh`, two 90 GB clients swapping beside an
//! urgent one): 8 threads moved 18.6 GB/s out and 29.6 in, 16 threads 33.3
//! and 40.8; the urgent client lost 16.1 % and 14.8 % of its rate, against
//! 10.3 % beside the same neighbours not swapping, so 16 threads cost it no
//! more than 8.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Bytes a thread claims at a time: one huge page, so that a piece of an
/// aligned host copy ([`super::host_copy`]) is faulted in as one.
pub(crate) const PIECE: usize = 2 << 20;

/// Most threads a pool takes by default (module doc, "Sharing the host").
const MOST: usize = 16;

/// Most threads a pool takes when told ([`COPY_THREADS_VAR`]).
const MOST_TOLD: usize = 32;

/// Sets the threads (the caller included) a pool copies on, in the
/// daemon's environment (its device process inherits it). Not the client
/// library's `GPUMUX_COPY_THREADS`, which sizes a client's own copies.
pub const COPY_THREADS_VAR: &str = "GPUMUX_SWAP_COPY_THREADS";

/// One copy, shared by the threads that work on it.
struct Batch {
    dst: usize,
    /// 0: fault `dst` in only, copy nothing.
    src: usize,
    len: usize,
    /// Fault each piece of `dst` in before writing it.
    populate: bool,
    pieces: usize,
    /// The next piece to claim.
    next: AtomicUsize,
    /// Pieces finished.
    done: AtomicUsize,
}

impl Batch {
    /// Claims and copies pieces until none is left. The caller keeps the
    /// memory borrowed until `done == pieces`, so every piece claimed is
    /// inside live memory.
    fn work(&self, shared: &Shared) {
        loop {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            if k >= self.pieces {
                return;
            }
            let at = k * PIECE;
            let len = PIECE.min(self.len - at);
            let dst = (self.dst + at) as *mut u8;
            if self.populate {
                // Advice only: refused (an old kernel), the copy below faults the pages in.
                // SAFETY: `len` bytes of the caller's mapping at `dst`.
                let _ = unsafe { libc::madvise(dst.cast(), len, libc::MADV_POPULATE_WRITE) };
            }
            if self.src != 0 {
                // SAFETY: disjoint `len`-byte pieces of the caller's two slices (a
                // `&mut` and a `&` in `copy`, so they do not overlap), live until every
                // piece is done.
                unsafe { std::ptr::copy_nonoverlapping((self.src + at) as *const u8, dst, len) };
            }
            if self.done.fetch_add(1, Ordering::AcqRel) + 1 == self.pieces {
                // Taking the lock orders this notice after the caller's check.
                let _guard = shared.state.lock().unwrap_or_else(|p| p.into_inner());
                shared.finished.notify_all();
            }
        }
    }
}

#[derive(Default)]
struct State {
    batch: Option<Arc<Batch>>,
    /// Counts batches, so a thread takes each one once.
    generation: u64,
    quit: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// A new batch, or quit.
    wake: Condvar,
    /// A batch's last piece is done.
    finished: Condvar,
}

/// A batch under way on the pool's threads ([`CopyPool::start_populate`]).
#[must_use = "the memory is borrowed until the batch is waited for"]
pub(crate) struct Pending(Arc<Batch>);

/// The pool (module doc).
pub(crate) struct CopyPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl CopyPool {
    /// A pool of `threads` in all, the caller counted (so `threads - 1` are
    /// started); fewer where a thread cannot start: the caller does their
    /// share.
    pub(crate) fn new(threads: usize) -> CopyPool {
        let shared = Arc::new(Shared::default());
        let mut started = Vec::new();
        for i in 1..threads.max(1) {
            let s = Arc::clone(&shared);
            match std::thread::Builder::new().name(format!("gpumux-copy{i}")).spawn(move || worker(&s)) {
                Ok(t) => started.push(t),
                Err(e) => {
                    tracing::warn!("host copy thread {i} of {threads} did not start ({e}); copying on {i}");
                    break;
                }
            }
        }
        CopyPool { shared, threads: started }
    }

    /// Threads from [`COPY_THREADS_VAR`] (1 to [`MOST_TOLD`]), else a
    /// quarter of the host's cores (the daemon, the device's own threads
    /// and the clients need the rest), at least 2 and at most [`MOST`].
    pub(crate) fn default_threads() -> usize {
        let set = std::env::var(COPY_THREADS_VAR).ok().and_then(|v| v.trim().parse::<usize>().ok());
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        threads_for(set, cores)
    }

    /// Threads copying, the caller counted.
    pub(crate) fn threads(&self) -> usize {
        self.threads.len() + 1
    }

    /// `dst.copy_from_slice(src)` on the pool; `populate`: `dst` is fresh
    /// memory, fault it in first (module doc).
    pub(crate) fn copy(&self, dst: &mut [u8], src: &[u8], populate: bool) {
        assert_eq!(dst.len(), src.len(), "a host copy between slices of different lengths");
        // A `&mut` and a `&` cannot overlap, so neither do the raw pieces made of them.
        self.run(dst.as_mut_ptr() as usize, src.as_ptr() as usize, dst.len(), populate);
    }

    /// Faults `dst` in on the pool (writes nothing).
    pub(crate) fn populate(&self, dst: &mut [u8]) {
        self.run(dst.as_mut_ptr() as usize, 0, dst.len(), true);
    }

    /// Starts faulting `len` bytes at `dst` in on the pool's threads (not
    /// the caller's), so the caller can do something else meanwhile (pin
    /// the piece before); [`CopyPool::wait`] waits for it. With no thread,
    /// or one piece, it is done here, now.
    ///
    /// # Safety
    /// `len` bytes at `dst` must be the caller's mapping, touched by no one
    /// else and no other batch started, until `wait` returns.
    pub(crate) unsafe fn start_populate(&self, dst: *mut u8, len: usize) -> Pending {
        let (batch, handed) = self.start(dst as usize, 0, len, true);
        if !handed {
            batch.work(&self.shared);
        }
        Pending(batch)
    }

    /// Waits for a batch [`CopyPool::start_populate`] started.
    pub(crate) fn wait(&self, p: Pending) {
        self.finish(&p.0);
    }

    /// A batch, handed to the pool's threads if it has more than one piece
    /// and there are threads (`true`); else no one works on it yet.
    fn start(&self, dst: usize, src: usize, len: usize, populate: bool) -> (Arc<Batch>, bool) {
        let pieces = len.div_ceil(PIECE);
        let batch =
            Arc::new(Batch { dst, src, len, populate, pieces, next: AtomicUsize::new(0), done: AtomicUsize::new(0) });
        let handed = pieces > 1 && !self.threads.is_empty();
        if handed {
            let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            st.batch = Some(Arc::clone(&batch));
            st.generation += 1;
            self.shared.wake.notify_all();
        }
        (batch, handed)
    }

    /// Waits until every piece of `batch` is done (the borrowed memory is
    /// then the caller's alone again).
    fn finish(&self, batch: &Batch) {
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        while batch.done.load(Ordering::Acquire) < batch.pieces {
            st = self.shared.finished.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        // Threads that wake late find no piece left to claim.
        st.batch = None;
    }

    /// Runs one batch with the caller working too, and returns when every
    /// piece is done (the borrowed memory is then the caller's alone again).
    fn run(&self, dst: usize, src: usize, len: usize, populate: bool) {
        if len == 0 {
            return;
        }
        let (batch, _) = self.start(dst, src, len, populate);
        batch.work(&self.shared);
        self.finish(&batch);
    }
}

impl Drop for CopyPool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            st.quit = true;
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The pool's size: `told` (1 to [`MOST_TOLD`]), else a quarter of
/// `cores`, 2 to [`MOST`].
fn threads_for(told: Option<usize>, cores: usize) -> usize {
    match told {
        Some(n) => n.clamp(1, MOST_TOLD),
        None => (cores / 4).clamp(2, MOST),
    }
}

/// The calling thread at the lowest CPU priority (module doc, "Sharing the
/// host"); `false`: the kernel refused both (the thread runs as before).
fn lower_own_priority() -> bool {
    // SAFETY: a plain struct; 0 is the only priority SCHED_BATCH takes.
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread on Linux; `param` lives for the call.
    let batch = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } == 0;
    // On Linux, nice is per thread: PRIO_PROCESS with 0 names the calling thread.
    // SAFETY: no pointers; raising one's own nice value needs no privilege.
    let nice = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) } == 0;
    batch || nice
}

/// A pool thread: works on each new batch until told to quit.
fn worker(shared: &Shared) {
    if !lower_own_priority() {
        tracing::debug!("a host copy thread kept its CPU priority (the kernel refused SCHED_BATCH and nice)");
    }
    let mut seen = 0u64;
    loop {
        let batch = {
            let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if st.quit {
                    return;
                }
                if st.generation != seen {
                    seen = st.generation;
                    if let Some(b) = &st.batch {
                        break Arc::clone(b);
                    }
                }
                st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        batch.work(shared);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| ((i * 31 + seed) % 251) as u8).collect()
    }

    #[test]
    fn a_pool_copy_split_into_pieces_is_byte_equal() {
        for threads in [1usize, 2, 5] {
            let pool = CopyPool::new(threads);
            assert!(pool.threads() >= 1 && pool.threads() <= threads, "{} threads of {threads}", pool.threads());
            // Around the piece size, so the last piece is short, whole or alone.
            for len in [0usize, 1, 4095, PIECE - 1, PIECE, PIECE + 1, 7 * PIECE + 12345] {
                let src = pattern(len, threads + len);
                for populate in [false, true] {
                    let mut dst = vec![0xA5u8; len];
                    pool.copy(&mut dst, &src, populate);
                    assert!(dst == src, "{len} bytes on {threads} threads (populate {populate})");
                }
            }
        }
    }

    #[test]
    fn a_pool_copies_batch_after_batch_and_leaves_bytes_outside_alone() {
        let pool = CopyPool::new(4);
        let mut dst = vec![7u8; 9 * PIECE];
        // What `dst` must hold: the same copies made one byte at a time.
        let mut model = dst.clone();
        for round in 0..20 {
            let src = pattern(5 * PIECE + round, round);
            let at = round * 1000;
            pool.copy(&mut dst[at..at + src.len()], &src, round % 2 == 0);
            for (i, &b) in src.iter().enumerate() {
                model[at + i] = b;
            }
            assert!(dst == model, "round {round}");
        }
        assert!(dst[at_end()..].iter().all(|&b| b == 7), "bytes no copy reached are untouched");
    }

    /// The end of the last round's copy above.
    fn at_end() -> usize {
        19 * 1000 + 5 * PIECE + 19
    }

    #[test]
    fn populating_writes_nothing() {
        let pool = CopyPool::new(3);
        let mut m = super::super::host_copy::HostMem::new(5 * PIECE + 3).expect("host memory");
        m.as_mut_slice()[PIECE + 5] = 9;
        pool.populate(m.as_mut_slice());
        let s = m.as_slice();
        assert_eq!(s[PIECE + 5], 9, "a byte written before is kept");
        assert_eq!(s.iter().filter(|&&b| b != 0).count(), 1, "everything else is still zero");
    }

    #[test]
    fn populating_in_the_background_writes_nothing_and_the_pool_copies_after_it() {
        for threads in [1usize, 4] {
            let pool = CopyPool::new(threads);
            let mut m = super::super::host_copy::HostMem::new(7 * PIECE + 5).expect("host memory");
            let n = m.len();
            // SAFETY: `m` is ours, untouched until `wait` returns.
            let p = unsafe { pool.start_populate(m.as_mut_ptr(), n) };
            pool.wait(p);
            assert!(m.as_slice().iter().all(|&b| b == 0), "{threads} threads: populated memory reads zero");
            // The pool takes the next batch as before (the background one left no state behind).
            let src = pattern(n, threads);
            pool.copy(m.as_mut_slice(), &src, false);
            assert!(m.as_slice() == src.as_slice(), "{threads} threads: a copy after a background batch is byte-equal");
        }
    }

    #[test]
    fn the_default_thread_count_is_bounded() {
        let n = CopyPool::default_threads();
        assert!((1..=MOST_TOLD).contains(&n), "{n} threads");
        if std::env::var(COPY_THREADS_VAR).is_err() {
            assert!((2..=MOST).contains(&n), "{n} threads by default");
        }
        // A quarter of the cores, 2 to MOST; what is told, 1 to MOST_TOLD.
        assert_eq!(threads_for(None, 1), 2);
        assert_eq!(threads_for(None, 16), 4);
        assert_eq!(threads_for(None, 64), MOST, "a 64-core host (the H200 x4 machine)");
        assert_eq!(threads_for(None, 256), MOST);
        assert_eq!(threads_for(Some(0), 64), 1);
        assert_eq!(threads_for(Some(16), 4), 16);
        assert_eq!(threads_for(Some(1000), 64), MOST_TOLD);
    }

    #[test]
    fn a_pool_thread_lowers_only_its_own_priority() {
        // SAFETY: reads the calling thread's nice value; errno is not needed.
        let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let (lowered, nice) = std::thread::spawn(|| {
            let lowered = lower_own_priority();
            // SAFETY: as above.
            (lowered, unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) })
        })
        .join()
        .expect("the thread");
        assert!(lowered, "SCHED_BATCH or nice 19 was taken");
        assert_eq!(nice, 19, "the thread runs at nice 19");
        // SAFETY: as above.
        let after = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        assert_eq!(before, after, "the caller's own priority is unchanged");
    }
}

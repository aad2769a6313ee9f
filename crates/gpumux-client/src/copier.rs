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
//! then sleep on a condition variable. Copies smaller than [`PARALLEL_FROM`]
//! are a plain `memcpy` on the calling thread.
//!
//! A copy of many threads takes the machine from everyone else on it: on
//! the H200 machine (16 cores) a client copying 1 GiB from a `Vec` on 8
//! threads made another client's 511 short launches through the daemon
//! 1.41x slower, on 2 threads 1.06x (issue 35, 2026-11-29, 37b13ed). So the
//! copier takes less of it per byte: the parts of a large copy out of the
//! region into the caller's memory are written with non-temporal stores
//! ([`crate::streaming`]: no read of the destination, no cache filled with
//! lines nobody reads), on at most [`DEFAULT_MAX_THREADS`] threads unless
//! told, and the helpers run at a lower priority ([`DEFAULT_NICE`]) so that
//! where the machine's cores are all busy the daemon's threads and other
//! clients run first.
//!
//! Copies into the region keep plain stores ([`Toward`]): the region (32
//! MiB at most) stays in the host's cache between chunks, where the DMA
//! reads it, and streaming its bytes to memory cost a third of the upload's
//! rate on the H200 machine (16.8 against 26.7 GB/s, 2d3d1a2 against its
//! parent, both beside the same chain of launches).
//!
//! **Fewer threads beside others, if asked.** A copier has two counts: all
//! its threads when it copies alone, and the threads beside
//! ([`DEFAULT_BESIDE_THREADS`], 0: all of them) while other clients are
//! busy, which each chunk's reply from the daemon says
//! ([`Copier::set_others_busy`]). 2 beside took the copier's rate beside a
//! chain of short launches from 23.6 / 38.5 to 13.9 / 21.9 GB/s and did
//! not shorten the chain beyond its noise (1.19x, 1.14x against 1.22x,
//! 1.10x its time alone, two calls on the H200, 2026-11-29), so all is
//! the default. The helpers a copy leaves out sleep
//! until one needs them (no polling: each has its own condition
//! variable), so the threads beside are all the copy takes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
/// futex costs about as much again. A polling helper holds a core (and its
/// hyperthread sibling's share) that the daemon's threads may want, but
/// helpers that slept at once measured no better beside a chain of short
/// launches on the H200 (1.18x against 1.15x, within the noise) and moved 9%
/// less up (docs/history/benchmarks.md, e7358da; the switch is in git: f0dceeb,
/// `GPUMUX_COPY_POLL_US`).
const POLL: Duration = Duration::from_micros(200);

/// The parts of a split copy start at multiples of this (whole pages).
const ALIGN: usize = 4096;

/// The threads a copier uses when not told: `GPUMUX_COPY_THREADS` if set
/// (1 to [`MAX_THREADS`]), else half the machine's hardware threads, 1 to
/// [`DEFAULT_MAX_THREADS`]. Measured on an H100 machine's host (16 cores),
/// with plain `memcpy`, one thread moves 7-8 GB/s, 4 threads 26-30 and 6-8
/// threads 34-40: a copy is bound by memory bandwidth long before it has
/// every core.
pub fn default_threads() -> usize {
    if let Some(n) = env_number("GPUMUX_COPY_THREADS").filter(|&n| n > 0) {
        return (n as usize).min(MAX_THREADS);
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / 2).clamp(1, DEFAULT_MAX_THREADS)
}

/// The most threads [`default_threads`] picks: with non-temporal stores a
/// thread moves more (module doc), and each thread more is a core less for
/// the daemon and the other clients.
pub const DEFAULT_MAX_THREADS: usize = 4;

/// The threads a copier uses while the daemon says other clients are busy,
/// unless told (`default_threads_beside`); 0: as many as alone. 2 measured
/// no better for the chain of short launches beside it (module doc, "Fewer
/// threads beside others, if asked"): a client that wants its copies to
/// yield to others sets it.
pub const DEFAULT_BESIDE_THREADS: usize = 0;

/// The threads a copier uses while other clients are busy, when not told:
/// `GPUMUX_COPY_THREADS_BESIDE` if set (0: as many as alone whatever the
/// daemon says, the copier before it had a count beside others, for an
/// A/B; else 1 to [`MAX_THREADS`]), else [`DEFAULT_BESIDE_THREADS`]. Never
/// more than the copier's threads alone ([`Copier::beside`]).
pub fn default_threads_beside() -> usize {
    match env_number("GPUMUX_COPY_THREADS_BESIDE").filter(|&n| n >= 0) {
        Some(n) => (n as usize).min(MAX_THREADS),
        None => DEFAULT_BESIDE_THREADS,
    }
}

/// The nice value helpers take unless `GPUMUX_COPY_NICE` says otherwise (0:
/// the caller's): where every core is busy, the scheduler gives a nice-10
/// thread about a tenth of a nice-0 one's time, so the daemon's threads and
/// other clients' come first and the copy takes what is left.
pub const DEFAULT_NICE: i32 = 10;

/// `var` as a number, if set and one.
fn env_number(var: &str) -> Option<i64> {
    std::env::var(var).ok().and_then(|v| v.trim().parse::<i64>().ok())
}

/// Where a copy's bytes go, which decides its stores (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toward {
    /// Into the shared region, which the device reads by DMA.
    Region,
    /// Out of the region into the caller's memory.
    Caller,
}

impl Toward {
    /// Whether a large copy this way uses non-temporal stores: out of the
    /// region only (module doc). On the H200 the copier before issue 35
    /// (plain stores both ways, on 8 threads at the caller's nice) left the
    /// chain beside it 1.33x slower where these stores on 4 threads at nice 10
    /// left it 1.13-1.19x, and streaming into the region too cost the upload
    /// a third (docs/daemon.md, "A pageable copy beside other clients"); the
    /// switch between the three is in git (f0dceeb, `GPUMUX_COPY_STREAMING`).
    fn streams(self) -> bool {
        self == Toward::Caller
    }
}

/// The helpers' nice value: `GPUMUX_COPY_NICE` (0 to 19), else [`DEFAULT_NICE`].
fn nice_from_env() -> i32 {
    env_number("GPUMUX_COPY_NICE").map_or(DEFAULT_NICE, |n| n.clamp(0, 19) as i32)
}

/// Lowers the calling thread's priority to `nice` (Linux: a thread's own
/// nice value, not the process's). Best effort: raising one's nice value
/// needs no privilege, and a copy at the caller's priority is still right.
fn lower_priority(nice: i32) {
    if nice <= 0 {
        return;
    }
    // SAFETY: plain syscalls on this thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice);
    }
}

/// One copy's parts, for the helpers.
#[derive(Clone, Copy, Default)]
struct Job {
    src: usize,
    dst: usize,
    len: usize,
    /// Bytes per part (a multiple of [`ALIGN`]); part `i` starts at `i * part`.
    part: usize,
    /// Its parts: the caller's and helpers 1 to `parts - 1`'s; the others
    /// sit it out.
    parts: usize,
    /// Non-temporal stores ([`crate::streaming`]).
    streaming: bool,
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
            let (src, dst) = ((self.src + start) as *const u8, (self.dst + start) as *mut u8);
            // SAFETY: inside both ranges (the caller's guarantee).
            unsafe { copy_bytes(src, dst, n, self.streaming) }
        }
    }
}

/// `len` bytes from `src` to `dst`, with non-temporal stores if `streaming`.
///
/// # Safety
/// As [`Copier::copy_raw`].
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize, streaming: bool) {
    if streaming {
        // SAFETY: the caller's guarantee.
        unsafe { crate::streaming::copy(src, dst, len) }
    } else {
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

/// What the caller and the helpers share.
struct Shared {
    /// Bumped for each job (and once more to stop); the helpers poll it.
    epoch: AtomicU64,
    state: Mutex<State>,
    /// A new job for helper `i` (at `i - 1`), or the stop: one each, so that
    /// a job wakes only the helpers it has parts for.
    work: Vec<Condvar>,
    /// The last helper finished its part.
    finished: Condvar,
    /// How long a helper polls for the next job before it sleeps.
    poll: Duration,
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
    /// Starts `helpers` threads at nice value `nice`; `None` if not one started.
    fn start(helpers: usize, nice: i32, poll: Duration) -> Option<Pool> {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            state: Mutex::new(State { epoch: 0, job: Job::default(), pending: 0, stop: false }),
            work: (0..helpers).map(|_| Condvar::new()).collect(),
            finished: Condvar::new(),
            poll,
        });
        let mut pool = Pool { shared, helpers: Vec::with_capacity(helpers) };
        for i in 1..=helpers {
            let shared = Arc::clone(&pool.shared);
            match std::thread::Builder::new().name(format!("gpumux-copy-{i}")).spawn(move || {
                lower_priority(nice);
                helper(&shared, i)
            }) {
                Ok(h) => pool.helpers.push(h),
                Err(_) => break,
            }
        }
        (!pool.helpers.is_empty()).then_some(pool)
    }

    /// Copies `len` bytes in `threads` parts (at most `1 + helpers`), the
    /// caller's and the first helpers', and returns when all are there; the
    /// threads it copied on.
    ///
    /// # Safety
    /// As [`Job::copy_part`], for the whole range.
    unsafe fn copy(&self, src: *const u8, dst: *mut u8, len: usize, streaming: bool, threads: usize) -> usize {
        let parts = threads.clamp(1, self.helpers.len() + 1);
        let part = len.div_ceil(parts).next_multiple_of(ALIGN);
        let job = Job { src: src as usize, dst: dst as usize, len, part, parts, streaming };
        {
            let mut s = lock(&self.shared.state);
            s.epoch += 1;
            s.job = job;
            s.pending = parts - 1;
            self.shared.epoch.store(s.epoch, Ordering::Release);
            for cv in &self.shared.work[..parts - 1] {
                cv.notify_one();
            }
        }
        // SAFETY: the caller's guarantee; part 0 is the caller's.
        unsafe { job.copy_part(0) };
        // The helpers' parts must be there before the caller's memory may go.
        let mut s = lock(&self.shared.state);
        while s.pending > 0 {
            s = self.shared.finished.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        parts
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        {
            let mut s = lock(&self.shared.state);
            s.stop = true;
            s.epoch += 1;
            self.shared.epoch.store(s.epoch, Ordering::Release);
            for cv in &self.shared.work {
                cv.notify_one();
            }
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Helper `index` (part `index` of each job that has one): after a job it
/// polls for the next for its poll time ([`POLL`]), then sleeps until one
/// comes. A job without a part for it (a copy beside other clients, on
/// fewer threads) sends it to sleep at once: polling through a copy it has
/// no part in would take the core it was left out to free.
fn helper(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        let since = Instant::now();
        let mut looks = 0u32;
        while shared.epoch.load(Ordering::Acquire) == seen && since.elapsed() < shared.poll {
            gpumux_ring::relax(looks);
            looks = looks.saturating_add(1);
        }
        let job = {
            let mut s = lock(&shared.state);
            loop {
                if s.stop {
                    return;
                }
                if s.epoch != seen {
                    seen = s.epoch;
                    if index < s.job.parts {
                        break s.job;
                    }
                }
                s = shared.work[index - 1].wait(s).unwrap_or_else(PoisonError::into_inner);
            }
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

/// What a [`Copier`] did: its copies of at least `PARALLEL_FROM` bytes
/// (each chunk of a large staging copy is one), for tests and comparisons
/// (`Client::copy_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Made while the daemon's last word was that no other client was busy.
    pub alone: u64,
    /// Made while it said other clients were busy.
    pub beside: u64,
    /// All of them by the threads they were made on: at index `n`, those
    /// made on `n` threads, the caller's included (index 0 stays 0).
    pub on_threads: [u64; MAX_THREADS + 1],
}

/// A `memcpy` on up to `threads` threads (module doc). One per client: its
/// staging copies take turns already.
pub struct Copier {
    threads: usize,
    /// The threads while other clients are busy (1 ..= `threads`).
    threads_beside: usize,
    /// Whether the daemon's last word was that other clients are busy
    /// ([`Copier::set_others_busy`]).
    others_busy: AtomicBool,
    /// Copies of at least `PARALLEL_FROM` bytes made alone and beside
    /// others, and by the threads they were made on (index: threads).
    alone: AtomicU64,
    beside: AtomicU64,
    on_threads: [AtomicU64; MAX_THREADS + 1],
    /// The helpers' nice value (0: the caller's).
    nice: i32,
    /// How long a helper polls between jobs ([`POLL`]; a test tries 0).
    poll: Duration,
    pool: OnceLock<Option<Pool>>,
}

impl std::fmt::Debug for Copier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copier")
            .field("threads", &self.threads)
            .field("threads_beside", &self.threads_beside)
            .field("nice", &self.nice)
            .finish_non_exhaustive()
    }
}

impl Copier {
    /// A copier of `threads` threads (clamped to 1 ..= [`MAX_THREADS`]),
    /// non-temporal stores toward the caller's memory, its helpers at nice
    /// `GPUMUX_COPY_NICE` (default [`DEFAULT_NICE`]) polling [`POLL`]
    /// between jobs; none is started yet.
    pub fn new(threads: usize) -> Copier {
        Copier::with(threads, nice_from_env())
    }

    /// [`Copier::new`] told the helpers' nice value (0 to 19; 0: the caller's).
    pub fn with(threads: usize, nice: i32) -> Copier {
        let threads = threads.clamp(1, MAX_THREADS);
        Copier {
            threads,
            threads_beside: threads,
            others_busy: AtomicBool::new(false),
            alone: AtomicU64::new(0),
            beside: AtomicU64::new(0),
            on_threads: std::array::from_fn(|_| AtomicU64::new(0)),
            nice: nice.clamp(0, 19),
            poll: POLL,
            pool: OnceLock::new(),
        }
    }

    /// This copier, copying on `threads` threads while other clients are
    /// busy (at most its threads alone; 0: as many as alone). Until told,
    /// it uses all of them whatever [`Copier::set_others_busy`] says.
    pub fn beside(self, threads: usize) -> Copier {
        let threads_beside = if threads == 0 { self.threads } else { threads.clamp(1, self.threads) };
        Copier { threads_beside, ..self }
    }

    /// The threads it copies with, the caller's included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The threads it copies with while other clients are busy ([`Copier::beside`]).
    pub fn threads_beside(&self) -> usize {
        self.threads_beside
    }

    /// What the daemon said with a chunk's reply: `others` other clients
    /// are busy. The copies from now on take [`Copier::threads_beside`]
    /// threads while that is above 0, else all of them.
    pub fn set_others_busy(&self, others: u32) {
        self.others_busy.store(others > 0, Ordering::Relaxed);
    }

    /// What it did so far.
    pub fn stats(&self) -> CopyStats {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CopyStats {
            alone: n(&self.alone),
            beside: n(&self.beside),
            on_threads: std::array::from_fn(|i| n(&self.on_threads[i])),
        }
    }

    /// Copies `src` into `dst` (the same length) toward `toward`, split
    /// across the threads when it is at least [`PARALLEL_FROM`] bytes (and
    /// with non-temporal stores then, if it goes out of the region).
    ///
    /// # Panics
    /// If the lengths differ.
    pub fn copy(&self, toward: Toward, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "a copy between slices of different lengths");
        // SAFETY: two live slices of that length; `&mut` makes them disjoint.
        unsafe { self.copy_raw(src.as_ptr(), dst.as_mut_ptr(), src.len(), toward) }
    }

    /// [`Copier::copy`] between raw ranges.
    ///
    /// # Safety
    /// `src` is valid for reads and `dst` for writes of `len` bytes, they do
    /// not overlap, and nothing else writes `dst` (or `src`) during the call.
    pub(crate) unsafe fn copy_raw(&self, src: *const u8, dst: *mut u8, len: usize, toward: Toward) {
        if len < PARALLEL_FROM {
            // A small copy's bytes are likely read again soon: through the cache.
            // SAFETY: the caller's guarantee.
            return unsafe { copy_bytes(src, dst, len, false) };
        }
        let streaming = toward.streams();
        let beside = self.others_busy.load(Ordering::Relaxed);
        let threads = if beside { self.threads_beside } else { self.threads };
        let mut used = 1;
        // The pool has all the helpers, whatever the first copy's count: the next may want them.
        if threads > 1 {
            if let Some(pool) = self.pool.get_or_init(|| Pool::start(self.threads - 1, self.nice, self.poll)) {
                // SAFETY: the caller's guarantee.
                used = unsafe { pool.copy(src, dst, len, streaming, threads) };
            }
        }
        if used == 1 {
            // SAFETY: the caller's guarantee.
            unsafe { copy_bytes(src, dst, len, streaming) }
        }
        (if beside { &self.beside } else { &self.alone }).fetch_add(1, Ordering::Relaxed);
        self.on_threads[used].fetch_add(1, Ordering::Relaxed);
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
            let job = Job { src: 0, dst: 0, len, part, parts, streaming: false };
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
    fn split_copies_are_bitwise_whatever_the_size_thread_count_and_stores() {
        for (threads, nice) in [(1, 0), (2, 10), (3, 10), (4, 0)] {
            let copier = Copier::with(threads, nice);
            // Plain stores into the region, non-temporal ones out of it.
            for toward in [Toward::Region, Toward::Caller] {
                for len in [0, 1, 4095, PARALLEL_FROM - 1, PARALLEL_FROM, PARALLEL_FROM + 12_345, (5 << 20) + 7] {
                    let src = pattern(len, threads as u32);
                    // Off a page boundary by a few bytes: the streaming head and tail.
                    let mut dst = vec![0u8; len + 3];
                    copier.copy(toward, &mut dst[3..], &src);
                    assert!(dst[3..] == src[..], "{len} bytes {toward:?} on {threads} threads");
                    assert_eq!(dst[..3], [0, 0, 0], "nothing before the destination");
                }
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
            copier.copy(Toward::Caller, &mut dst, &src);
            assert!(dst == src, "round {round}");
            if round % 10 == 9 {
                // Long enough for the helpers to go to sleep.
                std::thread::sleep(POLL * 3);
            }
        }
    }

    /// The nice values of this process's threads named `name`, from /proc.
    fn nice_of_threads_named(name: &str) -> Vec<i64> {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
        tasks
            .flatten()
            .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
            .filter_map(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
                // Fields after the command's closing parenthesis: state is
                // field 3, nice field 19 (proc(5)).
                let rest = &stat[stat.rfind(')')? + 2..];
                rest.split_whitespace().nth(19 - 3)?.parse().ok()
            })
            .collect()
    }

    #[test]
    fn helpers_run_at_the_copiers_nice_value() {
        // 19: a thread may always raise its nice value, whatever the test
        // process runs at; the other tests' copiers use 0 and 10.
        let copier = Copier::with(3, 19);
        let src = pattern(PARALLEL_FROM * 2, 9);
        let mut dst = vec![0u8; src.len()];
        copier.copy(Toward::Region, &mut dst, &src);
        assert!(dst == src);
        // Helper threads are named gpumux-copy-1, -2; other tests' copiers
        // (other nice values) may run beside, so look for this one's value.
        let nices = nice_of_threads_named("gpumux-copy-2");
        if nices.is_empty() {
            eprintln!("SKIPPED helpers_run_at_the_copiers_nice_value: no /proc/self/task here");
            return;
        }
        assert!(nices.contains(&19), "a helper at nice 19 among {nices:?}");
    }

    #[test]
    fn helpers_that_never_poll_still_take_every_job() {
        let copier = Copier { poll: Duration::ZERO, ..Copier::with(3, 0) };
        let len = PARALLEL_FROM * 2 + 5;
        let mut dst = vec![0u8; len];
        for round in 0..20u32 {
            let src = pattern(len, round);
            copier.copy(Toward::Caller, &mut dst, &src);
            assert!(dst == src, "round {round}");
        }
    }

    #[test]
    fn beside_busy_clients_a_copy_takes_the_threads_beside_and_alone_all() {
        let copier = Copier::with(4, 0).beside(2);
        let len = PARALLEL_FROM * 4 + 99;
        let mut dst = vec![0u8; len];
        let mut copy = |round: u32| {
            let src = pattern(len, round);
            copier.copy(Toward::Caller, &mut dst, &src);
            assert!(dst == src, "round {round}");
        };
        // Alone until the daemon says otherwise.
        copy(0);
        copier.set_others_busy(1);
        // The helpers left out must not hold up (or write into) these.
        for round in 1..=5 {
            copy(round);
        }
        copier.set_others_busy(0);
        copy(6);
        // A small copy is the caller's alone and not counted.
        copier.copy(Toward::Region, &mut [0u8; 10], &[1u8; 10]);
        let stats = copier.stats();
        assert_eq!((stats.alone, stats.beside), (2, 5));
        let mut on_threads = [0u64; MAX_THREADS + 1];
        on_threads[4] = 2;
        on_threads[2] = 5;
        assert_eq!(stats.on_threads, on_threads, "alone on 4 threads, beside on 2");
    }

    #[test]
    fn the_threads_beside_are_at_most_those_alone_and_0_means_all() {
        assert_eq!(Copier::with(4, 0).threads_beside(), 4, "not told: all");
        assert_eq!(Copier::with(4, 0).beside(0).threads_beside(), 4);
        assert_eq!(Copier::with(4, 0).beside(9).threads_beside(), 4);
        assert_eq!(Copier::with(4, 0).beside(1).threads_beside(), 1);
        assert_eq!(Copier::with(1, 0).beside(2).threads_beside(), 1);
        // Told all, it copies on all whatever the daemon says (the copier before issue 35's beside count).
        let copier = Copier::with(3, 0).beside(0);
        copier.set_others_busy(2);
        let src = pattern(PARALLEL_FROM * 2, 1);
        let mut dst = vec![0u8; src.len()];
        copier.copy(Toward::Region, &mut dst, &src);
        assert!(dst == src);
        assert_eq!((copier.stats().beside, copier.stats().on_threads[3]), (1, 1));
    }

    #[test]
    fn threads_are_clamped_and_the_default_is_sane() {
        assert_eq!(Copier::new(0).threads(), 1);
        assert_eq!(Copier::new(1000).threads(), MAX_THREADS);
        assert_eq!(Copier::with(2, 50).nice, 19);
        assert_eq!(Copier::with(2, -5).nice, 0);
        assert!(Toward::Caller.streams() && !Toward::Region.streams());
        let d = default_threads();
        assert!((1..=MAX_THREADS).contains(&d), "{d}");
    }
}

//! Buffer moves on a thread of their own (issue 39): evictions and restores
//! of address-stable buffers ([`super::swap`]) are carried out here, in the
//! order they were started, on a non-blocking stream and a pinned ring
//! ([`super::staging`]) of this thread's own, while the device's thread
//! goes on launching every other client's work. An 84 GB move took the
//! device's one thread for seconds, and the urgent client's launches waited
//! behind it (the first GPU run: 32 % of its rate lost).
//!
//! Jobs and their ends cross channels; the device's thread owns the
//! buffers' bookkeeping (mappings, host copies) and applies an end when it
//! takes it ([`super::device::ClientDevice::take_moved`]). A job owns what
//! it moves (the host copy, the physical memory's handle) until it ends,
//! and gives it back with its end, failed or not, so nothing is lost or
//! freed twice.
//!
//! The mover also keeps the pinned host pool ([`super::pinned_pool`]): it
//! grows it while it has nothing to move, a piece at a time, and DMAs
//! straight between the device and the pool's copies.

use super::host_copy::HostMem;
use super::pinned_pool::PinnedPool;
use super::swap::{create, map, HostCopy};
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A move to make.
pub(crate) enum Job {
    /// Copy `size` bytes at `ptr` into `host`, then unmap the range and
    /// release `handle`.
    /// `found`: how long getting `host` took (logged with the move).
    /// `host: None`: the mover takes memory faulted in ahead that fits
    /// (`Prepare`), else fresh memory for a buffer of `bytes`.
    Evict {
        token: u64,
        ptr: u64,
        size: usize,
        bytes: u64,
        handle: cu::CUmemGenericAllocationHandle,
        host: Option<HostCopy>,
        found: Duration,
    },
    /// Create `size` bytes of physical memory on `ordinal`, map them at
    /// `ptr`, copy `host` in (or zero them).
    Restore { token: u64, ptr: u64, size: usize, ordinal: i32, host: HostCopy },
}

/// What the mover is sent: a move, or its host memory's upkeep.
pub(crate) enum Msg {
    Move(Job),
    /// Fault in `len` bytes of host memory on the copy pool and keep them
    /// for an eviction with `host: None`: a buffer born evicted of `len`
    /// waits, and the eviction that makes its room comes later. Faulting
    /// fresh memory in during an eviction held the first evictions of the
    /// GPU check to 5-6 GB/s. No end is reported.
    Prepare {
        len: usize,
    },
    /// Drop memory faulted in ahead beyond `keep` bytes (the bytes of
    /// buffers born evicted still waiting), the largest first. No end.
    Trim {
        keep: usize,
    },
    /// The pinned pool's chunks of a buffer freed while evicted: back into
    /// the pool. No end.
    Recycle(Vec<HostMem>),
    /// The pinned pool's level ([`super::pinned_pool`]): grow to `bytes`
    /// while idle, or give free chunks past it back now. No end.
    Ahead {
        bytes: usize,
    },
}

/// A move that ended, with what it owned.
pub(crate) struct Done {
    pub token: u64,
    pub ptr: u64,
    pub size: usize,
    /// The host copy: filled (an eviction that worked), or still the
    /// buffer's (a restore, which the device's thread keeps as a spare or
    /// puts back as the evicted copy if the restore failed).
    pub host: HostCopy,
    pub what: Ended,
    /// Getting the memory (a restore's create and map), then the copy.
    pub prepared: Duration,
    pub copied: Duration,
    /// A restore of a buffer born evicted (a memset, not a copy): `host`
    /// alone no longer says so once its pinned chunks went back to the pool.
    pub zeros: bool,
    /// Bytes DMAed straight from or into pinned memory (the rest went
    /// through the ring).
    pub direct: usize,
    /// An eviction's unmapping and release of the device memory (driver
    /// calls that may hold the context's locks while other clients launch).
    pub released: Duration,
}

/// How a move ended.
pub(crate) enum Ended {
    /// Out: its physical memory released.
    Evicted,
    /// Not out: still mapped, still resident.
    EvictFailed(CudaError),
    /// Back, in this physical memory.
    Restored(cu::CUmemGenericAllocationHandle),
    /// Not back: nothing mapped (`true`: out of device memory).
    RestoreFailed(CudaError, bool),
}

// SAFETY: the raw handles in a job are plain numbers the driver resolves in
// any thread of the process; the host copy is owned memory.
unsafe impl Send for Job {}
// SAFETY: as for `Job`.
unsafe impl Send for Done {}
// SAFETY: as for `Job`.
unsafe impl Send for Msg {}

/// The mover of one context.
pub(crate) struct Mover {
    jobs: Option<Sender<Msg>>,
    ended: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    /// Moves sent and not yet begun: a `Prepare` under way stops for them.
    waiting: Arc<AtomicUsize>,
    /// Jobs sent and not yet taken back.
    pub under_way: usize,
    /// Bytes its moves DMAed straight from or into pinned memory, and bytes
    /// moved in all (restores of zeros left out).
    pub moved_direct: u64,
    pub moved: u64,
    /// The pinned pool's cap (0: none), what it grows to from the start
    /// ([`super::pinned_pool::AHEAD_VAR`]), and the level last sent.
    pub pinned: usize,
    pub ahead_floor: usize,
    pub ahead_sent: usize,
    /// Bytes the pinned pool holds (its book's count).
    held: Arc<AtomicUsize>,
}

impl Mover {
    /// Starts the thread, which makes `ctx` current on itself; `pinned`:
    /// the pinned pool's cap (0: none).
    pub(crate) fn start(ctx: cu::CUcontext, pinned: usize) -> Result<Mover, CudaError> {
        let (jobs, rx) = channel::<Msg>();
        let (tx, ended) = channel::<Done>();
        let ctx = ctx as usize;
        let waiting = Arc::new(AtomicUsize::new(0));
        let w = Arc::clone(&waiting);
        let held = Arc::new(AtomicUsize::new(0));
        let h = Arc::clone(&held);
        let thread = std::thread::Builder::new()
            .name("gpumux-mover".into())
            .spawn(move || run(ctx as cu::CUcontext, pinned, rx, tx, &w, h))
            .map_err(|e| CudaError::Invalid(format!("starting the buffer mover thread: {e}")))?;
        let ahead_floor = if pinned > 0 { super::pinned_pool::ahead_from_env() } else { 0 };
        Ok(Mover {
            jobs: Some(jobs),
            ended,
            thread: Some(thread),
            waiting,
            under_way: 0,
            moved_direct: 0,
            moved: 0,
            pinned,
            ahead_floor,
            ahead_sent: 0,
            held,
        })
    }

    /// Bytes of pinned host memory its pool holds, chunks free and in copies.
    pub(crate) fn pinned_held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Sends a job that reports no end (`Prepare`, `Trim`); `false`: the
    /// thread is gone.
    pub(crate) fn send_quiet(&mut self, msg: Msg) -> bool {
        self.jobs.as_ref().is_some_and(|jobs| jobs.send(msg).is_ok())
    }

    /// Sends a job; `Err` gives it back (the thread is gone).
    pub(crate) fn send(&mut self, job: Job) -> Result<(), Job> {
        let Some(jobs) = &self.jobs else { return Err(job) };
        self.waiting.fetch_add(1, Ordering::AcqRel);
        match jobs.send(Msg::Move(job)) {
            Ok(()) => {
                self.under_way += 1;
                Ok(())
            }
            Err(e) => match e.0 {
                Msg::Move(job) => Err(job),
                // Not what was sent.
                Msg::Prepare { .. } | Msg::Trim { .. } | Msg::Recycle(_) | Msg::Ahead { .. } => Ok(()),
            },
        }
    }

    /// The next end: waiting for it if `wait`. `None`: none now (or, when
    /// waiting, the thread is gone with nothing left to say).
    pub(crate) fn next(&mut self, wait: bool) -> Option<Done> {
        let done = if wait { self.ended.recv().ok() } else { self.ended.try_recv().ok() };
        if let Some(d) = &done {
            self.under_way -= 1;
            if !d.zeros && matches!(d.what, Ended::Evicted | Ended::Restored(_)) {
                self.moved_direct += d.direct as u64;
                self.moved += d.size as u64;
            }
        }
        done
    }
}

impl Drop for Mover {
    /// The jobs sent are made (a lost context fails them at once), then the
    /// thread ends; ends not taken are dropped with what they own, and so is
    /// host memory faulted in ahead.
    fn drop(&mut self) {
        // A faulting ahead under way stops at its next chunk (`prepare`).
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long the mover sleeps between looks at its pinned pool when it has
/// nothing to grow (to give back copies unused for long).
const TICK: Duration = Duration::from_secs(1);

/// The thread: binds the context, then makes each job in turn; while no
/// job waits, grows the pinned pool a piece at a time.
fn run(
    ctx: cu::CUcontext,
    cap: usize,
    jobs: Receiver<Msg>,
    ended: Sender<Done>,
    waiting: &AtomicUsize,
    held: Arc<AtomicUsize>,
) {
    crate::client::forget_current();
    // SAFETY: a live context (its owner joins this thread before destroying it).
    let bound = check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(ctx) });
    let mut stream: cu::CUstream = std::ptr::null_mut();
    let made = bound.and_then(|()| {
        let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: out-pointer to a local; the context is current.
        check("cuStreamCreate", unsafe { cu::cuStreamCreate(&mut stream, flags) })?;
        super::staging::Staging::new(cap)
    });
    let ring = made.as_ref().ok();
    // Host memory faulted in ahead (`Msg::Prepare`), when there is no pool.
    let mut ready: Vec<HostCopy> = Vec::new();
    let mut pool = (cap > 0 && ring.is_some()).then(|| PinnedPool::new(cap, held));
    loop {
        let growing = pool.as_ref().is_some_and(PinnedPool::has_work);
        let next = if growing {
            jobs.try_recv().map_err(|e| e == TryRecvError::Disconnected)
        } else {
            jobs.recv_timeout(TICK).map_err(|e| e == RecvTimeoutError::Disconnected)
        };
        let job = match next {
            Ok(job) => job,
            Err(true) => break,
            Err(false) => {
                // Idle: grow the pool by a piece, give back what is unused.
                if let (Some(p), Some(r)) = (pool.as_mut(), ring) {
                    p.grow_step(r.copy_pool());
                    p.expire();
                }
                continue;
            }
        };
        let done = match (job, &made) {
            (Msg::Prepare { len }, _) => {
                // With a pool, its level covers the buffer born evicted.
                if pool.is_none() {
                    prepare(len, ring, &mut ready, waiting);
                }
                continue;
            }
            (Msg::Ahead { bytes }, _) => {
                if let Some(p) = pool.as_mut() {
                    p.set_level(bytes);
                }
                continue;
            }
            (Msg::Trim { keep }, _) => {
                trim(&mut ready, keep);
                continue;
            }
            (Msg::Recycle(chunks), _) => {
                if let Some(p) = pool.as_mut() {
                    chunks.into_iter().for_each(|m| p.put(m));
                }
                continue;
            }
            (Msg::Move(job), made) => {
                waiting.fetch_sub(1, Ordering::AcqRel);
                match made {
                    Ok(_) => make(job, stream, ring, &mut ready, pool.as_mut()),
                    Err(e) => fail(job, CudaError::Invalid(format!("the buffer mover could not start: {e}"))),
                }
            }
        };
        if ended.send(done).is_err() {
            break;
        }
    }
    drop(ready);
    // Unpinned in this thread's context, before the ring and the stream go.
    drop(pool);
    drop(made);
    if !stream.is_null() {
        // SAFETY: made above on this context; every copy on it is done.
        unsafe { cu::cuStreamDestroy_v2(stream) };
    }
}

/// Faults in `len` bytes of fresh host memory on the ring's copy pool and
/// keeps them in `ready` (`Msg::Prepare`), a ring chunk at a time; a move
/// sent meanwhile (`waiting`) stops it: the memory is kept as far as it
/// got, and the eviction that takes it faults in the rest. A failure only
/// logs: the eviction gets fresh memory then.
fn prepare(len: usize, ring: Option<&super::staging::Staging>, ready: &mut Vec<HostCopy>, waiting: &AtomicUsize) {
    let Some(ring) = ring else { return };
    let t = Instant::now();
    let mut c = match HostCopy::new(len, len as u64) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("host memory for {len} bytes not faulted in ahead: {e}");
            return;
        }
    };
    let step = super::staging::CHUNK;
    let mut at = 0;
    while at < len && waiting.load(Ordering::Acquire) == 0 {
        let n = step.min(len - at);
        if let Some(m) = c.pieces_mut().first_mut() {
            ring.populate(&mut m.as_mut_slice()[at..at + n]);
        }
        at += n;
    }
    if at == len {
        c.mark_written();
    }
    ready.push(c);
    let ms = t.elapsed().as_secs_f64() * 1e3;
    tracing::info!("host memory for {len} bytes: {at} faulted in ahead in {ms:.1} ms");
}

/// Drops host memory faulted in ahead, the largest first, until `ready`
/// holds at most `keep` bytes (`Msg::Trim`).
fn trim(ready: &mut Vec<HostCopy>, keep: usize) {
    ready.sort_by_key(HostCopy::held);
    while ready.iter().map(HostCopy::held).sum::<usize>() > keep {
        ready.pop();
    }
}

/// A host copy of `size` bytes made of the pinned pool's `chunks`, and, where
/// its cap left them short, one mapping of the rest (through the ring).
fn pooled_copy(mut chunks: Vec<HostMem>, size: usize, bytes: u64) -> Result<HostCopy, CudaError> {
    let held: usize = chunks.iter().map(HostMem::len).sum();
    if held < size {
        chunks.push(HostMem::new(size - held)?);
    }
    Ok(HostCopy::from_pieces(chunks, size, bytes))
}

/// A job that cannot be made: given back unmade.
fn fail(job: Job, e: CudaError) -> Done {
    let zero = Duration::ZERO;
    match job {
        Job::Evict { token, ptr, size, bytes, host, .. } => {
            let host = host.unwrap_or_else(|| HostCopy::zeros(size, bytes));
            let what = Ended::EvictFailed(e);
            Done { token, ptr, size, host, what, prepared: zero, copied: zero, zeros: false, direct: 0, released: zero }
        }
        Job::Restore { token, ptr, size, host, .. } => {
            let (what, zeros) = (Ended::RestoreFailed(e, false), host.is_zeros());
            Done { token, ptr, size, host, what, prepared: zero, copied: zero, zeros, direct: 0, released: zero }
        }
    }
}

/// Makes one job on this thread's `stream` and `ring`, straight from or
/// into pinned memory of `pool` where it has some.
fn make(
    job: Job,
    s: cu::CUstream,
    ring: Option<&super::staging::Staging>,
    ready: &mut Vec<HostCopy>,
    mut pool: Option<&mut PinnedPool>,
) -> Done {
    let Some(ring) = ring else { return fail(job, CudaError::Invalid("the mover has no staging ring".into())) };
    let t = Instant::now();
    match job {
        Job::Evict { token, ptr, size, bytes, handle, host, found } => {
            // Chunks of the pool first: no CPU copy (free ones, pinned ahead,
            // else new ones where its cap has room, pinned on the path, and
            // kept). Else the host copy sent; else memory faulted in ahead
            // that fits (the smallest); else fresh. Whichever is not taken is
            // dropped after the move.
            let chunks = pool.as_deref_mut().map_or_else(Vec::new, |p| p.take(size));
            let mut unused = None;
            let host = match (chunks, host) {
                (chunks, h) if !chunks.is_empty() => {
                    unused = h;
                    pooled_copy(chunks, size, bytes)
                }
                (_, Some(h)) => Ok(h),
                (_, None) => {
                    match ready.iter().enumerate().filter(|(_, c)| c.fits(size)).min_by_key(|(_, c)| c.held()) {
                        Some((i, _)) => Ok(ready.swap_remove(i)),
                        None => HostCopy::new(size, bytes),
                    }
                }
            };
            let mut host = match host {
                Ok(mut h) => {
                    h.set_buffer(bytes);
                    h
                }
                Err(e) => return fail(Job::Evict { token, ptr, size, bytes, handle, host: None, found }, e),
            };
            let prepared = found + t.elapsed();
            let t = Instant::now();
            let grow = pool.as_deref().is_some_and(PinnedPool::grows);
            let copy = super::direct::to_host(s, ptr, &mut host, size, ring, grow);
            let copied = t.elapsed();
            let direct = copy.as_ref().map_or(0, |st| straight_of(st, pool.as_deref_mut()));
            if copy.is_ok() {
                host.mark_written();
            }
            let t = Instant::now();
            let what = match copy.and_then(|_| release(ptr, size, handle)) {
                Ok(()) => Ended::Evicted,
                Err(e) => Ended::EvictFailed(e),
            };
            let released = t.elapsed();
            drop(unused);
            Done { token, ptr, size, host, what, prepared, copied, zeros: false, direct, released }
        }
        Job::Restore { token, ptr, size, ordinal, mut host } => {
            let zeros = host.is_zeros();
            let h = match create(ordinal, size) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    let e = CudaError::Invalid(format!("no device memory for {size} bytes to restore"));
                    let (what, prepared) = (Ended::RestoreFailed(e, true), t.elapsed());
                    let (copied, released) = (Duration::ZERO, Duration::ZERO);
                    return Done { token, ptr, size, host, what, prepared, copied, zeros, direct: 0, released };
                }
                Err(e) => return fail(Job::Restore { token, ptr, size, ordinal, host }, e),
            };
            if let Err(e) = map(ordinal, ptr, size, h) {
                // `map` released the handle.
                return fail(Job::Restore { token, ptr, size, ordinal, host }, e);
            }
            let prepared = t.elapsed();
            let copy = if zeros {
                // SAFETY: `size` bytes at `ptr` were just mapped.
                check("cuMemsetD8Async", unsafe { cu::cuMemsetD8Async(ptr, 0, size, s) })
                    // SAFETY: a stream of this context.
                    .and_then(|()| check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) }))
                    .map(|()| 0)
            } else {
                let grow = pool.as_deref().is_some_and(PinnedPool::grows);
                super::direct::to_device(s, &mut host, size, ptr, ring, grow)
                    .map(|st| straight_of(&st, pool.as_deref_mut()))
            };
            let copied = t.elapsed() - prepared;
            let direct = *copy.as_ref().unwrap_or(&0);
            let what = match copy {
                Ok(_) => Ended::Restored(h),
                Err(e) => {
                    // Back to reserved only: the host copy stays the buffer's.
                    let _ = release(ptr, size, h);
                    Ended::RestoreFailed(e, false)
                }
            };
            if let (Ended::Restored(_), Some(p)) = (&what, pool) {
                // Restored: a pool's copy goes back to the pool (the device's
                // thread gets none to keep as its spare).
                let buffer = host.buffer();
                host = match host.into_pooled() {
                    Ok(chunks) => {
                        chunks.into_iter().for_each(|m| p.put(m));
                        HostCopy::zeros(size, buffer)
                    }
                    Err(h) => h,
                };
            }
            Done { token, ptr, size, host, what, prepared, copied, zeros, direct, released: Duration::ZERO }
        }
    }
}

/// The bytes a straight move DMAed straight; a failed pin on its path
/// stops the pool's growth (logged there).
fn straight_of(st: &super::direct::Straight, pool: Option<&mut PinnedPool>) -> usize {
    if let (Some(e), Some(p)) = (&st.pin_failed, pool) {
        p.fail(e);
    }
    st.direct
}

/// Unmaps `size` bytes at `ptr` and releases `h`.
fn release(ptr: u64, size: usize, h: cu::CUmemGenericAllocationHandle) -> Result<(), CudaError> {
    // SAFETY: mapped by `map`, its copies done.
    check("cuMemUnmap", unsafe { cu::cuMemUnmap(ptr, size) })?;
    // SAFETY: unmapped above.
    check("cuMemRelease", unsafe { cu::cuMemRelease(h) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_keeps_at_most_the_bytes_asked_dropping_the_largest_first() {
        let sizes = [3usize << 20, 1 << 20, 2 << 20];
        let mut ready: Vec<HostCopy> =
            sizes.iter().map(|&n| HostCopy::new(n, n as u64).expect("host memory")).collect();
        trim(&mut ready, 6 << 20);
        assert_eq!(ready.len(), 3, "all fit in 6 MiB");
        trim(&mut ready, (4 << 20) - 1);
        let held: Vec<usize> = ready.iter().map(HostCopy::held).collect();
        assert_eq!(held, vec![1 << 20, 2 << 20], "the 3 MiB one went first");
        trim(&mut ready, 1 << 20);
        assert_eq!(ready.iter().map(HostCopy::held).collect::<Vec<_>>(), vec![1 << 20]);
        trim(&mut ready, 0);
        assert!(ready.is_empty(), "nothing kept for no buffer born evicted");
    }
}

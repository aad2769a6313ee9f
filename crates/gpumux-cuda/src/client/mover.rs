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

use super::swap::{create, map, HostCopy};
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
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
}

impl Mover {
    /// Starts the thread, which makes `ctx` current on itself.
    pub(crate) fn start(ctx: cu::CUcontext) -> Result<Mover, CudaError> {
        let (jobs, rx) = channel::<Msg>();
        let (tx, ended) = channel::<Done>();
        let ctx = ctx as usize;
        let waiting = Arc::new(AtomicUsize::new(0));
        let w = Arc::clone(&waiting);
        let thread = std::thread::Builder::new()
            .name("gpumux-mover".into())
            .spawn(move || run(ctx as cu::CUcontext, rx, tx, &w))
            .map_err(|e| CudaError::Invalid(format!("starting the buffer mover thread: {e}")))?;
        Ok(Mover { jobs: Some(jobs), ended, thread: Some(thread), waiting, under_way: 0 })
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
                Msg::Prepare { .. } | Msg::Trim { .. } => Ok(()),
            },
        }
    }

    /// The next end: waiting for it if `wait`. `None`: none now (or, when
    /// waiting, the thread is gone with nothing left to say).
    pub(crate) fn next(&mut self, wait: bool) -> Option<Done> {
        let done = if wait { self.ended.recv().ok() } else { self.ended.try_recv().ok() };
        if done.is_some() {
            self.under_way -= 1;
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

/// The thread: binds the context, then makes each job in turn.
fn run(ctx: cu::CUcontext, jobs: Receiver<Msg>, ended: Sender<Done>, waiting: &AtomicUsize) {
    // SAFETY: a live context (its owner joins this thread before destroying it).
    let bound = check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(ctx) });
    let mut stream: cu::CUstream = std::ptr::null_mut();
    let made = bound.and_then(|()| {
        let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: out-pointer to a local; the context is current.
        check("cuStreamCreate", unsafe { cu::cuStreamCreate(&mut stream, flags) })?;
        super::staging::Staging::new()
    });
    let ring = made.as_ref().ok();
    // Host memory faulted in ahead (`Msg::Prepare`).
    let mut ready: Vec<HostCopy> = Vec::new();
    for job in jobs {
        let done = match (job, &made) {
            (Msg::Prepare { len }, _) => {
                prepare(len, ring, &mut ready, waiting);
                continue;
            }
            (Msg::Trim { keep }, _) => {
                trim(&mut ready, keep);
                continue;
            }
            (Msg::Move(job), made) => {
                waiting.fetch_sub(1, Ordering::AcqRel);
                match made {
                    Ok(_) => make(job, stream, ring, &mut ready),
                    Err(e) => fail(job, CudaError::Invalid(format!("the buffer mover could not start: {e}"))),
                }
            }
        };
        if ended.send(done).is_err() {
            break;
        }
    }
    drop(ready);
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
        ring.populate(&mut c.bytes_mut(len)[at..at + n]);
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

/// A job that cannot be made: given back unmade.
fn fail(job: Job, e: CudaError) -> Done {
    let zero = Duration::ZERO;
    match job {
        Job::Evict { token, ptr, size, bytes, host, .. } => {
            let host = host.unwrap_or_else(|| HostCopy::zeros(size, bytes));
            Done { token, ptr, size, host, what: Ended::EvictFailed(e), prepared: zero, copied: zero }
        }
        Job::Restore { token, ptr, size, host, .. } => {
            Done { token, ptr, size, host, what: Ended::RestoreFailed(e, false), prepared: zero, copied: zero }
        }
    }
}

/// Makes one job on this thread's `stream` and `ring`.
fn make(job: Job, s: cu::CUstream, ring: Option<&super::staging::Staging>, ready: &mut Vec<HostCopy>) -> Done {
    let Some(ring) = ring else { return fail(job, CudaError::Invalid("the mover has no staging ring".into())) };
    let t = Instant::now();
    match job {
        Job::Evict { token, ptr, size, bytes, handle, host, found } => {
            let host = match host {
                Some(h) => Ok(h),
                // The smallest that fits: faulted in ahead; else fresh.
                None => match ready.iter().enumerate().filter(|(_, c)| c.fits(size)).min_by_key(|(_, c)| c.held()) {
                    Some((i, _)) => Ok(ready.swap_remove(i)),
                    None => HostCopy::new(size, bytes),
                },
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
            let fresh = host.is_fresh();
            let copy = ring.to_host(s, ptr, host.bytes_mut(size), fresh);
            let copied = t.elapsed();
            if copy.is_ok() {
                host.mark_written();
            }
            let what = match copy.and_then(|()| release(ptr, size, handle)) {
                Ok(()) => Ended::Evicted,
                Err(e) => Ended::EvictFailed(e),
            };
            Done { token, ptr, size, host, what, prepared, copied }
        }
        Job::Restore { token, ptr, size, ordinal, host } => {
            let h = match create(ordinal, size) {
                Ok(Some(h)) => h,
                Ok(None) => {
                    let e = CudaError::Invalid(format!("no device memory for {size} bytes to restore"));
                    return Done {
                        token,
                        ptr,
                        size,
                        host,
                        what: Ended::RestoreFailed(e, true),
                        prepared: t.elapsed(),
                        copied: Duration::ZERO,
                    };
                }
                Err(e) => return fail(Job::Restore { token, ptr, size, ordinal, host }, e),
            };
            if let Err(e) = map(ordinal, ptr, size, h) {
                // `map` released the handle.
                return fail(Job::Restore { token, ptr, size, ordinal, host }, e);
            }
            let prepared = t.elapsed();
            let copy = if host.is_zeros() {
                // SAFETY: `size` bytes at `ptr` were just mapped.
                check("cuMemsetD8Async", unsafe { cu::cuMemsetD8Async(ptr, 0, size, s) })
                    // SAFETY: a stream of this context.
                    .and_then(|()| check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) }))
            } else {
                ring.to_device(s, host.bytes(size), ptr)
            };
            let copied = t.elapsed() - prepared;
            let what = match copy {
                Ok(()) => Ended::Restored(h),
                Err(e) => {
                    // Back to reserved only: the host copy stays the buffer's.
                    let _ = release(ptr, size, h);
                    Ended::RestoreFailed(e, false)
                }
            };
            Done { token, ptr, size, host, what, prepared, copied }
        }
    }
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

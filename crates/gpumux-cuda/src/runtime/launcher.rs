//! A thread that makes kernel launches' CUDA calls for another thread.
//!
//! **Why.** In the daemon's device process one thread carries out the
//! daemon's commands in order and answers its polls, and the daemon waits
//! for each answer. With 8 clients launching small kernels, most of that
//! thread's time per launch command was the `cuLaunchKernel` of the stream's
//! next kernel queued ahead (4-6 µs of 6.5-10), made before the next poll
//! could be answered, while the daemon's core waited (docs/history/benchmarks.md,
//! "The launch rate's bound, located"). Those launches are made ahead of
//! need: nobody waits for them until the engine launches that kernel. Made
//! here, on a thread of their own, they overlap the daemon's own work.
//!
//! **Order.** Jobs run in the order posted. A job's stream and event must
//! outlive it and nothing else may be queued on its stream by another thread
//! until it is done ([`Pending::wait`]): the caller owns that (the CUDA
//! device posts only kernels queued behind a running launch on its stream,
//! workers or native, and waits for the job before it touches them otherwise).
//!
//! **The queue.** A post hands the job to the thread through a fixed ring
//! of slots and a pool of outcomes that both threads reuse (`ring`): no
//! allocation, lock or channel per job, and a [`Pending`] keeps its own
//! outcome however long it is kept. It replaced a `std::sync::mpsc` channel
//! and an `Arc` per job, which a GPU A/B found no faster (docs/daemon-cuda.md,
//! "The launcher thread"; that code is in git: d47028f).

mod account;
mod ring;

use super::{check, launch_kernel, Event, Function, Params, Stream};
use crate::error::{CudaError, DriverError, Result};
use account::Account;
use cudarc::driver::sys as cu;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Jobs the ring holds before a post waits: a backlog of ~1.5 ms of
/// launches at ~6 µs each, more than 8 clients' bursts of a poll (~15
/// kernels each) together.
const RING_SLOTS: usize = 256;

/// How long the thread looks for the next job before it sleeps on the
/// queue. A sleeping thread takes a futex wake-up per job (tens of µs), and
/// a stream's next launch waits for the one before: with one client queueing
/// one kernel at a time, the device waited for those wake-ups (1 client:
/// 45-50k launches/s against 51-57k without the thread, runs 140-141). The CUDA
/// device's own thread polls as long after each message.
const SPIN: Duration = Duration::from_micros(200);

/// A word written by the stream after a kernel (`cuStreamWriteValue32`,
/// with the driver's memory barrier before it: whoever reads the word then
/// sees the kernel's writes).
#[derive(Clone, Copy, Debug)]
pub struct Publish {
    /// The word's device address (host memory mapped for the device).
    pub addr: u64,
    /// What is written.
    pub value: u32,
}

impl Publish {
    /// Writes it on `stream` from this thread.
    pub fn write(&self, stream: &Stream) -> Result<()> {
        stream.write_u32(self.addr, self.value)
    }
}

/// CUDA handles carried to the launcher thread.
struct Handles {
    ctx: cu::CUcontext,
    func: cu::CUfunction,
    stream: cu::CUstream,
    /// `None`: no end event is recorded (the poster records one later if
    /// it needs one: `preempt::WorkerLaunch`, "lazy end").
    ended: Option<cu::CUevent>,
}

// SAFETY: CUDA handles may be used from any thread once their context is
// current there (the launcher makes it current before each job's calls).
unsafe impl Send for Handles {}

/// One launch: the kernel with `params` on `stream`, then the word of
/// `publish` written (a native kernel's end, for the host to read), then
/// `ended` recorded after it, if given.
struct Job {
    handles: Handles,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    params: Params,
    publish: Option<Publish>,
    /// The operation its stage stamps name (`gpumux_stamps::tag`; 0: none).
    tag: u64,
}

/// The error of a job never made (its thread stopped, by a panic): whoever
/// waits for it gets this instead of waiting for ever.
fn unmade() -> DriverError {
    DriverError { call: "the launcher", code: -1, msg: "its thread stopped".into() }
}

/// A job's calls' times as one word: the launch's ns in the high 32 bits,
/// the record's in the low.
fn pack(launch_ns: u64, record_ns: u64) -> u64 {
    (launch_ns.min(u32::MAX as u64) << 32) | record_ns.min(u32::MAX as u64)
}

/// A launch posted to a [`Launcher`] and maybe not made yet.
pub struct Pending(ring::Ticket<Job, DriverError>);

impl Pending {
    /// The launch calls were made (successfully or not).
    pub fn done(&self) -> bool {
        self.0.done()
    }

    /// What the calls came to once made: their times packed, or their error.
    fn outcome(&self) -> Option<Result<u64, DriverError>> {
        self.0.outcome_now()
    }

    /// The error of a launch that was made and failed.
    pub fn error(&self) -> Option<CudaError> {
        self.outcome()?.err().map(CudaError::Driver)
    }

    /// Waits until the launch calls were made; their times (ns: the launch,
    /// the end event's record), or their error.
    pub fn wait(&self) -> Result<(u32, u32)> {
        let c = self.0.wait().map_err(CudaError::Driver)?;
        Ok(((c >> 32) as u32, c as u32))
    }
}

/// What the thread's calls took so far ([`Launcher::made`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Made {
    /// Jobs whose calls were made without error.
    pub launches: u64,
    /// Their `cuLaunchKernel` calls, ns in all.
    pub launch_ns: u64,
    /// Their end events' `cuEventRecord` calls (and a native kernel's
    /// published end, a `cuStreamWriteValue32`), ns in all.
    pub record_ns: u64,
}

/// [`Made`]'s sums, added to by the thread.
#[derive(Default)]
struct MadeSums {
    launches: AtomicU64,
    launch_ns: AtomicU64,
    record_ns: AtomicU64,
}

/// The posting side of the hand-over.
type Queue = ring::Poster<Job, DriverError>;

/// The thread's side of it.
type Take = ring::Taker<Job, DriverError>;

/// A new hand-over.
fn queue() -> (Queue, Take) {
    ring::ring(RING_SLOTS, unmade)
}

/// The thread and its queue. Dropping it waits for every job posted.
pub struct Launcher {
    /// `None` once dropped (closing it ends the thread after its jobs).
    queue: Option<Queue>,
    /// Returns its account when it ends (logged then, by the drop).
    thread: Option<JoinHandle<Account>>,
    /// Jobs posted and not yet done, for [`Launcher::drain`].
    posted: AtomicU64,
    finished: Arc<AtomicU64>,
    made: Arc<MadeSums>,
}

impl Launcher {
    /// Starts the thread.
    pub fn start() -> Result<Launcher> {
        let (queue, take) = queue();
        let finished = Arc::new(AtomicU64::new(0));
        let made = Arc::new(MadeSums::default());
        let (done, sums) = (finished.clone(), made.clone());
        let thread = std::thread::Builder::new()
            .name("gpumux-launcher".into())
            .spawn(move || launch_all(take, &sums, &done))
            .map_err(|e| CudaError::Invalid(format!("starting the launcher thread: {e}")))?;
        Ok(Launcher { queue: Some(queue), thread: Some(thread), posted: AtomicU64::new(0), finished, made })
    }

    /// What the thread's calls took so far.
    pub fn made(&self) -> Made {
        Made {
            launches: self.made.launches.load(Ordering::Relaxed),
            launch_ns: self.made.launch_ns.load(Ordering::Relaxed),
            record_ns: self.made.record_ns.load(Ordering::Relaxed),
        }
    }

    /// Posts a launch of `func` with `params` on `stream` in `ctx`, then the
    /// write of `publish` (stream order: once the kernel ended), and the
    /// record of `ended` after it if given (see the module doc for what the
    /// caller must keep alive and leave alone until it is done). Without
    /// `ended` the thread makes only the launch (and the write): what it
    /// costs per kernel of a chain is then `cuLaunchKernel` alone.
    #[allow(clippy::too_many_arguments)]
    pub fn post(
        &self,
        ctx: cu::CUcontext,
        func: &Function,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        stream: &Stream,
        params: Params,
        publish: Option<Publish>,
        ended: Option<&Event>,
    ) -> Result<Pending> {
        let handles = Handles { ctx, func: func.raw, stream: stream.raw, ended: ended.map(Event::raw) };
        // The operation the poster named for the stage stamps (0: off).
        let tag = gpumux_stamps::tag();
        if tag != 0 {
            gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchPosted, tag, 0);
        }
        self.post_job(Job { handles, grid, block, smem, params, publish, tag })
    }

    /// Hands `job` to the thread.
    fn post_job(&self, job: Job) -> Result<Pending> {
        let gone = || CudaError::Invalid("the launcher thread is gone".into());
        let queue = self.queue.as_ref().ok_or_else(gone)?;
        // Counted before it is handed over, so that `drain` never waits for fewer.
        self.posted.fetch_add(1, Ordering::Relaxed);
        queue.post(job).map(Pending).map_err(|_| {
            self.posted.fetch_sub(1, Ordering::Relaxed);
            gone()
        })
    }

    /// Waits until every job posted so far is done.
    pub fn drain(&self) {
        let want = self.posted.load(Ordering::Relaxed);
        while self.finished.load(Ordering::Acquire) < want {
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return;
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Launcher {
    /// Ends the thread after the jobs posted, and logs what it did (info,
    /// beside the CUDA device's own lines when it closes).
    fn drop(&mut self) {
        // Closing the queue ends the thread after the jobs in it.
        self.queue.take();
        // A thread that panicked has no account to give (its panic was logged).
        if let Some(Ok(account)) = self.thread.take().map(JoinHandle::join) {
            if let Some(s) = account.summary() {
                tracing::info!("CUDA device: the launcher thread: {s}");
            }
        }
    }
}

/// The thread's loop: each job made, its outcome set, counted; its account
/// when the queue is closed and empty.
fn launch_all(mut take: Take, sums: &MadeSums, finished: &AtomicU64) -> Account {
    let mut current: cu::CUcontext = std::ptr::null_mut();
    let mut account = Account::starting();
    while let Some(mut taken) = take.next(SPIN) {
        account.took(taken.queued());
        let (calls, error) = made(taken.job(), &mut current, sums, &mut account);
        taken.set(calls, error);
        finished.fetch_add(1, Ordering::Release);
    }
    let (sleeps, slept) = take.slept();
    account.ended(sleeps, slept);
    account
}

/// Makes `job`'s calls and adds them to `sums` and `account`: their times
/// packed, or their error.
fn made(
    job: &mut Job,
    current: &mut cu::CUcontext,
    sums: &MadeSums,
    account: &mut Account,
) -> (u64, Option<DriverError>) {
    match run(job, current) {
        Ok((launch_ns, record_ns)) => {
            sums.launches.fetch_add(1, Ordering::Relaxed);
            sums.launch_ns.fetch_add(launch_ns, Ordering::Relaxed);
            sums.record_ns.fetch_add(record_ns, Ordering::Relaxed);
            let ends = job.publish.is_some() || job.handles.ended.is_some();
            account.made(launch_ns, ends.then_some(record_ns));
            (pack(launch_ns, record_ns), None)
        }
        Err(e) => {
            account.failed();
            (0, Some(e))
        }
    }
}

/// Makes one job's calls on the launcher thread; their times (ns: the
/// launch, the record).
fn run(job: &mut Job, current: &mut cu::CUcontext) -> Result<(u64, u64), DriverError> {
    let h = &job.handles;
    if *current != h.ctx {
        crate::client::forget_current();
        // SAFETY: a live context handle (the poster keeps it until the job is done).
        as_driver(check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(h.ctx) }))?;
        *current = h.ctx;
    }
    let mut ptrs = job.params.pointers();
    if job.tag != 0 {
        gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchStart, job.tag, 0);
    }
    let t = Instant::now();
    // SAFETY: the parameters follow the function's signature, the function
    // and stream outlive the job (module doc), and `ptrs` point into
    // `job.params`, left alone until the call returns.
    let launched = unsafe { launch_kernel(h.func, job.grid, job.block, job.smem, h.stream, &mut ptrs) };
    as_driver(launched)?;
    if job.tag != 0 {
        gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchReturn, job.tag, 0);
    }
    let launch_ns = t.elapsed().as_nanos().min(u32::MAX as u128) as u64;
    if job.publish.is_none() && h.ended.is_none() {
        // `cuLaunchKernel` alone (a kernel that publishes its own end, with a
        // lazy end event): no call to time.
        return Ok((launch_ns, 0));
    }
    let t = Instant::now();
    if let Some(w) = job.publish {
        // SAFETY: the poster's device-visible word, kept alive until the job is done (module doc).
        let written = unsafe { cu::cuStreamWriteValue32_v2(h.stream, w.addr, w.value, 0) };
        as_driver(check("cuStreamWriteValue32", written))?;
    }
    if let Some(ended) = h.ended {
        // SAFETY: valid handles (module doc).
        as_driver(check("cuEventRecord", unsafe { cu::cuEventRecord(ended, h.stream) }))?;
    }
    let record_ns = t.elapsed().as_nanos().min(u32::MAX as u128) as u64;
    Ok((launch_ns, record_ns))
}

fn as_driver(r: Result<()>) -> Result<(), DriverError> {
    r.map_err(|e| match e {
        CudaError::Driver(d) => d,
        other => DriverError { call: "the launcher", code: -1, msg: other.to_string() },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A launcher with no thread, its queue's other side to take jobs by
    /// hand (no GPU here to make real ones).
    fn by_hand() -> (Launcher, Take) {
        let (queue, take) = queue();
        let (finished, made) = (Arc::new(AtomicU64::new(0)), Arc::new(MadeSums::default()));
        (Launcher { queue: Some(queue), thread: None, posted: AtomicU64::new(0), finished, made }, take)
    }

    fn job(tag: u64) -> Job {
        use std::ptr::null_mut;
        let handles = Handles { ctx: null_mut(), func: null_mut(), stream: null_mut(), ended: None };
        Job { handles, grid: [1; 3], block: [1; 3], smem: 0, params: Params::default(), publish: None, tag }
    }

    #[test]
    fn a_job_dropped_unmade_ends_with_an_error_instead_of_leaving_its_waiter_waiting() {
        let (l, mut take) = by_hand();
        let (dropped, left) = (l.post_job(job(1)).expect("posted"), l.post_job(job(2)).expect("posted"));
        assert!(!dropped.done() && dropped.error().is_none(), "not made yet: neither done nor failed");
        drop(take.try_next().expect("a job"));
        assert!(dropped.done());
        let e = dropped.wait().expect_err("a job never made is an error").to_string();
        assert!(e.contains("its thread stopped"), "{e}");
        // Its thread stops with a job still queued.
        drop(take);
        let e = left.wait().expect_err("a job never made is an error").to_string();
        assert!(e.contains("its thread stopped"), "{e}");
        assert!(l.post_job(job(3)).is_err(), "no thread to make it");
        assert_eq!(l.posted.load(Ordering::Relaxed), 2, "a refused post is not counted");
    }

    #[test]
    fn a_pending_gives_its_own_calls_times_or_error() {
        let (l, mut take) = by_hand();
        let kept: Vec<_> = (0..4).map(|t| l.post_job(job(t)).expect("posted")).collect();
        for i in 0..4u64 {
            let error = (i == 2).then(|| DriverError { call: "cuLaunchKernel", code: 1, msg: "bad".into() });
            let mut taken = take.try_next().expect("a job");
            assert_eq!(taken.job().tag, i, "in the order posted");
            taken.set(pack(1_000 + i, i), error);
        }
        for (i, p) in kept.iter().enumerate() {
            if i == 2 {
                assert!(p.error().is_some_and(|e| e.to_string().contains("bad")));
                assert!(p.wait().is_err());
            } else {
                assert!(p.error().is_none());
                assert_eq!(p.wait().expect("made"), (1_000 + i as u32, i as u32));
            }
        }
    }

    #[test]
    fn a_launcher_with_nothing_posted_drains_at_once_and_its_thread_ends_when_dropped() {
        let l = Launcher::start().expect("the thread starts");
        l.drain();
        let waiting = l.thread.as_ref().is_some_and(|t| !t.is_finished());
        assert!(waiting, "the thread waits for jobs while its launcher lives");
        drop(l);
    }

    /// The hand-over's own work per job, for callgrind (no GPU: the jobs are
    /// not made, their outcomes set by hand): `LQ_JOBS` jobs (default 1e5) in
    /// bursts of 15 (a poll's), on one thread so that no spin loop is
    /// counted. The poster's part is `poster_side` inclusive, the launcher
    /// thread's `taker_side`:
    /// `valgrind --tool=callgrind BIN --ignored --exact runtime::launcher::tests::hand_over_count`.
    /// The `std::sync::mpsc` channel the ring replaced has its figure in
    /// docs/daemon-cuda.md, "The launcher thread" (the code is in git: d47028f).
    #[test]
    #[ignore = "a harness for callgrind, not a check"]
    fn hand_over_count() {
        let jobs: u64 = std::env::var("LQ_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
        let (l, mut take) = by_hand();
        let mut held = Vec::with_capacity(15);
        for burst in 0..jobs.div_ceil(15) {
            for i in 0..15 {
                held.push(poster_side(&l, burst * 15 + i));
            }
            for _ in 0..15 {
                taker_side(&mut take);
            }
            for p in held.drain(..) {
                assert!(poster_waits(p).is_ok());
            }
        }
    }

    #[inline(never)]
    fn poster_side(l: &Launcher, tag: u64) -> Pending {
        l.post_job(job(tag)).expect("posted")
    }

    #[inline(never)]
    fn poster_waits(p: Pending) -> Result<(u32, u32)> {
        p.wait()
    }

    #[inline(never)]
    fn taker_side(take: &mut Take) {
        let mut taken = take.next(SPIN).expect("a job");
        let tag = taken.job().tag;
        taken.set(pack(tag, 1), None);
    }
}

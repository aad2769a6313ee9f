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

use super::{check, Event, Function, Params, Stream};
use crate::error::{CudaError, DriverError, Result};
use cudarc::driver::sys as cu;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    slot: Arc<Slot>,
    /// The operation its stage stamps name (`gpumux_stamps::tag`; 0: none).
    tag: u64,
}

impl Drop for Job {
    /// A job dropped unmade (its thread stopped, by a panic) still ends:
    /// whoever waits for it gets an error instead of waiting for ever.
    fn drop(&mut self) {
        if !self.slot.done.load(Ordering::Acquire) {
            if let Ok(mut e) = self.slot.error.lock() {
                e.get_or_insert(DriverError { call: "the launcher", code: -1, msg: "its thread stopped".into() });
            }
            self.slot.done.store(true, Ordering::Release);
        }
    }
}

/// What a job came to: set once by the launcher thread.
#[derive(Default)]
struct Slot {
    done: AtomicBool,
    /// The launch's and the record's time, ns (high and low 32 bits).
    calls: AtomicU64,
    error: Mutex<Option<DriverError>>,
}

/// A launch posted to a [`Launcher`] and maybe not made yet.
pub struct Pending(Arc<Slot>);

impl Pending {
    /// The launch calls were made (successfully or not).
    pub fn done(&self) -> bool {
        self.0.done.load(Ordering::Acquire)
    }

    /// The error of a launch that was made and failed.
    pub fn error(&self) -> Option<CudaError> {
        if !self.done() {
            return None;
        }
        self.0.error.lock().ok().and_then(|e| e.clone()).map(CudaError::Driver)
    }

    /// Waits until the launch calls were made; their times (ns: the launch,
    /// the end event's record), or their error.
    pub fn wait(&self) -> Result<(u32, u32)> {
        let mut spins = 0u32;
        while !self.done() {
            spins += 1;
            if spins < 1_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if let Some(e) = self.error() {
            return Err(e);
        }
        let c = self.0.calls.load(Ordering::Relaxed);
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

/// The thread and its queue. Dropping it waits for every job posted.
pub struct Launcher {
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// Jobs posted and not yet done, for [`Launcher::drain`].
    posted: Arc<AtomicU64>,
    finished: Arc<AtomicU64>,
    made: Arc<MadeSums>,
}

impl Launcher {
    /// Starts the thread.
    pub fn start() -> Result<Launcher> {
        let (tx, rx) = channel::<Job>();
        let posted = Arc::new(AtomicU64::new(0));
        let finished = Arc::new(AtomicU64::new(0));
        let done = finished.clone();
        let made = Arc::new(MadeSums::default());
        let sums = made.clone();
        let thread = std::thread::Builder::new()
            .name("gpumux-launcher".into())
            .spawn(move || {
                let mut current: cu::CUcontext = std::ptr::null_mut();
                while let Some(mut job) = next_job(&rx) {
                    match run(&mut job, &mut current) {
                        Ok((launch_ns, record_ns)) => {
                            sums.launches.fetch_add(1, Ordering::Relaxed);
                            sums.launch_ns.fetch_add(launch_ns, Ordering::Relaxed);
                            sums.record_ns.fetch_add(record_ns, Ordering::Relaxed);
                        }
                        Err(e) => {
                            if let Ok(mut slot) = job.slot.error.lock() {
                                *slot = Some(e);
                            }
                        }
                    }
                    job.slot.done.store(true, Ordering::Release);
                    done.fetch_add(1, Ordering::Release);
                }
            })
            .map_err(|e| CudaError::Invalid(format!("starting the launcher thread: {e}")))?;
        Ok(Launcher { tx: Some(tx), thread: Some(thread), posted, finished, made })
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
        let slot = Arc::new(Slot::default());
        let handles = Handles { ctx, func: func.raw, stream: stream.raw, ended: ended.map(Event::raw) };
        // The operation the poster named for the stage stamps (0: off).
        let tag = gpumux_stamps::tag();
        if tag != 0 {
            gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchPosted, tag, 0);
        }
        let job = Job { handles, grid, block, smem, params, publish, slot: slot.clone(), tag };
        let tx = self.tx.as_ref().ok_or_else(|| CudaError::Invalid("the launcher thread is gone".into()))?;
        self.posted.fetch_add(1, Ordering::Relaxed);
        if tx.send(job).is_err() {
            self.posted.fetch_sub(1, Ordering::Relaxed);
            return Err(CudaError::Invalid("the launcher thread is gone".into()));
        }
        Ok(Pending(slot))
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
    fn drop(&mut self) {
        // Closing the queue ends the thread after the jobs in it.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The next job, looked for during [`SPIN`] and then waited for; `None`
/// once the queue is closed and empty.
fn next_job(rx: &Receiver<Job>) -> Option<Job> {
    let start = Instant::now();
    let mut looks = 0u32;
    loop {
        match rx.try_recv() {
            Ok(job) => return Some(job),
            Err(TryRecvError::Disconnected) => return None,
            Err(TryRecvError::Empty) => {}
        }
        looks += 1;
        if looks.is_multiple_of(64) && start.elapsed() >= SPIN {
            return rx.recv().ok();
        }
        std::hint::spin_loop();
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
    // SAFETY: the parameters follow the function's signature, and the
    // function, stream and event outlive the job (module doc).
    let launched = unsafe {
        cu::cuLaunchKernel(
            h.func,
            job.grid[0],
            job.grid[1],
            job.grid[2],
            job.block[0],
            job.block[1],
            job.block[2],
            job.smem,
            h.stream,
            ptrs.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    as_driver(check("cuLaunchKernel", launched))?;
    if job.tag != 0 {
        gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchReturn, job.tag, 0);
    }
    let launch_ns = t.elapsed().as_nanos().min(u32::MAX as u128) as u64;
    if job.publish.is_none() && h.ended.is_none() {
        // `cuLaunchKernel` alone (a kernel that publishes its own end, with a
        // lazy end event): no call to time.
        job.slot.calls.store(launch_ns << 32, Ordering::Relaxed);
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
    job.slot.calls.store((launch_ns << 32) | record_ns, Ordering::Relaxed);
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

    fn unmade_job(slot: &Arc<Slot>) -> Job {
        use std::ptr::null_mut;
        let handles = Handles { ctx: null_mut(), func: null_mut(), stream: null_mut(), ended: None };
        let (grid, block, params) = ([1; 3], [1; 3], Params::default());
        Job { handles, grid, block, smem: 0, params, publish: None, slot: slot.clone(), tag: 0 }
    }

    #[test]
    fn a_job_dropped_unmade_ends_with_an_error_instead_of_leaving_its_waiter_waiting() {
        let slot = Arc::new(Slot::default());
        let job = unmade_job(&slot);
        let pending = Pending(slot);
        assert!(!pending.done() && pending.error().is_none(), "not made yet: neither done nor failed");
        drop(job);
        assert!(pending.done());
        let e = pending.wait().expect_err("a job never made is an error").to_string();
        assert!(e.contains("its thread stopped"), "{e}");
    }

    #[test]
    fn a_launcher_with_nothing_posted_drains_at_once_and_its_thread_ends_when_dropped() {
        let l = Launcher::start().expect("the thread starts");
        l.drain();
        let waiting = l.thread.as_ref().is_some_and(|t| !t.is_finished());
        assert!(waiting, "the thread waits for jobs while its launcher lives");
        drop(l);
    }
}

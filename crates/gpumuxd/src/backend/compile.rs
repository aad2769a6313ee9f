//! Client modules compiled for the CUDA device off the thread that serves
//! it: the transformation and NVRTC take tens of ms per module (40-50 ms
//! measured on the H100 machine, issue 35), and while one ran on the device's
//! thread every client's launches waited. A few worker threads compile
//! ([`CompilePool`]); the device's thread only loads the result
//! (`cuModuleLoadData`, which needs the context) when it is ready.
//!
//! NVRTC needs no context and its cache (`gpumux_cuda::nvrtc`) is shared
//! behind a lock, so a module compiled here is the same CUBIN the device's
//! thread would have made, found in the same cache by a later load.

use super::LoadError;
use gpumux_cuda::client::module::{self, CompiledModule, ModuleError};
use gpumux_cuda::error::Chain;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// Compile threads.
const WORKERS: usize = 2;

/// Transforms and compiles one module for `sm_{arch}` (and its kernels as
/// written too, for hardware priority, if `native`).
pub fn compile(
    name: &str,
    source: &str,
    options: &[String],
    arch: u32,
    native: bool,
) -> Result<CompiledModule, LoadError> {
    let mut compiled = module::compile(name, source, options, arch).map_err(|e| match e {
        ModuleError::Transform(t) => {
            LoadError::Transform { line: u32::try_from(t.line()).unwrap_or(u32::MAX), message: t.to_string() }
        }
        ModuleError::Compile { log } => LoadError::Compile { log },
        other => LoadError::Device(Chain(&other).to_string()),
    })?;
    if native {
        // The kernels as written, for launches alone at their priority;
        // without them those run as workers, as on any other device.
        if let Err(e) = module::add_native(&mut compiled, name, source, options, arch) {
            tracing::warn!("module {name}: no native build, its launches all run as workers: {}", Chain(&e));
        }
    }
    Ok(compiled)
}

/// A job of a [`WorkPool`]: its token and the work.
type Job<T> = (u64, Box<dyn FnOnce() -> T + Send>);

/// Worker threads that run jobs in the order given and hand back their
/// results by token (module doc): the CUDA backend's compiles, the simulated
/// device's transformations.
pub struct WorkPool<T: Send + 'static> {
    jobs: Option<Sender<Job<T>>>,
    done: Receiver<(u64, T)>,
    /// Run on the caller's thread (no worker ran), for the next `take`.
    ready: Vec<(u64, T)>,
    /// Jobs given and not yet taken back.
    pending: usize,
}

/// The CUDA backend's compiles: each module's name and what came of it.
pub type CompilePool = WorkPool<(String, Result<CompiledModule, LoadError>)>;

impl<T: Send + 'static> WorkPool<T> {
    /// Starts `workers` threads named `{name}{i}`.
    pub fn new(name: &str, workers: usize) -> WorkPool<T> {
        let (jobs, queue) = channel::<Job<T>>();
        let (report, done) = channel();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..workers.max(1) {
            let (queue, report) = (queue.clone(), report.clone());
            let spawned = std::thread::Builder::new().name(format!("{name}{i}")).spawn(move || loop {
                // The lock is held only to take the next job, not while it runs.
                let next = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
                let Ok((token, job)) = next else { return };
                if report.send((token, job())).is_err() {
                    return;
                }
            });
            if let Err(e) = spawned {
                // With no worker at all, `give` runs jobs in the caller's thread.
                tracing::warn!("a {name} thread did not start: {e}");
            }
        }
        WorkPool { jobs: Some(jobs), done, ready: Vec::new(), pending: 0 }
    }

    /// Queues a job; [`WorkPool::take`] returns its result when done. If no
    /// worker runs (none could start), it runs here and now.
    pub fn give(&mut self, token: u64, job: impl FnOnce() -> T + Send + 'static) {
        self.pending += 1;
        let job: Box<dyn FnOnce() -> T + Send> = Box::new(job);
        let Some(jobs) = self.jobs.as_ref() else {
            self.ready.push((token, job()));
            return;
        };
        if let Err(std::sync::mpsc::SendError((token, job))) = jobs.send((token, job)) {
            // Every worker is gone: run on this thread from now on rather than never.
            self.jobs = None;
            self.ready.push((token, job()));
        }
    }

    /// The results that came since the last call, with their tokens.
    pub fn take(&mut self) -> Vec<(u64, T)> {
        let mut out = std::mem::take(&mut self.ready);
        out.extend(self.done.try_iter());
        self.pending = self.pending.saturating_sub(out.len());
        out
    }

    /// Jobs given and not yet taken back.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Waits until every job given has finished (its result kept for the
    /// next [`WorkPool::take`]): before what the jobs touch goes away.
    pub fn settle(&mut self) {
        while self.pending > self.ready.len() {
            match self.done.recv() {
                Ok(r) => self.ready.push(r),
                Err(_) => break,
            }
        }
    }
}

/// The CUDA backend's compile pool (two threads, so that a small module
/// need not wait behind a large one).
pub fn compile_pool() -> CompilePool {
    WorkPool::new("gpumuxd-compile", WORKERS)
}

/// Queues the compile of one module on `pool` (see [`compile`]).
pub fn give_compile(
    pool: &mut CompilePool,
    token: u64,
    name: &str,
    source: &str,
    options: &[String],
    arch: u32,
    native: bool,
) {
    let (name, source, options) = (name.to_string(), source.to_string(), options.to_vec());
    pool.give(token, move || {
        let result = compile(&name, &source, &options, arch, native);
        (name, result)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// Modules compile on the pool's threads and come back by token, in any
    /// order; `give` returns at once. (A source the transformation refuses
    /// needs no NVRTC, so this runs everywhere.)
    #[test]
    fn compiles_come_back_by_token_from_the_pools_threads() {
        let mut pool = compile_pool();
        let refused = "__global__ void k() {\n  cooperative_groups::this_grid().sync();\n}\n";
        for token in 0..5 {
            give_compile(&mut pool, token, "g.cu", refused, &[], 90, false);
        }
        assert_eq!(pool.pending(), 5);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        while got.len() < 5 {
            assert!(Instant::now() < deadline, "the pool never finished: {} of 5", got.len());
            got.extend(pool.take());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(pool.pending(), 0);
        let mut tokens: Vec<u64> = got.iter().map(|(t, _)| *t).collect();
        tokens.sort();
        assert_eq!(tokens, vec![0, 1, 2, 3, 4]);
        for (_, (_, result)) in got {
            match result {
                Err(LoadError::Transform { line, .. }) => assert_eq!(line, 2, "the grid sync's line"),
                other => panic!("expected the transformation's refusal, got {:?}", other.map(|_| ())),
            }
        }
    }
}

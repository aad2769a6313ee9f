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

/// Compile threads: two, so that a small module need not wait behind a large one.
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

/// One module to compile.
struct Job {
    token: u64,
    name: String,
    source: String,
    options: Vec<String>,
    arch: u32,
    native: bool,
}

/// A compile that finished.
pub struct Compiled {
    /// The load's token.
    pub token: u64,
    /// The module's name.
    pub name: String,
    /// The module, or why it did not compile.
    pub result: Result<CompiledModule, LoadError>,
}

/// Worker threads that compile modules in the order given (module doc).
pub struct CompilePool {
    jobs: Option<Sender<Job>>,
    done: Receiver<Compiled>,
    /// Compiled on the caller's thread (no worker ran), for the next `take`.
    ready: Vec<Compiled>,
    /// Compiles given and not yet taken back.
    pending: usize,
}

impl CompilePool {
    /// Starts the workers.
    pub fn new() -> CompilePool {
        let (jobs, queue) = channel::<Job>();
        let (report, done) = channel();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..WORKERS {
            let (queue, report) = (queue.clone(), report.clone());
            let spawned = std::thread::Builder::new().name(format!("gpumuxd-compile{i}")).spawn(move || loop {
                // The lock is held only to take the next job, not while compiling.
                let next = queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
                let Ok(job) = next else { return };
                let result = compile(&job.name, &job.source, &job.options, job.arch, job.native);
                if report.send(Compiled { token: job.token, name: job.name, result }).is_err() {
                    return;
                }
            });
            if let Err(e) = spawned {
                // With no worker at all, `give` compiles in the caller's thread.
                tracing::warn!("a compile thread did not start: {e}");
            }
        }
        CompilePool { jobs: Some(jobs), done, ready: Vec::new(), pending: 0 }
    }

    /// Queues a compile; [`CompilePool::take`] returns it when done. If no
    /// worker runs (none could start), it is compiled here and now.
    pub fn give(&mut self, token: u64, name: &str, source: &str, options: &[String], arch: u32, native: bool) {
        let job = Job { token, name: name.into(), source: source.into(), options: options.to_vec(), arch, native };
        self.pending += 1;
        if let Some(Err(std::sync::mpsc::SendError(job))) = self.jobs.as_ref().map(|j| j.send(job)) {
            // Every worker is gone: compile on this thread rather than never.
            let result = compile(&job.name, &job.source, &job.options, job.arch, job.native);
            self.jobs = None;
            self.ready.push(Compiled { token, name: job.name, result });
        }
    }

    /// The compiles that finished since the last call.
    pub fn take(&mut self) -> Vec<Compiled> {
        let mut out = std::mem::take(&mut self.ready);
        out.extend(self.done.try_iter());
        self.pending = self.pending.saturating_sub(out.len());
        out
    }

    /// Compiles given and not yet taken back.
    pub fn pending(&self) -> usize {
        self.pending
    }
}

impl Default for CompilePool {
    fn default() -> Self {
        CompilePool::new()
    }
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
        let mut pool = CompilePool::new();
        let refused = "__global__ void k() {\n  cooperative_groups::this_grid().sync();\n}\n";
        for token in 0..5 {
            pool.give(token, "g.cu", refused, &[], 90, false);
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
        let mut tokens: Vec<u64> = got.iter().map(|c| c.token).collect();
        tokens.sort();
        assert_eq!(tokens, vec![0, 1, 2, 3, 4]);
        for c in got {
            match c.result {
                Err(LoadError::Transform { line, .. }) => assert_eq!(line, 2, "the grid sync's line"),
                other => panic!("expected the transformation's refusal, got {:?}", other.map(|_| ())),
            }
        }
    }
}

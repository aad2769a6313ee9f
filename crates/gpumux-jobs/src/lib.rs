//! A fixed number of worker threads running a list of independent jobs: the
//! one job pool of `gpumux run` (isolated and shared runs), the experiments
//! (simulations) and `gpumux rt experiment` (task sets).
//!
//! What a caller can rely on, whatever the thread count:
//!
//! * results come back in job order, so output never depends on `--threads`
//!   or `--jobs` as long as each job is deterministic;
//! * the error returned is the one of the first failing job in job order,
//!   the same one a loop over the jobs would return; jobs after a failed one
//!   are not started (jobs are claimed in order, so every job before the
//!   first failure has run);
//! * a panic in a job stops the claiming of new jobs and is resumed on the
//!   caller's thread once the running ones end: a panic is a bug, not an
//!   error to report;
//! * with one worker (or one job) everything runs on the caller's thread.
//!
//! It has no dependencies: progress displays are the caller's, through
//! [`JobPool::on_job_done`].

#![warn(missing_docs)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Runs jobs on up to a fixed number of worker threads.
#[derive(Clone, Copy)]
pub struct JobPool<'a> {
    threads: usize,
    on_job_done: Option<&'a (dyn Fn() + Sync)>,
}

impl std::fmt::Debug for JobPool<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobPool").field("threads", &self.threads).finish_non_exhaustive()
    }
}

impl<'a> JobPool<'a> {
    /// A pool of `threads` workers (at least one).
    pub fn new(threads: usize) -> Self {
        JobPool { threads: threads.max(1), on_job_done: None }
    }

    /// Calls `done` after each job, failed ones included, on the thread that
    /// ran it (a progress bar's `inc(1)`).
    pub fn on_job_done(self, done: &'a (dyn Fn() + Sync)) -> Self {
        JobPool { on_job_done: Some(done), ..self }
    }

    /// Worker threads a list of `jobs` jobs gets: no more than the jobs, at least one.
    pub fn workers(&self, jobs: usize) -> usize {
        self.threads.min(jobs).max(1)
    }

    /// Runs `run` on every job; the results in job order, or the first
    /// error in job order.
    pub fn map<J, R, E>(&self, jobs: &[J], run: impl Fn(&J) -> Result<R, E> + Sync) -> Result<Vec<R>, E>
    where
        J: Sync,
        R: Send,
        E: Send,
    {
        self.map_with(jobs, || (), |(), job| run(job)).map(|(results, _)| results)
    }

    /// [`map`](Self::map) with state per worker, made by `init` when the
    /// worker starts and handed to each job it runs: scratch space to reuse,
    /// or counters to sum. Returns the workers' states beside the results;
    /// which jobs a worker ran depends on timing, so only what does not
    /// depend on that (sums, caches) should be read from them.
    pub fn map_with<J, S, R, E>(
        &self,
        jobs: &[J],
        init: impl Fn() -> S + Sync,
        run: impl Fn(&mut S, &J) -> Result<R, E> + Sync,
    ) -> Result<(Vec<R>, Vec<S>), E>
    where
        J: Sync,
        S: Send,
        R: Send,
        E: Send,
    {
        let done = || {
            if let Some(done) = self.on_job_done {
                done();
            }
        };
        if self.workers(jobs.len()) == 1 {
            let mut state = init();
            let mut results = Vec::with_capacity(jobs.len());
            for job in jobs {
                let r = run(&mut state, job);
                done();
                results.push(r?);
            }
            return Ok((results, vec![state]));
        }
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let worker = || {
            let mut state = init();
            let mut ran = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let _stop_on_panic = StopOnPanic(&stop);
                let r = run(&mut state, job);
                if r.is_err() {
                    stop.store(true, Ordering::Relaxed);
                }
                done();
                ran.push((i, r));
            }
            (state, ran)
        };
        let finished: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.workers(jobs.len())).map(|_| s.spawn(worker)).collect();
            // Join all before resuming a panic, so no worker outlives the call.
            let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            joined.into_iter().map(|j| j.unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
        });
        let mut slots: Vec<Option<Result<R, E>>> = std::iter::repeat_with(|| None).take(jobs.len()).collect();
        let mut states = Vec::with_capacity(finished.len());
        for (state, ran) in finished {
            states.push(state);
            for (i, r) in ran {
                slots[i] = Some(r);
            }
        }
        let mut results = Vec::with_capacity(jobs.len());
        for slot in slots {
            match slot {
                Some(Ok(r)) => results.push(r),
                Some(Err(e)) => return Err(e),
                // Skipped jobs all come after a failed one, which returned above.
                None => unreachable!("a job was skipped with no failure before it"),
            }
        }
        Ok((results, states))
    }
}

/// Stops the pool's claiming of jobs if it is dropped while its thread panics.
struct StopOnPanic<'a>(&'a AtomicBool);

impl Drop for StopOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests;

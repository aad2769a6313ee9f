//! One task's thread: releases its jobs on the schedule and runs each job's subtasks in
//! order, recording response times, misses and how long each subtask held its resource.

use anyhow::Result;
use std::time::{Duration, Instant};

use super::schedule::{response, start_of, Releases};
use super::subtasks::{Runner, Step};

/// What one task's run gave.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Jobs released.
    pub released: u64,
    /// Response time of every job that ran, seconds, in release order.
    pub responses_s: Vec<f64>,
    /// Jobs that ended after their deadline.
    pub misses: u64,
    /// Jobs released that never started: the backlog at the run's end (past the grace).
    pub not_run: u64,
    /// Per subtask: the longest time it held its resource over its stated `C`.
    pub held_over_stated: Vec<f64>,
    /// The most one job's subtasks held their resources beyond their stated times, in all
    /// (`Σ_j max(0, held_j − C_j)`), seconds.
    pub overrun_s: f64,
    /// The worst response of a job that started at its release (its own previous job had
    /// ended), seconds. A job that started late did so because the one before it ended past
    /// this release, after its own deadline: the first job of such a chain is one of these.
    pub worst_fresh_s: f64,
    /// Per subtask: its longest response, from the moment the job got to it (the previous
    /// subtask's end) to its own end, seconds: what the analysis bounds by `w_ij`.
    pub subtask_worst_s: Vec<f64>,
}

/// The task's timing, seconds.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// `T`.
    pub period_s: f64,
    /// `D`.
    pub deadline_s: f64,
    /// How long jobs are released.
    pub duration_s: f64,
    /// After the run, how long a backlog may still be worked off before what is left is
    /// counted as not run.
    pub grace_s: f64,
}

/// Runs the task from `start` (module doc).
pub fn run(runner: &mut Runner<'_>, steps: &[Step], timing: Timing, start: Instant) -> Result<Outcome> {
    let releases = Releases { period_s: timing.period_s, duration_s: timing.duration_s };
    let stop_starting = Duration::from_secs_f64(timing.duration_s + timing.grace_s);
    let mut out = Outcome {
        held_over_stated: vec![0.0; steps.len()],
        subtask_worst_s: vec![0.0; steps.len()],
        ..Outcome::default()
    };
    let mut previous_end: Option<Duration> = None;
    let mut k = 0u64;
    while let Some(release) = releases.release(k) {
        out.released += 1;
        let begin = start_of(release, previous_end);
        let fresh = begin == release;
        if begin > stop_starting {
            out.not_run += releases.jobs() - k;
            out.released = releases.jobs();
            break;
        }
        wait_until(start + begin);
        let mut overrun = 0.0;
        for (j, step) in steps.iter().enumerate() {
            let ready = Instant::now();
            let held = runner.run(step, k)?.as_secs_f64();
            out.subtask_worst_s[j] = out.subtask_worst_s[j].max(ready.elapsed().as_secs_f64());
            overrun += (held - step.stated_s).max(0.0);
            if step.stated_s > 0.0 {
                out.held_over_stated[j] = out.held_over_stated[j].max(held / step.stated_s);
            }
        }
        out.overrun_s = out.overrun_s.max(overrun);
        runner.finish_job();
        let end = start.elapsed();
        let r = response(release, end);
        if r.as_secs_f64() > timing.deadline_s {
            out.misses += 1;
        }
        out.responses_s.push(r.as_secs_f64());
        if fresh {
            out.worst_fresh_s = out.worst_fresh_s.max(r.as_secs_f64());
        }
        previous_end = Some(end);
        k += 1;
    }
    Ok(out)
}

/// Sleeps until about a millisecond before `at`, then spins to it (a sleep alone wakes late
/// by up to the scheduler's slack).
fn wait_until(at: Instant) {
    let now = Instant::now();
    if at > now + Duration::from_millis(2) {
        std::thread::sleep(at - now - Duration::from_millis(1));
    }
    while Instant::now() < at {
        std::thread::yield_now();
    }
}

//! Running workloads on the simulated GPU: a driver loop like the engine's
//! `driver::run`, plus what the experiments need beyond it: stopping at a
//! fixed time (Adriaens's fixed-time spatial runs) and counting the blocks
//! each process completed (his "instructions executed"), and many runs in
//! parallel with a progress bar.

use anyhow::{anyhow, Context, Result};
use gpumux_engine::device::{Command, Device, DeviceStats, Event};
use gpumux_engine::ids::{KernelId, ProcessId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::metrics::{self, PolicyMetrics};
use gpumux_engine::model::Workload;
use gpumux_engine::policies;
use gpumux_engine::policy::Policy;
use gpumux_engine::record::RunRecord;
use gpumux_engine::time::Nanos;
use gpumux_engine::Engine;
use gpumux_sim::SimGpu;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What one simulated run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub record: RunRecord,
    pub stats: DeviceStats,
    /// Blocks completed per process (index = workload process index).
    pub blocks_done: Vec<u64>,
    /// Simulated time at which the run stopped.
    pub end_ns: Nanos,
}

/// Runs `w` under `policy` on a fresh simulated `info`, to completion or
/// until `stop_at`. `only`: one process alone (isolated runs).
pub fn simulate(
    w: &Workload,
    info: &DeviceInfo,
    policy: Box<dyn Policy>,
    only: Option<ProcessId>,
    seed: u64,
    stop_at: Option<Nanos>,
) -> Result<Outcome> {
    let name = policy.name();
    let mut engine =
        Engine::new(w, info.clone(), policy, only).with_context(|| format!("policy {name} on {}", info.name))?;
    let mut dev = SimGpu::new(info.clone(), seed);
    let count_blocks = stop_at.is_some();
    if count_blocks {
        dev.enable_audit();
    }
    let mut owner: HashMap<KernelId, ProcessId> = HashMap::new();
    let mut blocks_done = vec![0u64; w.processes.len()];
    let mut seen = 0usize;
    let mut events: Vec<Event> = Vec::new();
    let mut now: Nanos = 0;
    engine.handle_timeout(0);
    loop {
        while let Some(cmd) = engine.poll_command()? {
            if let Command::Launch { kernel, process, .. } = &cmd {
                owner.insert(*kernel, *process);
            }
            dev.submit(now, cmd)?;
        }
        if engine.is_finished() {
            break;
        }
        let mut deadline = engine.poll_timeout();
        if let Some(t) = stop_at {
            deadline = Some(deadline.map_or(t, |d| d.min(t)));
        }
        events.clear();
        now = dev.advance(deadline, &mut events)?;
        if count_blocks {
            if let Some(a) = dev.audit() {
                for (k, _) in &a.completed[seen..] {
                    if let Some(p) = owner.get(k) {
                        blocks_done[p.0 as usize] += 1;
                    }
                }
                seen = a.completed.len();
            }
        }
        if stop_at.is_some_and(|t| now >= t) {
            break;
        }
        if events.is_empty() {
            engine.handle_timeout(now);
        } else {
            for ev in events.drain(..) {
                engine.handle_event(now, ev)?;
            }
            if deadline.is_some_and(|d| d <= now) {
                engine.handle_timeout(now);
            }
        }
    }
    Ok(Outcome { record: engine.record(), stats: dev.stats(), blocks_done, end_ns: now })
}

/// Metrics of `policy` on `w` against isolated (fcfs) runs of each process.
pub fn policy_metrics(
    w: &Workload,
    info: &DeviceInfo,
    policy: &str,
    alone: &[RunRecord],
    seed: u64,
) -> Result<PolicyMetrics> {
    let p = policies::by_name(policy)?;
    let out = simulate(w, info, p, None, seed, None)?;
    metrics::compute(&out.record, &out.stats, info.num_sms, alone)
        .with_context(|| format!("metrics of {policy} on {}", w.name))
}

/// Isolated runs of every process of `w` (the NTT baseline: alone, fcfs).
pub fn alone_runs(w: &Workload, info: &DeviceInfo, seed: u64) -> Result<Vec<RunRecord>> {
    (0..w.processes.len() as u32)
        .map(|p| Ok(simulate(w, info, Box::new(policies::fcfs::Fcfs), Some(ProcessId(p)), seed, None)?.record))
        .collect()
}

/// Runs `jobs` on `threads` threads with a progress bar on stderr (hidden when
/// `progress` is false); results in job order; the first error wins.
pub fn parallel<J: Sync, R: Send>(
    label: &str,
    jobs: &[J],
    threads: usize,
    progress: bool,
    f: impl Fn(&J) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    let bar = if progress { ProgressBar::new(jobs.len() as u64) } else { ProgressBar::hidden() };
    bar.set_style(
        ProgressStyle::with_template("{prefix:>22} [{bar:30}] {pos}/{len} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(label.to_string());
    let slots: Vec<Mutex<Option<Result<R>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1).min(jobs.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(j) = jobs.get(i) else { break };
                let r = f(j);
                if let Ok(mut slot) = slots[i].lock() {
                    *slot = Some(r);
                }
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    slots
        .into_iter()
        .map(|s| {
            s.into_inner()
                .map_err(|_| anyhow!("a worker thread panicked"))?
                .ok_or_else(|| anyhow!("a job did not run"))?
        })
        .collect()
}

//! `gpumux run`: one workload under several policies on one device, with the
//! isolated runs that NTT is normalised by, in parallel on the host's cores.

use crate::devices::DeviceSpec;
use crate::progress::{self, Progress};
use crate::work;
use anyhow::{anyhow, Context, Result};
use gpumux_engine::device::{DeviceStats, TraceSpan};
use gpumux_engine::ids::ProcessId;
use gpumux_engine::metrics::{self, PolicyMetrics};
use gpumux_engine::model::Workload;
use gpumux_engine::record::RunRecord;
use gpumux_engine::{driver, policies, Engine};
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The policy that isolated runs use: the process alone on the GPU, as today.
pub const ALONE_POLICY: &str = "fcfs";

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub device: DeviceSpec,
    pub policies: Vec<String>,
    pub seed: u64,
    pub trace: bool,
    pub progress: progress::Mode,
    pub threads: usize,
    /// Largest estimated work (`work.rs`) run without complaint; `f64::INFINITY`: no limit.
    pub max_work: f64,
}

/// The result of `gpumux run`, as printed with `--json`.
#[derive(Debug, Serialize)]
pub struct RunReport {
    pub workload: String,
    pub device: String,
    pub seed: u64,
    pub policies: Vec<PolicyMetrics>,
    #[serde(skip)]
    pub traces: Vec<(String, u16, Vec<TraceSpan>)>,
    #[serde(skip)]
    pub stats: Vec<DeviceStats>,
}

enum Job {
    Alone(ProcessId),
    Shared(usize),
}

struct JobResult {
    record: RunRecord,
    stats: DeviceStats,
    trace: Vec<TraceSpan>,
}

/// Runs one job: the whole workload under a policy, or one process alone.
fn run_job(
    w: &Workload,
    opts: &RunOptions,
    policy: &str,
    only: Option<ProcessId>,
    progress: &Progress,
) -> Result<JobResult> {
    let info = opts.device.info()?;
    let policy_box = policies::by_name(policy)?;
    let mut engine = Engine::new(w, info, policy_box, only)?;
    let mut device = opts.device.open(opts.seed)?;
    if opts.trace && only.is_none() {
        device.device().enable_trace();
    }
    let processes = if only.is_some() { 1 } else { w.processes.len() };
    progress.add(work::PROCESS_COST * processes as f64);
    // Work so far in this run, in the estimate's units; the shared counter gets the increments.
    let mut reported = 0.0;
    let out = driver::run_with_progress(&mut engine, device.device(), &mut |p| {
        let done = p.blocks_completed as f64 + work::OP_COST * p.ops_issued as f64;
        progress.add(done - reported);
        reported = done;
    });
    device.finish();
    let out = out.with_context(|| match only {
        Some(p) => format!("isolated run of process {}", w.processes[p.0 as usize].name),
        None => format!("run under policy {policy}"),
    })?;
    Ok(JobResult { record: out.record, stats: out.stats, trace: out.trace })
}

pub fn run_workload(w: &Workload, opts: &RunOptions) -> Result<RunReport> {
    // Reject bad policy names before doing any work.
    for p in &opts.policies {
        policies::by_name(p)?;
    }
    let info = opts.device.info()?;
    opts.device.check(w)?;
    let mut jobs: Vec<Job> = (0..w.processes.len() as u32).map(|p| Job::Alone(ProcessId(p))).collect();
    jobs.extend((0..opts.policies.len()).map(Job::Shared));
    let threads = opts.threads.max(1).min(jobs.len());
    // Before any work: refuse what would take hours unless asked for.
    let estimate = work::estimate(w, &info, opts.policies.len())?;
    work::check(&estimate, opts.max_work, threads)?;
    let progress = Progress::new(&estimate, jobs.len());
    let results: Vec<Mutex<Option<Result<JobResult>>>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        if opts.progress != progress::Mode::Off {
            s.spawn(|| progress.report(opts.progress));
        }
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let (policy, only) = match job {
                        Job::Alone(p) => (ALONE_POLICY, Some(*p)),
                        Job::Shared(k) => (opts.policies[*k].as_str(), None),
                    };
                    let r = run_job(w, opts, policy, only, &progress);
                    progress.run_done();
                    if let Ok(mut slot) = results[i].lock() {
                        *slot = Some(r);
                    }
                })
            })
            .collect();
        for h in workers {
            // A panicked worker leaves its slot empty: reported below.
            let _ = h.join();
        }
        progress.finish();
    });
    let mut alone = Vec::new();
    let mut shared = Vec::new();
    for (job, slot) in jobs.iter().zip(results) {
        let r = slot
            .into_inner()
            .map_err(|_| anyhow!("a worker thread panicked"))?
            .ok_or_else(|| anyhow!("a job did not run"))??;
        match job {
            Job::Alone(_) => alone.push(r.record),
            Job::Shared(k) => shared.push((*k, r)),
        }
    }
    let mut report = RunReport {
        workload: w.name.clone(),
        device: info.name.clone(),
        seed: opts.seed,
        policies: Vec::new(),
        traces: Vec::new(),
        stats: Vec::new(),
    };
    for (k, r) in shared {
        let m = metrics::compute(&r.record, &r.stats, info.num_sms, &alone)
            .with_context(|| format!("metrics of policy {}", opts.policies[k]))?;
        if opts.trace {
            report.traces.push((m.policy.clone(), info.num_sms, r.trace));
        }
        report.stats.push(r.stats);
        report.policies.push(m);
    }
    Ok(report)
}

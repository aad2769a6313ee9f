//! `gpumux run`: one workload under several policies on one device, with the
//! isolated runs that NTT is normalised by, in parallel on the host's cores.

use crate::devices::DeviceSpec;
use crate::progress::{self, Progress};
use crate::protocol_log::ProtocolLog;
use crate::work;
use anyhow::{Context, Result};
use gpumux_engine::device::{DeviceStats, TraceSpan};
use gpumux_engine::ids::ProcessId;
use gpumux_engine::metrics::{self, PolicyMetrics};
use gpumux_engine::model::Workload;
use gpumux_engine::record::RunRecord;
use gpumux_engine::{driver, policies, Replay};
use gpumux_jobs::JobPool;
use serde::Serialize;

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
    log: ProtocolLog,
) -> Result<JobResult> {
    let info = opts.device.info()?;
    let policy_box = policies::by_name(policy)?;
    let mut engine = Replay::new(w, info, policy_box, only)?;
    let mut device = opts.device.open(opts.seed)?;
    if opts.trace && only.is_none() {
        device.device().enable_trace();
    }
    let processes = if only.is_some() { 1 } else { w.processes.len() };
    progress.add(work::PROCESS_COST * processes as f64);
    let out = driver::run(&mut engine, device.device(), &mut (log, progress.of_run()));
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
    // Before any work: refuse what would take hours unless asked for.
    let estimate = work::estimate(w, &info, opts.policies.len())?;
    let progress = Progress::new(&estimate, jobs.len());
    let run_done = || progress.run_done();
    let pool = JobPool::new(opts.threads).on_job_done(&run_done);
    work::check(&estimate, opts.max_work, pool.workers(jobs.len()))?;
    let log = ProtocolLog::from_env();
    let results = std::thread::scope(|s| {
        if opts.progress != progress::Mode::Off {
            s.spawn(|| progress.report(opts.progress));
        }
        let _finish = progress.finish_on_drop();
        pool.map(&jobs, |job| {
            let (policy, only) = match job {
                Job::Alone(p) => (ALONE_POLICY, Some(*p)),
                Job::Shared(k) => (opts.policies[*k].as_str(), None),
            };
            run_job(w, opts, policy, only, &progress, log)
        })
    })?;
    let mut alone = Vec::new();
    let mut shared = Vec::new();
    for (job, r) in jobs.iter().zip(results) {
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

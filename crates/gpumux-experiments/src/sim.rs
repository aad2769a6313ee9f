//! Running workloads on the simulated GPU through the engine's driver loop,
//! with what the experiments need beyond a plain run: stopping at a fixed
//! time (Adriaens's fixed-time spatial runs), counting the blocks each
//! process completed (his "instructions executed"), where a prioritised
//! process's time went ([`HpTime`]), and many runs in parallel with a
//! progress bar.

use anyhow::{Context, Result};
use gpumux_engine::device::{Command, DeviceStats, Event};
use gpumux_engine::driver::{self, DriverHooks};
use gpumux_engine::ids::{KernelId, ProcessId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::model::Workload;
use gpumux_engine::policy::Policy;
use gpumux_engine::record::RunRecord;
use gpumux_engine::time::Nanos;
use gpumux_engine::{ArrivalOrder, Replay};
use gpumux_jobs::JobPool;
use gpumux_sim::memory::MemModel;
use gpumux_sim::{MemStats, SimGpu};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;

/// What one simulated run produced.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// What the engine recorded: runs, preemptions, SM use.
    pub record: RunRecord,
    /// The simulator's counters (blocks, context saves, switch time).
    pub stats: DeviceStats,
    /// What the simulator's memory model did (DRAM utilisation, saturation).
    pub mem: MemStats,
    /// Where the highest-priority process's time went (when priorities differ).
    pub hp: HpTime,
    /// Blocks completed per process (index = workload process index).
    pub blocks_done: Vec<u64>,
    /// Simulated time at which the run stopped.
    pub end_ns: Nanos,
}

/// Where the highest-priority processes' completed runs spent their time,
/// seen from the driver (commands and events), summed over their runs.
/// Evidence for what preemption latency costs a prioritised process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HpTime {
    /// Σ durations of the completed runs.
    pub run_ns: f64,
    /// Time with no kernel of theirs on the GPU while a preemption (issued
    /// while they held nothing) was freeing SMs for them: from the first
    /// `Retreat` to their `Launch`.
    pub wait_first_sm_ns: f64,
    /// Time with at least one kernel of theirs on the GPU.
    pub kernel_ns: f64,
    /// Completed runs.
    pub runs: f64,
    /// Waits for a first SM that began in the completed runs.
    pub waits: f64,
}

/// Intervals collected during a run from the driver's commands and events (a
/// driver hook), clipped to completed runs at the end.
#[derive(Default)]
struct HpTracker {
    top: Option<i32>,
    live: std::collections::HashSet<gpumux_engine::ids::LaunchId>,
    waiting_since: Option<Nanos>,
    kernel_since: Option<Nanos>,
    waits: Vec<(Nanos, Nanos)>,
    kernels: Vec<(Nanos, Nanos)>,
}

impl HpTracker {
    fn new(w: &Workload) -> Self {
        let top = w.processes.iter().map(|p| p.priority).max();
        let bottom = w.processes.iter().map(|p| p.priority).min();
        HpTracker { top: if top != bottom { top } else { None }, ..Default::default() }
    }

    fn finish(&self, record: &RunRecord) -> HpTime {
        let Some(top) = self.top else { return HpTime::default() };
        let runs: Vec<(Nanos, Nanos)> = record
            .processes
            .iter()
            .filter(|p| p.priority == top)
            .flat_map(|p| p.runs.iter().map(|r| (r.start_ns, r.end_ns)))
            .collect();
        let within = |iv: &[(Nanos, Nanos)]| -> f64 {
            iv.iter()
                .map(|&(a, b)| runs.iter().map(|&(s, e)| b.min(e).saturating_sub(a.max(s)) as f64).sum::<f64>())
                .sum()
        };
        let waits = self.waits.iter().filter(|&&(a, _)| runs.iter().any(|&(s, e)| a >= s && a < e)).count();
        HpTime {
            runs: runs.len() as f64,
            waits: waits as f64,
            run_ns: runs.iter().map(|&(s, e)| (e - s) as f64).sum(),
            wait_first_sm_ns: within(&self.waits),
            kernel_ns: within(&self.kernels),
        }
    }
}

impl DriverHooks for HpTracker {
    fn on_command(&mut self, now: Nanos, cmd: &Command) {
        let Some(top) = self.top else { return };
        match cmd {
            Command::Retreat { .. } if self.live.is_empty() && self.waiting_since.is_none() => {
                self.waiting_since = Some(now);
            }
            Command::Launch { launch, priority, .. } if *priority >= top => {
                if let Some(s) = self.waiting_since.take() {
                    self.waits.push((s, now));
                }
                if self.live.is_empty() {
                    self.kernel_since = Some(now);
                }
                self.live.insert(*launch);
            }
            _ => {}
        }
    }

    fn on_event(&mut self, now: Nanos, ev: &Event) {
        if let Event::LaunchEnded { launch, .. } = ev {
            if self.live.remove(launch) && self.live.is_empty() {
                if let Some(s) = self.kernel_since.take() {
                    self.kernels.push((s, now));
                }
            }
        }
    }
}

/// How an experiment's runs are set up: the seed, and the model knobs the
/// experiments expose to test an explanation (`--mem-ratio`,
/// `--preempt-overhead-us`, `--async-launches`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimSetup {
    /// Seed of per-block time variation.
    pub seed: u64,
    /// Saturation ratio κ for every device instead of its preset's
    /// (`gpumux_sim::memory`); 1 is the memory model before 2026-11-23.
    pub mem_ratio: Option<f64>,
    /// Fixed cost of every SM preemption (`SimGpu::with_preempt_overhead`).
    pub preempt_overhead_ns: Nanos,
    /// How the engine orders active kernels (matters for async processes).
    pub arrival_order: ArrivalOrder,
}

impl SimSetup {
    /// The simulator as it ships, with `seed`.
    pub fn seeded(seed: u64) -> Self {
        SimSetup { seed, mem_ratio: None, preempt_overhead_ns: 0, arrival_order: ArrivalOrder::HeadOfStream }
    }

    /// The memory model for `info`: the preset's (the thesis's GPU and its
    /// cut-down copies, whose block times are calibrated on all 30 SMs,
    /// included), with κ overridden when `mem_ratio` is set.
    pub fn memory_of(&self, info: &DeviceInfo) -> MemModel {
        let mut m = if info.name == crate::thesis::FX5800_NAME {
            crate::thesis::fx5800_memory()
        } else {
            gpumux_sim::presets::memory_model(info)
        };
        if let Some(ratio) = self.mem_ratio {
            // Same ratio on the calibration device (cut-down copies keep its per-SM ceiling).
            let sms = m.calibration_sms.unwrap_or(info.num_sms) as f64;
            m.sm_bandwidth = ratio * info.mem_bandwidth / sms.max(1.0);
        }
        m
    }

    /// A fresh simulated `info` with this setup.
    pub fn device(&self, info: &DeviceInfo) -> SimGpu {
        SimGpu::new(info.clone(), self.seed)
            .with_memory(self.memory_of(info))
            .with_preempt_overhead(self.preempt_overhead_ns)
    }
}

/// Runs `w` under `policy` on a fresh simulated `info` set up by `setup`, to
/// completion or until `stop_at`. `only`: one process alone (isolated runs).
pub fn simulate(
    w: &Workload,
    info: &DeviceInfo,
    policy: Box<dyn Policy>,
    only: Option<ProcessId>,
    setup: &SimSetup,
    stop_at: Option<Nanos>,
) -> Result<Outcome> {
    let name = policy.name();
    let mut engine = Replay::new(w, info.clone(), policy, only)
        .with_context(|| format!("policy {name} on {}", info.name))?
        .with_arrival_order(setup.arrival_order);
    let mut dev = setup.device(info);
    if stop_at.is_some() {
        dev.enable_audit();
    }
    let mut hp = HpTracker::new(w);
    let mut owners = KernelOwners::default();
    let hooks = &mut (&mut hp, &mut owners);
    let out = match stop_at {
        Some(t) => driver::run_until(&mut engine, &mut dev, t, hooks)?,
        None => driver::run(&mut engine, &mut dev, hooks)?,
    };
    // Blocks per process, from the audit kept for fixed-time runs.
    let mut blocks_done = vec![0u64; w.processes.len()];
    if let Some(audit) = dev.audit() {
        for (k, _) in &audit.completed {
            if let Some(p) = owners.0.get(k) {
                blocks_done[p.0 as usize] += 1;
            }
        }
    }
    let hp = hp.finish(&out.record);
    Ok(Outcome { record: out.record, stats: out.stats, mem: dev.mem_stats(), hp, blocks_done, end_ns: out.end_ns })
}

/// The process each launched kernel belongs to, from the driver's commands.
#[derive(Default)]
struct KernelOwners(HashMap<KernelId, ProcessId>);

impl DriverHooks for KernelOwners {
    fn on_command(&mut self, _now: Nanos, command: &Command) {
        if let Command::Launch { kernel, process, .. } = command {
            self.0.insert(*kernel, *process);
        }
    }
}

/// Runs `jobs` on `threads` threads with a progress bar on stderr (hidden when
/// `progress` is false); results in job order; the first error in job order wins.
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
    let job_done = || bar.inc(1);
    let results = JobPool::new(threads).on_job_done(&job_done).map(jobs, f);
    bar.finish_and_clear();
    results
}

//! Multiprogram metrics (Eyerman & Eeckhout; Tanasic 4.1), from a shared run
//! and an isolated run of each process on the same device.
//!
//! * NTT_i = T_shared,i / T_alone,i, per process, with T the mean duration of
//!   its completed runs; ANTT = mean NTT (lower is better).
//! * STP = Σ T_alone,i / T_shared,i (higher is better; N = no slowdown).
//! * fairness = min_i NP_i / max_i NP_i with NP_i = 1 / NTT_i (1 = fair).

use crate::device::DeviceStats;
use crate::ids::ProcessId;
use crate::record::{ProcessRecord, RunRecord};
use crate::time::Nanos;
use serde::Serialize;
use std::collections::HashMap;

/// One process's figures under one policy.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessMetrics {
    /// The process's name.
    pub name: String,
    /// Its priority.
    pub priority: i32,
    /// Normalised turnaround time: mean run shared / mean run alone.
    pub ntt: f64,
    /// From its arrival to the end of its last completed run.
    pub turnaround_ns: Nanos,
    /// Completed runs in the shared run.
    pub runs: usize,
    /// Mean duration of those runs.
    pub mean_run_ns: f64,
    /// Mean duration of its runs alone.
    pub alone_run_ns: f64,
}

/// Percentiles of a set of latencies.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// How many samples.
    pub count: usize,
    /// Median.
    pub p50_ns: Nanos,
    /// 99th percentile.
    pub p99_ns: Nanos,
    /// Largest.
    pub max_ns: Nanos,
}

impl LatencySummary {
    /// Nearest-rank percentiles.
    pub fn from_samples(mut v: Vec<Nanos>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_unstable();
        let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        LatencySummary { count: v.len(), p50_ns: rank(0.50), p99_ns: rank(0.99), max_ns: v[v.len() - 1] }
    }
}

/// The figures of one policy on one workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PolicyMetrics {
    /// The policy's name.
    pub policy: String,
    /// Average NTT (lower is better).
    pub antt: f64,
    /// System throughput, Σ 1 / NTT (higher is better).
    pub stp: f64,
    /// min NP / max NP (1 is fair).
    pub fairness: f64,
    /// End of the shared run.
    pub makespan_ns: Nanos,
    /// Mean turnaround of the processes at the highest priority, when
    /// priorities differ; `None` when every process has the same priority.
    pub high_priority_turnaround_ns: Option<f64>,
    /// From asking for an SM back to getting it.
    pub preemption_latency: LatencySummary,
    /// Fraction of SM-time with at least one resident block.
    pub sm_utilisation: f64,
    /// Per process, in workload order.
    pub processes: Vec<ProcessMetrics>,
}

/// Why metrics cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// A process with no completed run has no NTT.
    #[error("process `{0}` completed no run in the shared run")]
    NoRuns(String),
    /// A process without its isolated run has nothing to normalise by.
    #[error("no isolated run for process `{0}`")]
    NoAlone(String),
}

/// Combines a shared run with the isolated runs (`alone[i]` has process i).
pub fn compute(
    shared: &RunRecord,
    stats: &DeviceStats,
    num_sms: u16,
    alone: &[RunRecord],
) -> Result<PolicyMetrics, MetricsError> {
    // The first isolated record of each process that completed a run (one
    // pass: a search per process made metrics O(processes²)).
    let mut alone_of: HashMap<ProcessId, &ProcessRecord> = HashMap::new();
    for q in alone.iter().flat_map(|r| r.processes.iter()).filter(|q| !q.runs.is_empty()) {
        alone_of.entry(q.id).or_insert(q);
    }
    let mut processes = Vec::with_capacity(shared.processes.len());
    for p in &shared.processes {
        if p.runs.is_empty() {
            return Err(MetricsError::NoRuns(p.name.clone()));
        }
        let a = alone_of.get(&p.id).ok_or_else(|| MetricsError::NoAlone(p.name.clone()))?;
        let (shared_ns, alone_ns) = (p.mean_run_ns(), a.mean_run_ns());
        processes.push(ProcessMetrics {
            name: p.name.clone(),
            priority: p.priority,
            ntt: if alone_ns > 0.0 { shared_ns / alone_ns } else { 1.0 },
            turnaround_ns: p.turnaround_ns(),
            runs: p.runs.len(),
            mean_run_ns: shared_ns,
            alone_run_ns: alone_ns,
        });
    }
    let n = processes.len() as f64;
    let antt = processes.iter().map(|p| p.ntt).sum::<f64>() / n;
    let stp = processes.iter().map(|p| 1.0 / p.ntt).sum::<f64>();
    let np: Vec<f64> = processes.iter().map(|p| 1.0 / p.ntt).collect();
    let fairness = np.iter().cloned().fold(f64::INFINITY, f64::min) / np.iter().cloned().fold(0.0, f64::max);
    let top = processes.iter().map(|p| p.priority).max();
    let bottom = processes.iter().map(|p| p.priority).min();
    let high_priority_turnaround_ns = (top != bottom).then(|| {
        let hp: Vec<f64> = processes.iter().filter(|p| Some(p.priority) == top).map(|p| p.mean_run_ns).collect();
        hp.iter().sum::<f64>() / hp.len() as f64
    });
    let sm_time = shared.makespan_ns as f64 * num_sms as f64;
    Ok(PolicyMetrics {
        policy: shared.policy.clone(),
        antt,
        stp,
        fairness,
        makespan_ns: shared.makespan_ns,
        high_priority_turnaround_ns,
        preemption_latency: LatencySummary::from_samples(shared.preemptions.iter().map(|s| s.latency_ns).collect()),
        sm_utilisation: if sm_time > 0.0 { stats.sm_busy_ns as f64 / sm_time } else { 0.0 },
        processes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::RunSpan;

    fn rec(runs: &[(u64, u64)]) -> RunRecord {
        RunRecord {
            policy: "t".into(),
            makespan_ns: 100,
            processes: runs
                .iter()
                .enumerate()
                .map(|(i, &(s, e))| ProcessRecord {
                    id: ProcessId(i as u32),
                    name: format!("p{i}"),
                    priority: 0,
                    arrival_ns: 0,
                    runs: vec![RunSpan { start_ns: s, end_ns: e }],
                })
                .collect(),
            preemptions: vec![],
            kernels_completed: 0,
        }
    }

    #[test]
    fn ntt_stp_fairness_by_hand() {
        // p0: 10 alone, 20 shared (NTT 2); p1: 10 alone, 40 shared (NTT 4).
        let shared = rec(&[(0, 20), (0, 40)]);
        let alone = vec![rec(&[(0, 10)]), {
            let mut r = rec(&[(0, 10), (0, 10)]);
            r.processes.remove(0);
            r
        }];
        let m = compute(&shared, &DeviceStats::default(), 1, &alone).expect("metrics");
        assert_eq!(m.processes[0].ntt, 2.0);
        assert_eq!(m.processes[1].ntt, 4.0);
        assert_eq!(m.antt, 3.0);
        assert_eq!(m.stp, 0.75);
        assert_eq!(m.fairness, 0.5);
        assert_eq!(m.high_priority_turnaround_ns, None);
    }

    #[test]
    fn percentiles_nearest_rank() {
        let s = LatencySummary::from_samples((1..=100).collect());
        assert_eq!((s.p50_ns, s.p99_ns, s.max_ns, s.count), (50, 99, 100, 100));
        assert_eq!(LatencySummary::from_samples(vec![]).count, 0);
    }
}

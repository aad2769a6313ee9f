//! What a run leaves behind: per-process run spans and preemption samples.
//! `crate::metrics` turns a shared run and the isolated runs into NTT, STP...

use crate::ids::ProcessId;
use crate::time::Nanos;
use serde::{Deserialize, Serialize};

/// One completed run of a process's operation sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpan {
    /// When its first operation was issued.
    pub start_ns: Nanos,
    /// When its last operation completed.
    pub end_ns: Nanos,
}

impl RunSpan {
    /// How long it took.
    pub fn duration(&self) -> Nanos {
        self.end_ns - self.start_ns
    }
}

/// What one process did in a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessRecord {
    /// Its index in the workload.
    pub id: ProcessId,
    /// Its name.
    pub name: String,
    /// Its priority.
    pub priority: i32,
    /// When it arrived.
    pub arrival_ns: Nanos,
    /// Completed runs of the operation sequence, in order.
    pub runs: Vec<RunSpan>,
}

impl ProcessRecord {
    /// Mean duration of completed runs.
    pub fn mean_run_ns(&self) -> f64 {
        if self.runs.is_empty() {
            return f64::NAN;
        }
        self.runs.iter().map(|r| r.duration() as f64).sum::<f64>() / self.runs.len() as f64
    }

    /// From arrival to the end of the last completed run.
    pub fn turnaround_ns(&self) -> Nanos {
        self.runs.last().map_or(0, |r| r.end_ns.saturating_sub(self.arrival_ns))
    }
}

/// One SM taken back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionSample {
    /// When the policy asked for the SM (or the engine, removing its process).
    pub at_ns: Nanos,
    /// Until the device released it.
    pub latency_ns: Nanos,
}

/// What one run (a policy on a workload) left behind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The policy's name.
    pub policy: String,
    /// When the last process finished.
    pub makespan_ns: Nanos,
    /// Per process, in workload order.
    pub processes: Vec<ProcessRecord>,
    /// Every SM taken back.
    pub preemptions: Vec<PreemptionSample>,
    /// Kernels that ran to the end.
    pub kernels_completed: u64,
}

//! What a run leaves behind: per-process run spans and preemption samples.
//! `crate::metrics` turns a shared run and the isolated runs into NTT, STP...

use crate::ids::ProcessId;
use crate::time::Nanos;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpan {
    pub start_ns: Nanos,
    pub end_ns: Nanos,
}

impl RunSpan {
    pub fn duration(&self) -> Nanos {
        self.end_ns - self.start_ns
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessRecord {
    pub id: ProcessId,
    pub name: String,
    pub priority: i32,
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionSample {
    /// When the policy asked for the SM.
    pub at_ns: Nanos,
    /// Until the device released it.
    pub latency_ns: Nanos,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub policy: String,
    pub makespan_ns: Nanos,
    pub processes: Vec<ProcessRecord>,
    pub preemptions: Vec<PreemptionSample>,
    pub kernels_completed: u64,
}

//! The workload model: processes and their operations. Files are parsed and
//! validated into this by the `gpumux-workload` crate; the engine trusts it.

use crate::kernel::KernelDesc;
use crate::time::Nanos;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub name: String,
    pub processes: Vec<ProcessSpec>,
    /// Tanasic 4.1: replay every process until each has completed at least
    /// this many runs; statistics cover completed runs only. `None`: each
    /// process does its own `repetitions` and stops.
    pub replay_min_runs: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessSpec {
    pub name: String,
    /// Larger is more urgent.
    pub priority: i32,
    /// Share for proportional policies (DSS tokens); 1.0 by default.
    pub weight: f64,
    pub arrival_ns: Nanos,
    /// Runs of the operation sequence, one after the other.
    pub repetitions: u32,
    /// How many GPU operations the host may have outstanding while it goes on
    /// (0: every GPU operation is waited for, like synchronous CUDA calls).
    pub async_depth: u32,
    pub ops: Vec<Op>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    CopyToDevice {
        bytes: u64,
    },
    CopyToHost {
        bytes: u64,
    },
    Kernel(Arc<KernelDesc>),
    /// Host computation between GPU calls.
    Cpu {
        ns: Nanos,
    },
    /// The host waits until every GPU operation it issued has completed
    /// (`cudaStreamSynchronize`, or a blocking `cudaMemcpy` before the host
    /// reads the result). Only matters with `async_depth > 0`: a synchronous
    /// process waits after every operation anyway.
    Sync,
}

impl Op {
    pub fn is_gpu(&self) -> bool {
        !matches!(self, Op::Cpu { .. } | Op::Sync)
    }
}

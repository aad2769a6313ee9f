//! The workload model: processes and their operations. Files are parsed and
//! validated into this by the `gpumux-workload` crate; the engine trusts it.

use crate::kernel::KernelDesc;
use crate::time::Nanos;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Processes to replay together (`crate::Replay`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Its name, as shown.
    pub name: String,
    /// Its processes; a process's index is its `ProcessId`.
    pub processes: Vec<ProcessSpec>,
    /// Tanasic 4.1: replay every process until each has completed at least
    /// this many runs; statistics cover completed runs only. `None`: each
    /// process does its own `repetitions` and stops.
    pub replay_min_runs: Option<u32>,
}

/// One process of a workload: who it is and the operations its host runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessSpec {
    /// Its name.
    pub name: String,
    /// Larger is more urgent.
    pub priority: i32,
    /// Share for proportional policies (DSS tokens); 1.0 by default.
    pub weight: f64,
    /// When it starts its first run.
    pub arrival_ns: Nanos,
    /// Runs of the operation sequence, one after the other.
    pub repetitions: u32,
    /// How many GPU operations the host may have outstanding while it goes on
    /// (0: every GPU operation is waited for, like synchronous CUDA calls).
    pub async_depth: u32,
    /// One run's operations, in order.
    pub ops: Vec<Op>,
}

/// One operation of a process's host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// Copy to device memory.
    CopyToDevice {
        /// How much.
        bytes: u64,
    },
    /// Copy to host memory.
    CopyToHost {
        /// How much.
        bytes: u64,
    },
    /// Launch a kernel.
    Kernel(Arc<KernelDesc>),
    /// Host computation between GPU calls.
    Cpu {
        /// How long.
        ns: Nanos,
    },
    /// The host waits until every GPU operation it issued has completed
    /// (`cudaStreamSynchronize`, or a blocking `cudaMemcpy` before the host
    /// reads the result). Only matters with `async_depth > 0`: a synchronous
    /// process waits after every operation anyway.
    Sync,
    /// Records event `event` at this point of the process's stream
    /// (`cudaEventRecord`): a marker that ends when the work before it has.
    Record {
        /// The event's name, shared by the processes that wait for it.
        event: String,
    },
    /// The process's stream waits for an event another process (or this
    /// one) records, without the host waiting (`cudaStreamWaitEvent`): the
    /// k-th `WaitEvent` of a name in a process waits for the k-th `Record`
    /// of that name, so a pipeline's stages pair up step by step whatever
    /// their hosts' pace. If that recording has not been issued yet, the
    /// host waits for it before issuing more (a run whose recording never
    /// comes stalls, and the driver says so).
    WaitEvent {
        /// The event's name.
        event: String,
    },
}

impl Op {
    /// Whether it goes to the process's stream (a copy, a kernel, a recorded
    /// event or a wait for one).
    pub fn is_gpu(&self) -> bool {
        !matches!(self, Op::Cpu { .. } | Op::Sync)
    }
}

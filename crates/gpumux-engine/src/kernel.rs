//! What the engine and devices know about a kernel and a device.

use crate::time::Nanos;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A kernel as the scheduler sees it: how many blocks, what each block needs
/// from an SM, and (for the simulator) how long a block takes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelDesc {
    pub name: String,
    /// Number of thread blocks of the linearised grid.
    pub blocks: u64,
    pub threads_per_block: u32,
    pub regs_per_thread: u32,
    /// Static plus dynamic shared memory, bytes.
    pub smem_per_block: u32,
    /// Mean block time when the block runs with no memory contention.
    pub block_time_ns: Nanos,
    /// Relative spread of block time: each block takes mean × (1 ± spread), uniform.
    pub block_time_spread: f64,
    /// Memory-bound share of a block's time when only its SM's own memory
    /// ceiling limits it, in [0, 1]. The simulator (gpumux-sim `memory.rs`)
    /// stretches that share when all resident blocks together ask for more
    /// than the device's bandwidth; alone on the whole GPU the kernel uses
    /// min(1, m × κ) of the bandwidth (κ: the SMs' summed ceiling / bandwidth).
    pub mem_intensity: f64,
    /// A block can be dropped mid-way and rerun from scratch (flushing).
    pub idempotent: bool,
    /// Cap on resident blocks per SM beyond the SM's resource limits (for
    /// workloads that give measured occupancy rather than per-thread resources).
    pub max_blocks_per_sm: Option<u32>,
    /// For the CUDA backend: which suite kernel, with which size parameters.
    pub suite: Option<SuiteKernelRef>,
}

/// Reference to a kernel of the CUDA benchmark suite, as a workload file
/// writes it: `suite = { name = "kmeans", kernel = "assign", params = { n = 65536 } }`
/// (or `name = "kmeans.assign"`). The workload parser fills the fields once;
/// which apps, kernels and params exist is the CUDA backend's to check
/// (`gpumux_cuda::device::SuiteTarget::resolve`), since only it knows the suite.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SuiteKernelRef {
    /// The suite app (`kmeans`).
    pub app: String,
    /// One kernel of the app (`assign`); `None` names a single-kernel app's kernel.
    pub kernel: Option<String>,
    /// Size parameters (`n`, `k`, ...), as the file gives them.
    pub params: BTreeMap<String, f64>,
}

impl std::fmt::Display for SuiteKernelRef {
    /// `APP` or `APP.KERNEL`, the way messages name a suite kernel.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kernel {
            Some(k) => write!(f, "{}.{k}", self.app),
            None => f.write_str(&self.app),
        }
    }
}

impl KernelDesc {
    /// Registers a resident block holds.
    pub fn regs_per_block(&self) -> u64 {
        self.regs_per_thread as u64 * self.threads_per_block as u64
    }

    /// Bytes of on-chip state of one resident block (4-byte registers plus
    /// shared memory): what a context switch saves and restores.
    pub fn context_bytes(&self) -> u64 {
        self.regs_per_block() * 4 + self.smem_per_block as u64
    }
}

/// Per-SM resource limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmLimits {
    pub max_threads: u32,
    pub max_blocks: u32,
    pub registers: u32,
    pub smem_bytes: u32,
}

/// What a device offers, as the engine and policies need to know it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub num_sms: u16,
    pub sm: SmLimits,
    /// Device memory bandwidth, bytes per second.
    pub mem_bandwidth: f64,
    /// Host-device bandwidth per direction, bytes per second.
    pub pcie_bandwidth: f64,
    /// Fixed cost of one copy (driver + DMA setup).
    pub pcie_latency_ns: Nanos,
    /// Bytes of device memory.
    pub mem_bytes: u64,
}

/// Why a kernel cannot run on a device at all.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("kernel `{kernel}` cannot fit one block on an SM of {device}: {reason}")]
pub struct DoesNotFit {
    pub kernel: String,
    pub device: String,
    pub reason: String,
}

impl DeviceInfo {
    /// Resident blocks of `k` one SM holds (occupancy), limited by threads,
    /// blocks, registers and shared memory, and by the kernel's own cap.
    pub fn blocks_per_sm(&self, k: &KernelDesc) -> Result<u32, DoesNotFit> {
        let mut limit = self.sm.max_blocks;
        let mut why = "block slots";
        let mut cap = |n: u64, what: &'static str| {
            let n = n.min(u32::MAX as u64) as u32;
            if n < limit {
                limit = n;
                why = what;
            }
        };
        if let Some(n) = self.sm.max_threads.checked_div(k.threads_per_block) {
            cap(n as u64, "threads");
        }
        if k.regs_per_block() > 0 {
            cap(self.sm.registers as u64 / k.regs_per_block(), "registers");
        }
        if let Some(n) = self.sm.smem_bytes.checked_div(k.smem_per_block) {
            cap(n as u64, "shared memory");
        }
        if let Some(c) = k.max_blocks_per_sm {
            cap(c as u64, "the kernel's max_blocks_per_sm");
        }
        if limit == 0 {
            return Err(DoesNotFit {
                kernel: k.name.clone(),
                device: self.name.clone(),
                reason: format!(
                    "limited by {why} (block: {} threads, {} registers/thread, {} B shared; SM: {} threads, {} registers, {} B shared)",
                    k.threads_per_block, k.regs_per_thread, k.smem_per_block,
                    self.sm.max_threads, self.sm.registers, self.sm.smem_bytes
                ),
            });
        }
        Ok(limit)
    }

    /// Each SM's share of memory bandwidth, bytes per second: the rate at
    /// which one SM saves or restores a context (Tanasic's assumption).
    pub fn per_sm_bandwidth(&self) -> f64 {
        self.mem_bandwidth / self.num_sms as f64
    }
}

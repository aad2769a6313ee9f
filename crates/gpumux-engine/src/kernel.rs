//! What the engine and devices know about a kernel and a device.

use crate::time::Nanos;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A kernel as the scheduler sees it: its name, its launch shape, and the
/// optional parts only some devices need (block timing for the simulator, a
/// suite reference for the CUDA backend).
///
/// Build one with [`KernelDesc::new`] and the `with_*` methods:
///
/// ```
/// use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
/// let k = KernelDesc::new("saxpy", KernelShape::new(4096, 256, 32))
///     .with_sim_timing(SimTiming::new(5_000).with_mem_intensity(0.8));
/// assert_eq!(k.shape.blocks, 4096);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelDesc {
    /// Shown in tables, traces and errors; not required to be unique.
    pub name: String,
    /// Grid, block and per-block resources: what every device and policy needs.
    pub shape: KernelShape,
    /// A block can be dropped mid-way and rerun from scratch (flushing).
    pub idempotent: bool,
    /// How long blocks take, for the simulator (which refuses a kernel
    /// without it) and for estimates that need a block time before a run
    /// (round-robin slice sizes, the CLI's work estimate). A real device
    /// times blocks by running them.
    pub sim_timing: Option<SimTiming>,
    /// For the CUDA backend: which suite kernel, with which size parameters.
    pub suite: Option<SuiteKernelRef>,
}

/// The launch shape of a kernel, `<<<grid, block>>>` plus what each block
/// holds on an SM while it runs: together with a device's [`SmLimits`] it
/// decides occupancy ([`DeviceInfo::blocks_per_sm`]) and the size of a
/// block's context ([`KernelShape::context_bytes`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelShape {
    /// Number of thread blocks of the linearised grid.
    pub blocks: u64,
    /// Threads of one block.
    pub threads_per_block: u32,
    /// Registers each thread holds.
    pub regs_per_thread: u32,
    /// Static plus dynamic shared memory, bytes.
    pub smem_per_block: u32,
    /// Cap on resident blocks per SM beyond the SM's resource limits (for
    /// workloads that give measured occupancy rather than per-thread resources).
    pub max_blocks_per_sm: Option<u32>,
}

/// The simulator's model of a kernel's block time (gpumux-sim `timing.rs`
/// and `memory.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimTiming {
    /// Mean block time when the kernel runs alone on the whole device.
    pub block_time_ns: Nanos,
    /// Relative spread of block time: each block takes mean × (1 ± spread), uniform.
    pub block_time_spread: f64,
    /// Memory-bound share of a block's time when only its SM's own memory
    /// ceiling limits it, in [0, 1]. The simulator (gpumux-sim `memory.rs`)
    /// stretches that share when all resident blocks together ask for more
    /// than the device's bandwidth; alone on the whole GPU the kernel uses
    /// min(1, m × κ) of the bandwidth (κ: the SMs' summed ceiling / bandwidth).
    pub mem_intensity: f64,
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
    /// A kernel of `shape`, idempotent (as workload files default to), with
    /// no simulator timing and no suite reference.
    pub fn new(name: impl Into<String>, shape: KernelShape) -> Self {
        KernelDesc { name: name.into(), shape, idempotent: true, sim_timing: None, suite: None }
    }

    /// Gives the simulator its block-time model.
    pub fn with_sim_timing(mut self, timing: SimTiming) -> Self {
        self.sim_timing = Some(timing);
        self
    }

    /// Names the suite kernel the CUDA backend runs for this description.
    pub fn with_suite(mut self, suite: SuiteKernelRef) -> Self {
        self.suite = Some(suite);
        self
    }

    /// Whether a block may be dropped and rerun (false: flushing drains it).
    pub fn with_idempotent(mut self, idempotent: bool) -> Self {
        self.idempotent = idempotent;
        self
    }
}

impl KernelShape {
    /// `blocks` blocks of `threads_per_block` threads using `regs_per_thread`
    /// registers each (a workload file's required fields), with no shared
    /// memory and no occupancy cap.
    pub fn new(blocks: u64, threads_per_block: u32, regs_per_thread: u32) -> Self {
        KernelShape { blocks, threads_per_block, regs_per_thread, smem_per_block: 0, max_blocks_per_sm: None }
    }

    /// Sets the shared memory of one block, bytes.
    pub fn with_smem_per_block(mut self, bytes: u32) -> Self {
        self.smem_per_block = bytes;
        self
    }

    /// Caps resident blocks per SM (measured occupancy).
    pub fn with_max_blocks_per_sm(mut self, cap: u32) -> Self {
        self.max_blocks_per_sm = Some(cap);
        self
    }

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

impl SimTiming {
    /// Every block takes `block_time_ns` (no spread) and is compute-bound
    /// (memory intensity 0).
    pub fn new(block_time_ns: Nanos) -> Self {
        SimTiming { block_time_ns, block_time_spread: 0.0, mem_intensity: 0.0 }
    }

    /// Block times vary uniformly within mean × (1 ± `spread`).
    pub fn with_spread(mut self, spread: f64) -> Self {
        self.block_time_spread = spread;
        self
    }

    /// Sets the memory-bound share of a block's time, in [0, 1].
    pub fn with_mem_intensity(mut self, m: f64) -> Self {
        self.mem_intensity = m;
        self
    }
}

/// Per-SM resource limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SmLimits {
    /// Resident threads.
    pub max_threads: u32,
    /// Resident blocks.
    pub max_blocks: u32,
    /// 32-bit registers.
    pub registers: u32,
    /// Shared memory, bytes.
    pub smem_bytes: u32,
}

/// What a device offers, as the engine and policies need to know it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// Its name, e.g. `H100 (simulated)`.
    pub name: String,
    /// Streaming multiprocessors.
    pub num_sms: u16,
    /// What each SM holds.
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
    /// The kernel's name.
    pub kernel: String,
    /// The device's name.
    pub device: String,
    /// Which limit, with the figures.
    pub reason: String,
}

impl DeviceInfo {
    /// Resident blocks of `k` one SM holds (occupancy), limited by threads,
    /// blocks, registers and shared memory, and by the kernel's own cap.
    pub fn blocks_per_sm(&self, k: &KernelDesc) -> Result<u32, DoesNotFit> {
        let shape = &k.shape;
        let mut limit = self.sm.max_blocks;
        let mut why = "block slots";
        let mut cap = |n: u64, what: &'static str| {
            let n = n.min(u32::MAX as u64) as u32;
            if n < limit {
                limit = n;
                why = what;
            }
        };
        if let Some(n) = self.sm.max_threads.checked_div(shape.threads_per_block) {
            cap(n as u64, "threads");
        }
        if shape.regs_per_block() > 0 {
            cap(self.sm.registers as u64 / shape.regs_per_block(), "registers");
        }
        if let Some(n) = self.sm.smem_bytes.checked_div(shape.smem_per_block) {
            cap(n as u64, "shared memory");
        }
        if let Some(c) = shape.max_blocks_per_sm {
            cap(c as u64, "the kernel's max_blocks_per_sm");
        }
        if limit == 0 {
            return Err(DoesNotFit {
                kernel: k.name.clone(),
                device: self.name.clone(),
                reason: format!(
                    "limited by {why} (block: {} threads, {} registers/thread, {} B shared; SM: {} threads, {} registers, {} B shared)",
                    shape.threads_per_block, shape.regs_per_thread, shape.smem_per_block,
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

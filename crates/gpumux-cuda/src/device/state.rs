//! What a GPU keeps across device opens: its context, the suite kernels
//! prepared on it (compiled, inputs uploaded, checked natively once) with
//! their buffers and idle workers, pooled streams and copy staging.
//!
//! Single-kernel apps (triad, transpose, spmv, sgemm, nbody, histogram, bfs)
//! are shared by every process: one set of buffers per app and size. The
//! multi-kernel apps stencil (`step`, ping-pong), reduction (`partial`,
//! `final`) and kmeans (`assign`, `update`) run as *instances*: one per
//! (process, app), with its own buffers; a process's kernels of that app run
//! on it one after the other ([`Sequence`] keeps the order and picks the
//! ping-pong side).

use super::suite_ref::AppConfig;
use crate::error::CudaError;
use crate::exec::Prepared;
use crate::preempt::WorkerLaunch;
use crate::runtime::{DeviceBuffer, DeviceSummary, Gpu, HostMapped, Stream};
use crate::suite::{self, compare, App, HostData, Sequence};
use cudarc::driver::sys as cu;
use gpumux_engine::ids::ProcessId;
use gpumux_engine::kernel::{DeviceInfo, SmLimits};
use std::collections::HashMap;

/// Bytes of each copy staging buffer (host and device); longer copies go in pieces.
pub(crate) const STAGING_BYTES: usize = 64 << 20;

/// One suite app ready to run: buffers, worker functions, what to check.
pub(crate) struct SuiteKernel {
    /// How messages and traces name it (`kmeans(65536, k=16) of process 3`).
    pub label: String,
    pub config: AppConfig,
    /// Its workload's launches are the templates (one for a single-kernel app).
    pub prepared: Prepared,
    /// Suite blocks per template.
    pub blocks: Vec<u64>,
    /// Idle workers (control records) per template, reused across launches.
    pub pools: Vec<Vec<WorkerLaunch>>,
    pub role: Role,
}

/// Whether a suite kernel is shared or one process's instance.
pub(crate) enum Role {
    /// A single-kernel app, shared by every process.
    Single {
        /// Outputs of one native launch on fresh inputs.
        native: Vec<HostData>,
        /// What the native launch was checked against on the CPU.
        cpu_check: CpuCheck,
        /// Kernel invocations that ran all their blocks in this device run.
        completed: u64,
    },
    /// One process's instance of a multi-kernel app: the kernels it ran.
    Instance { seq: Sequence },
}

/// Whether a native run was compared with the CPU reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CpuCheck {
    /// It was, and they agree.
    Matched,
    /// The reference would take too long at this size.
    Skipped,
}

impl std::fmt::Display for CpuCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CpuCheck::Matched => "native = CPU reference",
            CpuCheck::Skipped => "CPU reference skipped (too slow at this size)",
        })
    }
}

impl SuiteKernel {
    /// What a trace span of template `t` is called.
    pub fn span_label(&self, t: usize) -> String {
        match self.role {
            Role::Single { .. } => self.label.clone(),
            Role::Instance { .. } => {
                let names = self.config.app.kernel_names();
                // Stencil's two templates both run its one kernel.
                let kernel =
                    if self.config.app == App::Stencil { names[0] } else { names.get(t).copied().unwrap_or("?") };
                format!("{} {kernel}", self.label)
            }
        }
    }
}

/// Which prepared kernel serves a reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum KernelKey {
    /// A single-kernel app at a size, shared by every process.
    Shared(AppConfig),
    /// A process's instance of a multi-kernel app.
    Instance(AppConfig, ProcessId),
}

/// One GPU's state, kept across device opens (lent by the registry).
pub(crate) struct GpuState {
    pub gpu: Gpu,
    pub kernels: Vec<SuiteKernel>,
    by_key: HashMap<KernelKey, usize>,
    pub staging_host: HostMapped,
    pub staging_dev: DeviceBuffer,
    /// Idle streams by CUDA priority.
    streams: HashMap<i32, Vec<Stream>>,
}

/// Peak memory bandwidth when the driver does not say (an H100's, bytes/s).
const DEFAULT_BANDWIDTH: f64 = 3.35e12;

impl GpuState {
    /// Opens GPU `ordinal` with nothing prepared yet.
    pub fn open(ordinal: u32) -> Result<GpuState, CudaError> {
        let gpu = Gpu::open(ordinal as i32)?;
        gpu.bind()?;
        Ok(GpuState {
            staging_host: HostMapped::new(STAGING_BYTES)?,
            staging_dev: DeviceBuffer::new(STAGING_BYTES)?,
            gpu,
            kernels: Vec::new(),
            by_key: HashMap::new(),
            streams: HashMap::new(),
        })
    }

    /// What the engine needs to know about the GPU.
    pub fn info(&self) -> Result<DeviceInfo, CudaError> {
        info_of(&self.gpu.summary, self.gpu.ordinal, |a| self.gpu.attr(a))
    }

    /// Starts a new run: every kernel's inputs back to their initial state,
    /// outputs poisoned, counters and sequences forgotten.
    pub fn reset(&mut self) -> Result<(), CudaError> {
        for k in &mut self.kernels {
            k.prepared.reset()?;
            match &mut k.role {
                Role::Single { completed, .. } => *completed = 0,
                Role::Instance { seq } => seq.reset(),
            }
        }
        Ok(())
    }

    /// A stream for engine priority `priority` (higher is more urgent): CUDA
    /// priority `least - priority`, clamped to the device's range.
    pub fn stream(&mut self, priority: i32) -> Result<Stream, CudaError> {
        let (least, greatest) = self.gpu.priority_range;
        let p = least.saturating_sub(priority).clamp(greatest.min(least), greatest.max(least));
        match self.streams.get_mut(&p).and_then(Vec::pop) {
            Some(s) => Ok(s),
            None => Stream::new(&self.gpu, p),
        }
    }

    /// Returns a stream to the pool.
    pub fn give_stream(&mut self, s: Stream) {
        self.streams.entry(s.priority).or_default().push(s);
    }

    /// The single-kernel app `config`, prepared on first use (compile, inputs, native run).
    pub fn single(&mut self, config: &AppConfig, seed: u64) -> Result<usize, CudaError> {
        if let Some(&i) = self.by_key.get(&KernelKey::Shared(*config)) {
            return Ok(i);
        }
        let (app, size) = (config.app, config.size);
        let workload = suite::build_sized(app, size, 1, seed);
        let launch = workload
            .launches
            .first()
            .cloned()
            .ok_or_else(|| CudaError::Invalid(format!("suite app {} has no launch", app.name())))?;
        let prepared = Prepared::new(&self.gpu, workload)?;
        prepared.reset()?;
        let s = Stream::low(&self.gpu)?;
        prepared.enqueue_native(&s)?;
        s.sync()?;
        let native = prepared.outputs()?;
        let cpu_check = if cpu_reference_is_cheap(app, size) {
            let want = prepared.workload.reference();
            for ((got, want), o) in native.iter().zip(&want).zip(&prepared.workload.outputs) {
                compare(got, want, o.tolerance).map_err(|e| {
                    CudaError::Check(format!("native {} differs from the CPU reference: {e}", app.name()))
                })?;
            }
            CpuCheck::Matched
        } else {
            CpuCheck::Skipped
        };
        prepared.reset()?;
        self.kernels.push(SuiteKernel {
            label: format!("{}({size})", app.name()),
            config: *config,
            blocks: vec![launch.blocks()],
            prepared,
            pools: vec![Vec::new()],
            role: Role::Single { native, cpu_check, completed: 0 },
        });
        let i = self.kernels.len() - 1;
        self.by_key.insert(KernelKey::Shared(*config), i);
        Ok(i)
    }

    /// Process `process`'s instance of the multi-kernel app `config`, prepared
    /// on first use (compile, inputs); kept across device opens (reset at each).
    pub fn instance(&mut self, config: &AppConfig, process: ProcessId, seed: u64) -> Result<usize, CudaError> {
        let key = KernelKey::Instance(*config, process);
        if let Some(&i) = self.by_key.get(&key) {
            return Ok(i);
        }
        let AppConfig { app, size, k } = *config;
        let workload = suite::build_with(app, size, 1, seed, k);
        let blocks: Vec<u64> = workload.launches.iter().map(|l| l.blocks()).collect();
        if blocks.len() < app.kernel_names().len() {
            return Err(CudaError::Invalid(format!("suite app {} lacks a kernel", app.name())));
        }
        let prepared = Prepared::new(&self.gpu, workload)?;
        prepared.reset()?;
        let label = match app {
            App::Kmeans => format!("{}({size}, k={k}) of process {process}", app.name()),
            _ => format!("{}({size}) of process {process}", app.name()),
        };
        self.kernels.push(SuiteKernel {
            label,
            config: *config,
            pools: blocks.iter().map(|_| Vec::new()).collect(),
            blocks,
            prepared,
            role: Role::Instance { seq: Sequence::new(app) },
        });
        let i = self.kernels.len() - 1;
        self.by_key.insert(key, i);
        Ok(i)
    }
}

/// Whether a single kernel's CPU reference is cheap enough to run at `size`.
fn cpu_reference_is_cheap(app: App, size: u64) -> bool {
    match app {
        App::Sgemm => size <= 1024,
        App::Nbody => size <= 16384,
        _ => size <= 1 << 28,
    }
}

/// What the engine needs to know about GPU `ordinal`, described by `sum`,
/// whose attributes `attr` reads.
pub(crate) fn info_of(
    sum: &DeviceSummary,
    ordinal: i32,
    attr: impl Fn(cu::CUdevice_attribute) -> Result<i32, CudaError>,
) -> Result<DeviceInfo, CudaError> {
    use cu::CUdevice_attribute as A;
    // Peak memory bandwidth from clock and bus width (DDR: two transfers a clock).
    let bw =
        match (attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE), attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)) {
            (Ok(khz), Ok(bits)) if khz > 0 && bits > 0 => 2.0 * khz as f64 * 1e3 * bits as f64 / 8.0,
            _ => DEFAULT_BANDWIDTH,
        };
    Ok(DeviceInfo {
        name: format!("cuda:{ordinal} {}", sum.name),
        num_sms: u16::try_from(sum.sm_count)
            .ok()
            .filter(|&n| n as usize <= gpumux_engine::smset::MAX_SMS)
            .ok_or_else(|| CudaError::Invalid(format!("{} SMs: more than gpumux handles", sum.sm_count)))?,
        sm: SmLimits {
            max_threads: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32,
            max_blocks: attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)? as u32,
            registers: attr(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)? as u32,
            smem_bytes: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as u32,
        },
        mem_bandwidth: bw,
        // Not queryable: PCIe 5 x16 as measured by pinned copies, order of magnitude.
        pcie_bandwidth: 50e9,
        pcie_latency_ns: 10_000,
        mem_bytes: sum.memory_bytes,
    })
}

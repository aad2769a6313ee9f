//! Task model of GPU-SPARC (seed 004, Section IV-A).
//!
//! A task `τ_i = (T_i, D_i, M_i, {C^S_ij, C^M_ij, H_ij})` is a pipeline of subtasks, each
//! holding one kind of resource (CPU, PCI bus, GPU) for `C^S` time units in single-GPU mode
//! and `C^M` in multi-GPU mode. Tasks are kept in priority order (index 0 = highest), which
//! is what the holistic analysis walks.
//!
//! The model depends on nothing else in the crate: its file format (`toml_io.rs`, which
//! adds [`TaskSet::from_file`] and [`TaskSet::to_toml`]) and its generator
//! ([`crate::generate`]) build on it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Kind of resource a subtask holds (`H_ij`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    /// Host CPU cores: preemptive, so no blocking from lower priorities.
    Cpu,
    /// Host-device copy bus: non-preemptive.
    Pci,
    /// GPU: non-preemptive (a kernel runs to completion).
    Gpu,
}

impl Resource {
    /// All kinds, in index order.
    pub const ALL: [Resource; 3] = [Resource::Cpu, Resource::Pci, Resource::Gpu];

    /// Dense index for per-resource arrays.
    pub fn index(self) -> usize {
        match self {
            Resource::Cpu => 0,
            Resource::Pci => 1,
            Resource::Gpu => 2,
        }
    }

    /// GPU and PCI are non-preemptive in GPU-SPARC, so lower priorities can block on them.
    pub fn is_non_preemptive(self) -> bool {
        !matches!(self, Resource::Cpu)
    }

    /// Parses the TOML spelling (case-insensitive).
    pub fn parse(s: &str) -> Option<Resource> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Some(Resource::Cpu),
            "pci" | "bus" | "pcie" => Some(Resource::Pci),
            "gpu" => Some(Resource::Gpu),
            _ => None,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Resource::Cpu => "cpu",
            Resource::Pci => "pci",
            Resource::Gpu => "gpu",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// GPU execution mode `M_i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Every kernel runs on one GPU (the OpenCL/CUDA default).
    #[default]
    Single,
    /// Kernels are split over several GPUs (GPU-SPARC's dispatcher, 2 GPUs in the paper).
    Multi,
}

impl Mode {
    /// Parses `single` / `multi`.
    pub fn parse(s: &str) -> Option<Mode> {
        match s.to_ascii_lowercase().as_str() {
            "single" | "s" => Some(Mode::Single),
            "multi" | "m" => Some(Mode::Multi),
            _ => None,
        }
    }

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Single => "single",
            Mode::Multi => "multi",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One pipeline stage `τ_ij`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Subtask {
    /// `H_ij`.
    pub resource: Resource,
    /// `C^S_ij`: worst-case time holding the resource in single-GPU mode.
    pub single: f64,
    /// `C^M_ij`: worst-case time holding the resource in multi-GPU mode.
    pub multi: f64,
    /// Longest non-preemptive section, when the work is chunked (GPU-SPARC's prototype
    /// splits kernels into sub-kernels and copies into 2 MB pieces, Section V). `None`: the
    /// whole subtask is one non-preemptive section, as in the paper's analysis.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk: Option<f64>,
}

impl Subtask {
    /// `C^{M_i}_ij` for the given mode.
    #[inline]
    pub fn cost(&self, mode: Mode) -> f64 {
        match mode {
            Mode::Single => self.single,
            Mode::Multi => self.multi,
        }
    }

    /// Length of the longest non-preemptive section in `mode`: what this subtask can block
    /// a higher-priority one for (`B_ij` term).
    #[inline]
    pub fn np_len(&self, mode: Mode) -> f64 {
        let c = self.cost(mode);
        match self.chunk {
            Some(k) => k.min(c),
            None => c,
        }
    }
}

/// A periodic (sporadic) pipeline task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Task {
    /// Name used in reports.
    pub name: String,
    /// `T_i`: minimum inter-release time.
    pub period: f64,
    /// `D_i <= T_i`: end-to-end relative deadline.
    pub deadline: f64,
    /// Whether the task's kernels depend on each other's output (makes multi-GPU copies dearer).
    pub data_dependency: bool,
    /// The pipeline, in precedence order.
    pub subtasks: Vec<Subtask>,
    /// Mode declared in the file (used by `rt analyze`); assignment methods ignore it.
    pub mode: Mode,
}

impl Task {
    /// Sum of the subtasks' times in `mode` (the task's WCET when running alone).
    pub fn total(&self, mode: Mode) -> f64 {
        self.subtasks.iter().map(|s| s.cost(mode)).sum()
    }

    /// Single-mode GPU utilisation `Σ_{H_ij = GPU} C^S_ij / T_i` (the paper's `U_G` term).
    pub fn gpu_utilisation(&self) -> f64 {
        self.subtasks.iter().filter(|s| s.resource == Resource::Gpu).map(|s| s.single).sum::<f64>() / self.period
    }
}

/// Number of units of each resource (`m_H`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    /// CPU cores.
    pub cpus: u32,
    /// PCI buses (copy engines shared by all GPUs).
    pub pci: u32,
    /// GPUs.
    pub gpus: u32,
}

impl Default for Platform {
    /// The paper's simulation platform (IV-D): 4 CPUs, 1 PCI bus, 4 GPUs.
    fn default() -> Self {
        Platform { cpus: 4, pci: 1, gpus: 4 }
    }
}

impl Platform {
    /// `m_H` for a resource kind.
    #[inline]
    pub fn units(&self, r: Resource) -> u32 {
        match r {
            Resource::Cpu => self.cpus,
            Resource::Pci => self.pci,
            Resource::Gpu => self.gpus,
        }
    }

    /// Multi-GPU mode needs at least two GPUs.
    pub fn allows_multi(&self) -> bool {
        self.gpus >= 2
    }
}

/// A task set on a platform, tasks in priority order (index 0 = highest priority).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskSet {
    /// Resource units.
    pub platform: Platform,
    /// Tasks, highest priority first.
    pub tasks: Vec<Task>,
}

impl TaskSet {
    /// Builds a set with Deadline-Monotonic priorities (shorter deadline = higher priority;
    /// ties keep the given order, so the result is deterministic).
    pub fn deadline_monotonic(platform: Platform, mut tasks: Vec<Task>) -> TaskSet {
        // `sort_by` is stable: equal deadlines keep insertion order.
        tasks.sort_by(|a, b| a.deadline.total_cmp(&b.deadline));
        TaskSet { platform, tasks }
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True when there are no tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Total single-mode GPU utilisation `U_G`.
    pub fn gpu_utilisation(&self) -> f64 {
        self.tasks.iter().map(Task::gpu_utilisation).sum()
    }

    /// The modes declared in the file.
    pub fn declared_modes(&self) -> Vec<Mode> {
        self.tasks.iter().map(|t| t.mode).collect()
    }
}

//! The calibration file `gpumux calibrate` writes and `gpumux run --calibration` reads: the
//! simulator parameters fitted per kernel, the device's link and preemption figures, and what
//! was measured to get them (docs/calibration.md).

use anyhow::{anyhow, bail, Context, Result};
use gpumux_engine::device::Mechanism;
use gpumux_engine::kernel::{KernelDesc, SimTiming};
use gpumux_engine::model::{Op, Workload};
use gpumux_engine::time::Nanos;
use gpumux_sim::SimTuning;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

/// The file's format version; a reader refuses others.
pub const FORMAT: u32 = 1;

/// Largest calibration file read (a real one is a few KiB).
const MAX_BYTES: u64 = 4 << 20;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    pub format: u32,
    /// The device measured (`cuda:0`, `sim:h100`).
    pub measured_on: String,
    /// Its name as the device reports it.
    pub device_name: String,
    /// The simulator preset the kernels were fitted for (`sim:h100`).
    pub target: String,
    /// The workload whose kernels were measured.
    pub workload: String,
    pub device: DeviceCal,
    #[serde(rename = "kernel")]
    pub kernels: Vec<KernelCal>,
}

/// Device-wide parameters. Those applied to the simulator: the link, `preempt_overhead_us`,
/// `mechanism`; `launch_overhead_us` and `preempt_latency_us` are what was measured.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceCal {
    pub h2d_gb_s: f64,
    pub d2h_gb_s: f64,
    pub link_latency_us: f64,
    /// Median over kernels; the simulator has no launch latency, so it is left inside each
    /// kernel's block time (which reproduces the alone time, overhead included).
    pub launch_overhead_us: Option<f64>,
    /// Mean over kernels of the time to take every SM back (drain) a third into a run.
    pub preempt_latency_us: Option<f64>,
    /// Fixed cost per preempted SM the simulator adds: measured latency minus the
    /// simulator's own drain latency for the same retreat, mean over kernels, at least 0.
    pub preempt_overhead_us: f64,
    /// `drain` when the device realises every mechanism as a drain (a real GPU under gpumux).
    pub mechanism: Option<String>,
    /// When a launch gives its SMs back: `at-end` when its last block has ended (gpumux's CUDA
    /// backend: a worker grid's SMs are reported free once all its workers left), `at-issue`
    /// (or absent) when its last block is issued (the simulator's default, a GPU's hardware
    /// scheduler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
}

/// One kernel: the fitted simulator parameters first, then the measurements.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KernelCal {
    pub name: String,
    pub blocks: u64,
    pub threads_per_block: u32,
    pub block_time_us: f64,
    pub block_time_spread: f64,
    pub mem_intensity: f64,
    /// The workload file's block time, for comparison.
    pub given_block_time_us: Option<f64>,
    pub alone_us: f64,
    pub alone_sd_us: f64,
    pub runs: u32,
    pub small_sms: Option<u16>,
    pub small_us: Option<f64>,
    /// Per-block time on all SMs over on `small_sms` (DRAM stretch alone).
    pub stretch: Option<f64>,
    pub launch_overhead_us: Option<f64>,
    pub single_block_us: Option<f64>,
    pub preempt_latency_us: Option<f64>,
    pub notes: Vec<String>,
}

impl KernelCal {
    fn matches(&self, k: &KernelDesc) -> bool {
        self.name == k.name && self.blocks == k.shape.blocks && self.threads_per_block == k.shape.threads_per_block
    }

    fn timing(&self) -> SimTiming {
        SimTiming {
            block_time_ns: (self.block_time_us * 1000.0).round().max(1.0) as Nanos,
            block_time_spread: self.block_time_spread,
            mem_intensity: self.mem_intensity,
        }
    }
}

/// The distinct kernels of a workload, in order of first use (same name, grid and block:
/// the same kernel; the file's entries are matched the same way).
pub fn distinct_kernels(w: &Workload) -> Vec<Arc<KernelDesc>> {
    let mut out: Vec<Arc<KernelDesc>> = Vec::new();
    for p in &w.processes {
        for op in &p.ops {
            if let Op::Kernel(k) = op {
                let same = |o: &Arc<KernelDesc>| {
                    o.name == k.name
                        && o.shape.blocks == k.shape.blocks
                        && o.shape.threads_per_block == k.shape.threads_per_block
                };
                if !out.iter().any(same) {
                    out.push(Arc::clone(k));
                }
            }
        }
    }
    out
}

impl Calibration {
    pub fn load(path: &Path) -> Result<Calibration> {
        let text = gpumux_files::read::read_text(path, MAX_BYTES, "calibration file")
            .map_err(|e| anyhow!("{}: {e}", path.display()))?;
        let c: Calibration = toml::from_str(&text).map_err(|e| {
            let (line, col, msg) = gpumux_files::text::toml_error(&text, &e);
            anyhow!("{}:{line}:{col}: {msg}", path.display())
        })?;
        if c.format != FORMAT {
            bail!(
                "{}: calibration format {} (this gpumux reads {FORMAT}); run gpumux calibrate again",
                path.display(),
                c.format
            );
        }
        let bad = |what: &str, v: f64| !(v.is_finite() && v >= 0.0) || (what == "bw" && v <= 0.0);
        if bad("bw", c.device.h2d_gb_s)
            || bad("bw", c.device.d2h_gb_s)
            || bad("t", c.device.link_latency_us)
            || bad("t", c.device.preempt_overhead_us)
        {
            bail!("{}: [device]: bandwidths must be > 0 and times >= 0", path.display());
        }
        for k in &c.kernels {
            let ok = k.block_time_us.is_finite()
                && k.block_time_us > 0.0
                && k.block_time_us <= 1e9
                && (0.0..1.0).contains(&k.block_time_spread)
                && (0.0..=1.0).contains(&k.mem_intensity);
            if !ok {
                bail!(
                    "{}: kernel {}: block_time_us must be in (0, 1e9], block_time_spread in [0, 1), mem_intensity in [0, 1]",
                    path.display(),
                    gpumux_files::text::quote(&k.name)
                );
            }
        }
        c.mechanism().with_context(|| path.display().to_string())?;
        c.release_at_end().with_context(|| path.display().to_string())?;
        Ok(c)
    }

    fn release_at_end(&self) -> Result<bool> {
        match self.device.release.as_deref() {
            None | Some("at-issue") => Ok(false),
            Some("at-end") => Ok(true),
            Some(other) => bail!("[device] release {}: expected at-end or at-issue", gpumux_files::text::quote(other)),
        }
    }

    fn mechanism(&self) -> Result<Option<Mechanism>> {
        match self.device.mechanism.as_deref() {
            None => Ok(None),
            Some("drain") => Ok(Some(Mechanism::Drain)),
            Some("cs") => Ok(Some(Mechanism::ContextSwitch)),
            Some("flush") => Ok(Some(Mechanism::Flush)),
            Some(other) => {
                bail!("[device] mechanism {}: expected drain, cs or flush", gpumux_files::text::quote(other))
            }
        }
    }

    /// What the simulator takes from the device section.
    pub fn tuning(&self) -> Result<SimTuning> {
        Ok(SimTuning {
            h2d_bandwidth: Some(self.device.h2d_gb_s * 1e9),
            d2h_bandwidth: Some(self.device.d2h_gb_s * 1e9),
            link_latency_ns: Some((self.device.link_latency_us * 1000.0).round() as Nanos),
            preempt_overhead_ns: (self.device.preempt_overhead_us * 1000.0).round() as Nanos,
            mechanism: self.mechanism()?,
            release_at_end: self.release_at_end()?,
            mem_ratio: None,
        })
    }

    /// `w` with every kernel's simulator timing replaced by its entry. A kernel with no entry
    /// is an error: a prediction that mixes calibrated and estimated kernels would look
    /// calibrated and not be.
    pub fn apply(&self, w: &Workload) -> Result<Workload> {
        let mut out = w.clone();
        for p in &mut out.processes {
            for op in &mut p.ops {
                if let Op::Kernel(k) = op {
                    let Some(c) = self.kernels.iter().find(|c| c.matches(k)) else {
                        bail!(
                            "kernel {} ({} blocks of {} threads) of process {} has no entry in the calibration of {}; calibrate this workload",
                            gpumux_files::text::quote(&k.name),
                            k.shape.blocks,
                            k.shape.threads_per_block,
                            gpumux_files::text::quote(&p.name),
                            gpumux_files::text::quote(&self.workload)
                        );
                    };
                    *k = Arc::new(KernelDesc { sim_timing: Some(c.timing()), ..(**k).clone() });
                }
            }
        }
        Ok(out)
    }
}

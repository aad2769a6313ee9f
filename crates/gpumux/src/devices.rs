//! Choosing and opening the device a run uses (`--device`).

use anyhow::{bail, Context, Result};
use gpumux_engine::device::Device;
use gpumux_engine::kernel::DeviceInfo;
use gpumux_sim::{presets, SimGpu};

/// A device named on the command line.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceSpec {
    Sim(DeviceInfo),
    Cuda(u32),
}

impl DeviceSpec {
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(rest) = s.strip_prefix("cuda:") {
            let Ok(n) = rest.parse::<u32>() else { bail!("bad device `{s}`: expected cuda:<index>, e.g. cuda:0") };
            return Ok(DeviceSpec::Cuda(n));
        }
        match presets::by_name(s) {
            Some(info) => Ok(DeviceSpec::Sim(info)),
            None => bail!(
                "unknown device `{s}`; simulated: {}; real: cuda:<index>",
                presets::NAMES.iter().map(|n| format!("sim:{n}")).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// The default: the first real GPU when the CUDA driver finds one
    /// (`cuda_available` never panics, also without libcuda), else the
    /// simulated H100.
    pub fn default_device() -> Self {
        match gpumux_cuda::cuda_available() {
            Ok(_) => DeviceSpec::Cuda(0),
            Err(_) => DeviceSpec::Sim(presets::h100()),
        }
    }

    pub fn info(&self) -> Result<DeviceInfo> {
        match self {
            DeviceSpec::Sim(info) => Ok(info.clone()),
            DeviceSpec::Cuda(n) => gpumux_cuda::device_info(*n).with_context(|| cuda_unavailable(*n)),
        }
    }

    /// A fresh device for one run. Runs on one GPU are serialised: opening
    /// Rejects, before any run, what this device cannot run (a real GPU runs
    /// only suite kernels, multi-kernel apps in an order the app allows).
    pub fn check(&self, w: &gpumux_engine::model::Workload) -> Result<()> {
        match self {
            DeviceSpec::Cuda(_) => {
                gpumux_cuda::device::check_workload(w).context("the workload cannot run on a real GPU")
            }
            _ => Ok(()),
        }
    }

    /// `cuda:N` waits while another run in this process holds it.
    pub fn open(&self, seed: u64) -> Result<Box<dyn Device + Send>> {
        match self {
            DeviceSpec::Sim(info) => Ok(Box::new(SimGpu::new(info.clone(), seed))),
            DeviceSpec::Cuda(n) => gpumux_cuda::open_device(*n, seed).with_context(|| cuda_unavailable(*n)),
        }
    }
}

fn cuda_unavailable(n: u32) -> String {
    format!("device cuda:{n} cannot be opened; use --device sim:h100 to run the workload on the simulated GPU")
}

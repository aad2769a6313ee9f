//! Choosing and opening the device a run uses (`--device`).

use anyhow::{bail, Context, Result};
use gpumux_cuda::error::Chain;
use gpumux_cuda::CudaDevice;
use gpumux_engine::device::Device;
use gpumux_engine::kernel::DeviceInfo;
use gpumux_sim::{presets, SimGpu, SimTuning};

/// A device named on the command line.
#[derive(Clone, Debug, PartialEq)]
pub enum DeviceSpec {
    /// A preset, with what `gpumux calibrate` measured on another device (`--calibration`;
    /// the default tuning is the preset as it is).
    Sim(DeviceInfo, SimTuning),
    Cuda(u32),
}

impl DeviceSpec {
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(rest) = s.strip_prefix("cuda:") {
            let Ok(n) = rest.parse::<u32>() else { bail!("bad device `{s}`: expected cuda:<index>, e.g. cuda:0") };
            return Ok(DeviceSpec::Cuda(n));
        }
        match presets::by_name(s) {
            Some(info) => Ok(DeviceSpec::Sim(info, SimTuning::default())),
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
            Err(_) => DeviceSpec::Sim(presets::h100(), SimTuning::default()),
        }
    }

    /// The device a run uses when `--device` is not given: the first real GPU
    /// when there is one and it can run `w`, else the simulated H100. When a GPU
    /// is present but cannot run the workload (its kernels name no suite kernel,
    /// say), one line on stderr says why the simulator was chosen; an explicit
    /// `--device cuda:0` keeps the error instead.
    pub fn default_for(w: &gpumux_engine::model::Workload) -> Self {
        Self::fallback(Self::default_device(), w, |line| eprintln!("{line}"))
    }

    fn fallback(preferred: Self, w: &gpumux_engine::model::Workload, say: impl FnOnce(String)) -> Self {
        match preferred.check(w) {
            Ok(()) => preferred,
            Err(e) => {
                say(format!("note: running on sim:h100, not the GPU, because {e:#} (--device cuda:0 to insist)"));
                DeviceSpec::Sim(presets::h100(), SimTuning::default())
            }
        }
    }

    pub fn info(&self) -> Result<DeviceInfo> {
        match self {
            DeviceSpec::Sim(info, _) => Ok(info.clone()),
            DeviceSpec::Cuda(n) => gpumux_cuda::device_info(*n).with_context(|| cuda_unavailable(*n)),
        }
    }

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

    /// A fresh device for one run. Runs on one GPU are serialised: opening
    /// `cuda:N` waits while another run in this process holds it.
    pub fn open(&self, seed: u64) -> Result<OpenedDevice> {
        match self {
            DeviceSpec::Sim(info, tuning) => Ok(OpenedDevice::Sim(SimGpu::new(info.clone(), seed).with_tuning(tuning))),
            DeviceSpec::Cuda(n) => {
                let device = CudaDevice::open(*n, seed).with_context(|| cuda_unavailable(*n))?;
                Ok(OpenedDevice::Cuda { device, ordinal: *n, seed })
            }
        }
    }
}

/// A device opened for one run; [`OpenedDevice::finish`] ends the run.
// One value per run, never in a collection: the variants' sizes (the simulator's state against a
// CUDA device's handles) cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum OpenedDevice {
    /// The simulator.
    Sim(SimGpu),
    /// A real GPU, whose outputs are checked when the run ends.
    Cuda { device: CudaDevice, ordinal: u32, seed: u64 },
}

impl OpenedDevice {
    /// The device, for the engine's driver.
    pub fn device(&mut self) -> &mut (dyn Device + Send) {
        match self {
            OpenedDevice::Sim(d) => d,
            OpenedDevice::Cuda { device, .. } => device,
        }
    }

    /// Ends the run, after it finished or failed. A real GPU checks every
    /// kernel's outputs and hands the GPU to the next run; the outcome goes
    /// to stderr, one `gpumux-cuda verify` line per kernel, and fails nothing
    /// (scripts/cuda-device-run.sh counts the MISMATCH lines).
    pub fn finish(self) {
        let OpenedDevice::Cuda { device, ordinal, seed } = self else { return };
        match device.finish() {
            Ok(v) => {
                for check in &v.kernels {
                    eprintln!("gpumux-cuda verify cuda:{ordinal} seed {seed}: {check}");
                }
            }
            Err(e) => eprintln!("gpumux-cuda verify cuda:{ordinal}: could not read outputs back: {}", Chain(&e)),
        }
    }
}

fn cuda_unavailable(n: u32) -> String {
    format!("device cuda:{n} cannot be opened; use --device sim:h100 to run the workload on the simulated GPU")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_that_cannot_run_the_workload_falls_back_to_the_simulator_and_says_why() {
        // examples/two-procs.toml's kernels name no suite kernel: no GPU runs them.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/two-procs.toml");
        let w = gpumux_workload::resolve(path).expect("the example parses");
        let mut said = Vec::new();
        let d = DeviceSpec::fallback(DeviceSpec::Cuda(0), &w, |l| said.push(l));
        assert_eq!(d, DeviceSpec::Sim(presets::h100(), SimTuning::default()));
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("running on sim:h100") && said[0].contains("names no CUDA kernel"), "{}", said[0]);
        // The explicit device keeps the error.
        assert!(DeviceSpec::Cuda(0).check(&w).is_err());
        // A simulated preference needs no fallback and says nothing.
        let mut quiet = Vec::new();
        assert_eq!(
            DeviceSpec::fallback(DeviceSpec::Sim(presets::k20c(), SimTuning::default()), &w, |l| quiet.push(l)),
            DeviceSpec::Sim(presets::k20c(), SimTuning::default())
        );
        assert!(quiet.is_empty());
    }
}

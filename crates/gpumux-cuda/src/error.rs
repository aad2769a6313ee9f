//! Errors a person can act on.

use crate::transform::TransformError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no CUDA driver: libcuda could not be loaded ({0}); this machine has no NVIDIA GPU or driver")]
    NoDriver(String),
    #[error("no NVRTC: libnvrtc could not be loaded; install it (pip install nvidia-cuda-nvrtc==13.0.*) and put its lib folder on LD_LIBRARY_PATH (.ci/install-nvrtc.sh does both)")]
    NoNvrtc,
    #[error("the CUDA driver found no GPU ({0})")]
    NoDevice(String),
    #[error("CUDA driver call {call} failed: {code} ({msg})")]
    Driver { call: &'static str, code: i32, msg: String },
    #[error("NVRTC failed to compile `{name}`: {msg}\n{log}")]
    Compile { name: String, msg: String, log: String },
    #[error("kernel transformation: {0}")]
    Transform(#[from] TransformError),
    #[error("{0}")]
    Invalid(String),
    #[error("result check failed: {0}")]
    Check(String),
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

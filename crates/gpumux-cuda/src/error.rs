//! Errors a person can act on. Each variant that wraps a lower-level error
//! keeps it as its `source`, so `{:#}` (anyhow) or a walk of
//! [`std::error::Error::source`] shows the whole chain.

use crate::runtime::green::GreenUnsupported;
use crate::transform::TransformError;

/// A CUDA driver call that returned an error code.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("CUDA driver call {call} failed: {code} ({msg})")]
pub struct DriverError {
    /// The driver function (`cuLaunchKernel`).
    pub call: &'static str,
    /// Its `CUresult`.
    pub code: i32,
    /// The driver's text for the code.
    pub msg: String,
}

impl DriverError {
    /// The driver refused a handle of another context (a primary-context
    /// kernel launched on a green context's stream, say).
    pub fn is_foreign_handle(&self) -> bool {
        use cudarc::driver::sys::CUresult as R;
        self.code == R::CUDA_ERROR_INVALID_HANDLE as i32 || self.code == R::CUDA_ERROR_INVALID_CONTEXT as i32
    }
}

/// Everything the CUDA backend can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// libcuda could not be loaded.
    #[error("no CUDA driver: libcuda could not be loaded ({0}); this machine has no NVIDIA GPU or driver")]
    NoDriver(String),
    /// libnvrtc could not be loaded.
    #[error("no NVRTC: libnvrtc could not be loaded; install it (pip install nvidia-cuda-nvrtc==13.0.*) and put its lib folder on LD_LIBRARY_PATH (.ci/install-nvrtc.sh does both)")]
    NoNvrtc,
    /// The driver loaded but could not be initialised (no GPU, or a driver
    /// that does not match the kernel module).
    #[error("the CUDA driver found no GPU")]
    NoGpu(#[source] DriverError),
    /// The GPU asked for is not among those the driver sees.
    #[error("the CUDA driver found no GPU (asked for GPU {ordinal}, the driver sees {count})")]
    NoSuchGpu {
        /// The ordinal asked for.
        ordinal: i32,
        /// GPUs the driver sees.
        count: i32,
    },
    /// A driver call failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// A module has no kernel of that name.
    #[error("kernel `{kernel}` not in module `{module}`")]
    MissingKernel {
        /// The kernel looked for.
        kernel: String,
        /// The module it was looked for in.
        module: String,
        /// The driver's answer.
        #[source]
        source: DriverError,
    },
    /// NVRTC refused a source.
    #[error("NVRTC failed to compile `{name}`: {msg}\n{log}")]
    Compile {
        /// The source's name.
        name: String,
        /// The failed NVRTC call and its message.
        msg: String,
        /// The compiler's log.
        log: String,
    },
    /// A text handed to the driver or NVRTC holds a NUL byte.
    #[error("{what} contains a NUL byte")]
    Nul {
        /// Which text (`source of `triad``).
        what: String,
        /// Where the byte is.
        #[source]
        source: std::ffi::NulError,
    },
    /// A cache or registry whose lock a panicking thread held.
    #[error("{0} poisoned: a thread panicked while holding it")]
    Poisoned(&'static str),
    /// The kernel source cannot be made preemptible.
    #[error("kernel transformation failed")]
    Transform(#[from] TransformError),
    /// This driver has no green contexts.
    #[error(transparent)]
    GreenContexts(#[from] GreenUnsupported),
    /// A request the backend cannot serve (its text says why).
    #[error("{0}")]
    Invalid(String),
    /// Outputs or a control record are not what they must be.
    #[error("result check failed: {0}")]
    Check(String),
}

/// The backend's result type.
pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// Shows an error followed by its sources, `outer: inner: innermost` (what
/// anyhow's `{:#}` prints), for the places that print one error on its own:
/// a table cell, a skip note.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            write!(f, ": {e}")?;
            next = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_shows_every_source_once() {
        let e = CudaError::NoGpu(DriverError {
            call: "cuInit",
            code: 100,
            msg: "no CUDA-capable device is detected".into(),
        });
        assert_eq!(e.to_string(), "the CUDA driver found no GPU");
        assert_eq!(
            Chain(&e).to_string(),
            "the CUDA driver found no GPU: CUDA driver call cuInit failed: 100 (no CUDA-capable device is detected)"
        );
        let nul =
            std::ffi::CString::new("a\0b").err().map(|source| CudaError::Nul { what: "source of `k`".into(), source });
        let shown = nul.as_ref().map(|e| Chain(e).to_string()).unwrap_or_default();
        assert!(shown.starts_with("source of `k` contains a NUL byte: nul byte found"), "{shown}");
    }
}

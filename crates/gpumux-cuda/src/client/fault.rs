//! Faults that break the context: a kernel that reads or writes an illegal
//! address (or traps, or runs an illegal instruction) leaves the CUDA context
//! unusable, and every later driver call in it fails with the same "sticky"
//! error. They are told apart from ordinary failures by the driver's code.

use crate::error::{CudaError, DriverError};
use cudarc::driver::sys::CUresult as R;

/// Driver codes after which the context cannot be used again (CUDA driver
/// API, "Error Handling": "the context cannot be used, so it must be
/// destroyed (and a new one should be created)").
const STICKY: &[R] = &[
    R::CUDA_ERROR_ILLEGAL_ADDRESS,
    R::CUDA_ERROR_LAUNCH_FAILED,
    R::CUDA_ERROR_HARDWARE_STACK_ERROR,
    R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    R::CUDA_ERROR_MISALIGNED_ADDRESS,
    R::CUDA_ERROR_INVALID_ADDRESS_SPACE,
    R::CUDA_ERROR_INVALID_PC,
    R::CUDA_ERROR_ASSERT,
    R::CUDA_ERROR_LAUNCH_TIMEOUT,
    R::CUDA_ERROR_ECC_UNCORRECTABLE,
    R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
];

/// Whether driver code `code` means the context is lost.
pub fn is_sticky(code: i32) -> bool {
    STICKY.iter().any(|&r| r as i32 == code)
}

/// The context is lost: a kernel faulted. Every allocation, module, stream,
/// event and host registration of the context is gone, and every operation
/// that was on the device is lost with it; only a rebuild
/// ([`ClientDevice::rebuild`](super::ClientDevice::rebuild)) makes the device usable again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the CUDA context is lost ({call} reported {code}: {msg}); a kernel on the device faulted, and every \
     allocation, module and operation of the context is gone until the device is rebuilt"
)]
pub struct ContextLost {
    /// The driver call that saw it (not the culprit: faults are reported late).
    pub call: &'static str,
    /// Its `CUresult`.
    pub code: i32,
    /// The driver's text for the code.
    pub msg: String,
}

impl ContextLost {
    /// `Some` when `e` is a driver error that lost the context.
    pub fn of(e: &CudaError) -> Option<ContextLost> {
        let d: &DriverError = match e {
            CudaError::Driver(d) | CudaError::NoGpu(d) => d,
            CudaError::MissingKernel { source, .. } => source,
            _ => return None,
        };
        is_sticky(d.code).then(|| ContextLost { call: d.call, code: d.code, msg: d.msg.clone() })
    }

    /// The first [`ContextLost`] in `e`'s chain of sources, if any.
    pub fn find<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ContextLost> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(lost) = e.downcast_ref::<ContextLost>() {
                return Some(lost);
            }
            next = e.source();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(code: R) -> CudaError {
        CudaError::Driver(DriverError { call: "cuEventQuery", code: code as i32, msg: "x".into() })
    }

    #[test]
    fn illegal_address_loses_the_context_and_out_of_memory_does_not() {
        let lost = ContextLost::of(&driver(R::CUDA_ERROR_ILLEGAL_ADDRESS)).map(|l| l.code);
        assert_eq!(lost, Some(700));
        assert_eq!(ContextLost::of(&driver(R::CUDA_ERROR_OUT_OF_MEMORY)), None);
        assert_eq!(ContextLost::of(&driver(R::CUDA_ERROR_NOT_READY)), None);
        assert!(is_sticky(R::CUDA_ERROR_LAUNCH_FAILED as i32));
    }

    #[test]
    fn a_lost_context_is_found_through_a_device_error() {
        let lost = ContextLost { call: "cuEventQuery", code: 700, msg: "an illegal memory access".into() };
        let e = gpumux_engine::device::DeviceError::backend("polling launch 3", lost.clone());
        assert_eq!(ContextLost::find(&e), Some(&lost));
        let other = gpumux_engine::device::DeviceError::backend("x", CudaError::Invalid("no".into()));
        assert_eq!(ContextLost::find(&other), None);
        assert!(lost.to_string().contains("context is lost"), "{lost}");
    }
}

//! The CUDA context that serves client kernels: a context of its own
//! (`cuCtxCreate`), not the device's primary context.
//!
//! Why its own: a kernel that faults breaks the context it ran in for good
//! (every later call fails with the same sticky error). A created context can
//! be destroyed and created again without touching anything else in the
//! process (the suite device and other code use the primary context), and
//! destroying it is a context operation only: the GPU's settings (clocks,
//! compute mode, MIG, ECC) are never touched and the GPU is never reset.

use crate::error::Result;
use crate::runtime::{check, query_device, DeviceSummary};
use cudarc::driver::sys as cu;

/// One created CUDA context on one GPU, destroyed when dropped.
pub struct ClientContext {
    raw: cu::CUcontext,
    dev: cu::CUdevice,
    /// The GPU.
    pub summary: DeviceSummary,
    /// The driver's index of the GPU.
    pub ordinal: i32,
    /// (least, greatest) stream priority; numerically lower is more urgent.
    pub priority_range: (i32, i32),
}

// SAFETY: a context handle may be made current on any thread; the owner
// binds it before each use (`bind`).
unsafe impl Send for ClientContext {}

impl ClientContext {
    /// The driver's handle (for a thread that makes calls in this context:
    /// `runtime::launcher`).
    pub(crate) fn raw(&self) -> cu::CUcontext {
        self.raw
    }

    /// Creates a context on GPU `ordinal` and makes it current on this thread.
    /// A clear error, never a panic, without a driver or a GPU.
    pub fn create(ordinal: i32) -> Result<ClientContext> {
        let (dev, summary) = query_device(ordinal)?;
        let raw = create_raw(dev)?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: raw is current (create_raw); out-pointers to locals.
        let range =
            check("cuCtxGetStreamPriorityRange", unsafe { cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) });
        let ctx = ClientContext { raw, dev, summary, ordinal, priority_range: (least, greatest) };
        range.map(|_| ctx)
    }

    /// Makes the context current on the calling thread, if it is not yet.
    /// The device binds before every use, several times per command and
    /// poll; asking which context is current reads the thread's state, while
    /// setting it waits for the driver's lock, which the launcher thread
    /// holds through each `cuLaunchKernel` (`runtime::launcher`).
    pub fn bind(&self) -> Result<()> {
        let mut current: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut current) })?;
        if current == self.raw {
            return Ok(());
        }
        // SAFETY: raw is a live created context.
        check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.raw) })
    }

    /// Destroys the context (with every allocation, module, stream, event and
    /// host registration made in it) and creates a fresh one on the same GPU.
    /// The caller must have dropped its handles of the old context first.
    pub fn recreate(&mut self) -> Result<()> {
        // SAFETY: raw is a live created context; its handles are gone.
        unsafe {
            // A broken context still destroys cleanly; the error, if any, is the fault's.
            cu::cuCtxDestroy_v2(self.raw);
        }
        self.raw = std::ptr::null_mut();
        self.raw = create_raw(self.dev)?;
        Ok(())
    }

    /// A device attribute (`cuDeviceGetAttribute`).
    pub fn attr(&self, a: cu::CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-pointer to a local; dev is a device of the initialised driver.
        check("cuDeviceGetAttribute", unsafe { cu::cuDeviceGetAttribute(&mut v, a, self.dev) })?;
        Ok(v)
    }

    /// The `sm_XY` architecture number (90 for compute capability 9.0).
    pub fn arch(&self) -> u32 {
        self.summary.compute_capability.0 * 10 + self.summary.compute_capability.1
    }
}

/// A new context on `dev`, current on this thread.
fn create_raw(dev: cu::CUdevice) -> Result<cu::CUcontext> {
    let mut raw = std::ptr::null_mut();
    let mut params = cu::CUctxCreateParams {
        execAffinityParams: std::ptr::null_mut(),
        numExecAffinityParams: 0,
        cigParams: std::ptr::null_mut(),
    };
    // SAFETY: out-pointer to a local; no affinity or CIG parameters. The new
    // context is pushed (made current) by the call.
    check("cuCtxCreate", unsafe {
        cu::cuCtxCreate_v4(&mut raw, &mut params, cu::CUctx_flags::CU_CTX_SCHED_SPIN as u32, dev)
    })?;
    check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(raw) })?;
    Ok(raw)
}

impl Drop for ClientContext {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: a live created context; its owner dropped its handles first.
            unsafe {
                cu::cuCtxDestroy_v2(self.raw);
            }
        }
    }
}

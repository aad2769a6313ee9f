//! Clients' device memory and the host memory their copies go through.

use super::device::ClientDevice;
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;

/// Why a memory request failed.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The device has not that much free.
    #[error("the device has no {bytes} bytes free ({free} of {total} free)")]
    OutOfMemory {
        /// Asked for.
        bytes: u64,
        /// Free now.
        free: u64,
        /// In all.
        total: u64,
    },
    /// An address this device did not allocate (or allocated in a context since lost).
    #[error("{0:#x} is not an allocation of this device")]
    NotAllocated(u64),
    /// Anything else the driver says.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// Pins `bytes` bytes at `ptr` for DMA in the current context.
pub(super) fn register(ptr: *mut u8, bytes: usize) -> Result<(), CudaError> {
    // SAFETY: the caller keeps the range mapped while registered (ClientDevice::register_host).
    check("cuMemHostRegister", unsafe { cu::cuMemHostRegister_v2(ptr.cast(), bytes, 0) })
}

/// Undoes [`register`]; errors (a context already lost) have no one to go to.
pub(super) fn unregister(ptr: *mut u8) {
    // SAFETY: registered by `register`.
    unsafe {
        cu::cuMemHostUnregister(ptr.cast());
    }
}

impl ClientDevice {
    /// (free, total) device memory, bytes (`cuMemGetInfo`).
    pub fn mem_info(&mut self) -> Result<(u64, u64), CudaError> {
        self.state()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: out-pointers to locals; the context is current.
        check("cuMemGetInfo", unsafe { cu::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok((free as u64, total as u64))
    }

    /// Allocates `bytes` (> 0) of device memory.
    /// A buffer of at least the mapping granularity is address-stable and
    /// can be evicted (`swap`'s module doc); a smaller one is a `cuMemAlloc`.
    pub fn alloc(&mut self, bytes: u64) -> Result<u64, MemoryError> {
        let n = usize::try_from(bytes.max(1)).map_err(|_| CudaError::Invalid(format!("{bytes} bytes")))?;
        let mut ptr = 0;
        if let Some(g) = self.state()?.granularity.filter(|&g| n >= g) {
            return self.alloc_mapped(bytes, g);
        }
        // SAFETY: out-pointer to a local; the context is current.
        let r = unsafe { cu::cuMemAlloc_v2(&mut ptr, n) };
        if r == cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let (free, total) = self.mem_info()?;
            return Err(MemoryError::OutOfMemory { bytes, free, total });
        }
        check("cuMemAlloc", r)?;
        self.state()?.allocations.insert(ptr, bytes);
        Ok(ptr)
    }

    /// Frees an allocation of [`ClientDevice::alloc`] or
    /// [`ClientDevice::reserve_evicted`], resident or evicted.
    pub fn free(&mut self, ptr: u64) -> Result<(), MemoryError> {
        if self.free_mapped(ptr)? {
            return Ok(());
        }
        let st = self.state()?;
        if st.allocations.remove(&ptr).is_none() {
            return Err(MemoryError::NotAllocated(ptr));
        }
        // SAFETY: allocated by cuMemAlloc in this context and no longer used (the caller's rule).
        check("cuMemFree", unsafe { cu::cuMemFree_v2(ptr) })?;
        Ok(())
    }

    /// Bytes allocated now.
    pub fn allocated(&self) -> u64 {
        self.st.as_ref().map_or(0, |st| st.allocations.values().sum()) + self.mapped_bytes()
    }

    /// Pins host memory so that copies to and from it are single DMA
    /// transfers; it stays registered across rebuilds.
    ///
    /// # Safety
    /// `bytes` bytes at `ptr` must stay mapped until [`ClientDevice::unregister_host`]
    /// (or the device is dropped).
    pub unsafe fn register_host(&mut self, ptr: *mut u8, bytes: usize) -> Result<(), CudaError> {
        self.state()?;
        register(ptr, bytes)?;
        self.host.push((ptr as usize, bytes));
        Ok(())
    }

    /// What pins host memory for this context on another thread
    /// ([`Pinner::pin`]): a large region takes long to pin (1 GiB: 716 ms on
    /// the H100 machine), which the daemon does off the thread that serves
    /// its clients; [`ClientDevice::adopt_pinned`] then records it here.
    pub fn pinner(&self) -> Pinner {
        Pinner { ctx: self.ctx.raw() }
    }

    /// Records memory [`Pinner::pin`] registered in this context, as
    /// [`ClientDevice::register_host`] would have: unregistered by
    /// [`ClientDevice::unregister_host`], registered again by a rebuild.
    ///
    /// # Safety
    /// As for [`ClientDevice::register_host`]; `ptr` was pinned by this
    /// device's [`Pinner`] since its last rebuild, or is pinned again by the
    /// next rebuild.
    pub unsafe fn adopt_pinned(&mut self, ptr: *mut u8, bytes: usize) {
        self.host.push((ptr as usize, bytes));
    }

    /// Undoes [`ClientDevice::register_host`] (no bound operation may use the memory).
    pub fn unregister_host(&mut self, ptr: *mut u8) {
        let Some(i) = self.host.iter().position(|&(p, _)| p == ptr as usize) else { return };
        self.host.swap_remove(i);
        if self.ctx.bind().is_ok() {
            unregister(ptr);
        }
    }
}

/// Pins host memory in a [`ClientDevice`]'s context from any thread
/// ([`ClientDevice::pinner`]).
#[derive(Clone, Copy, Debug)]
pub struct Pinner {
    ctx: cu::CUcontext,
}

// SAFETY: a context handle may be made current on any thread; the device
// waits for pins under way before it destroys the context (its owner's rule).
unsafe impl Send for Pinner {}

impl Pinner {
    /// `cuMemHostRegister` of `bytes` at `ptr`, with the context made current
    /// on this thread first.
    ///
    /// # Safety
    /// As for [`ClientDevice::register_host`], and the context is alive: no
    /// rebuild or drop of its device runs until this returns.
    pub unsafe fn pin(&self, ptr: *mut u8, bytes: usize) -> Result<(), CudaError> {
        crate::client::forget_current();
        // SAFETY: the caller keeps the context alive.
        check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })?;
        register(ptr, bytes)
    }
}

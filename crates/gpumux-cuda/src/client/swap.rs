//! Address-stable device buffers that can be evicted to host memory and
//! restored at the same address (issue 39; the daemon's docs, "Memory
//! oversubscription").
//!
//! A buffer of at least the mapping granularity (2 MiB on Hopper) is a
//! reserved virtual range with physical memory mapped into it
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`)
//! instead of a `cuMemAlloc`. **Evicting** it copies its bytes to host
//! memory, unmaps the range and releases the physical memory; the range
//! stays reserved, so the address stays the client's and nothing else can
//! be placed there. **Restoring** creates physical memory again, maps it at
//! the same address, sets access and copies the bytes back: a pointer
//! stored inside any buffer is still right. Smaller buffers stay
//! `cuMemAlloc` allocations (a mapping would round each up to 2 MiB, and
//! evicting one frees little): they are never evicted.
//!
//! The copies run on a non-blocking stream of their own (so they wait for
//! no other client's work; other clients' kernels run meanwhile) and the
//! call returns when they are done. Host copies are ordinary memory, copied
//! through a small pinned ring (`staging`: pinning each copy cost 0.4 s per
//! GB on the H200 machine, about 20 times its copy), owned by the device rather
//! than its context: after a lost context, an evicted buffer keeps its bytes
//! and gets its range back ([`ClientDevice::readdress_evicted`]).

use super::device::ClientDevice;
use super::memory::MemoryError;
use super::staging::Staging;
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;
use std::time::Instant;

/// A mapped (resident) or reserved-only (evicted) range, in the context.
#[derive(Debug)]
pub(crate) struct Mapping {
    /// The range's size: the buffer's bytes rounded up to the granularity.
    pub size: usize,
    /// The buffer's own size.
    pub bytes: u64,
    /// Its physical memory while resident.
    pub handle: Option<cu::CUmemGenericAllocationHandle>,
}

/// An evicted buffer's bytes in ordinary host memory (owned by the device,
/// so that they outlive a lost context; copied through the pinned ring of
/// `staging`); or, for a buffer born evicted, nothing: it is all zeros,
/// which the restore writes on the device.
pub(crate) struct HostCopy {
    /// Empty for a buffer of zeros.
    bytes: Box<[u8]>,
    /// The range's size.
    len: usize,
    /// The buffer's own size.
    buffer: u64,
}

impl HostCopy {
    /// `len` bytes of host memory.
    fn new(len: usize, buffer: u64) -> Result<HostCopy, CudaError> {
        Ok(HostCopy { bytes: zeroed(len)?, len, buffer })
    }

    /// A buffer of zeros: no host memory at all.
    fn zeros(len: usize, buffer: u64) -> HostCopy {
        HostCopy { bytes: Box::default(), len, buffer }
    }

    fn is_zeros(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl std::fmt::Debug for HostCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostCopy({} bytes, zeros: {})", self.len, self.is_zeros())
    }
}

/// `len` zeroed bytes from the system, or an error naming them (not an
/// abort, as `vec!` would on a host out of memory); untouched pages cost
/// nothing until written.
fn zeroed(len: usize) -> Result<Box<[u8]>, CudaError> {
    let no_memory = || CudaError::Invalid(format!("no host memory for an evicted buffer of {len} bytes"));
    if len == 0 {
        return Ok(Box::default());
    }
    let layout = std::alloc::Layout::array::<u8>(len).map_err(|_| no_memory())?;
    // SAFETY: a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(no_memory());
    }
    // SAFETY: `len` bytes just allocated with the layout `Box<[u8]>` frees with.
    Ok(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) })
}

/// What one allocation takes: its properties for `cuMemCreate` on `ordinal`.
fn prop(ordinal: i32) -> cu::CUmemAllocationProp {
    // SAFETY: a plain C struct; all-zero is its "nothing asked" value.
    let mut p: cu::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = cu::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type_ = cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = ordinal;
    p
}

/// The mapping granularity of GPU `ordinal`, if it supports virtual memory
/// management (every GPU since Pascal does).
pub(crate) fn granularity(ordinal: i32) -> Option<usize> {
    let p = prop(ordinal);
    let mut g = 0usize;
    let flag = cu::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: out-pointer to a local, a valid prop; the context is current.
    let r = unsafe { cu::cuMemGetAllocationGranularity(&mut g, &p, flag) };
    (r == cu::CUresult::CUDA_SUCCESS && g > 0).then_some(g)
}

/// Physical memory of `size` bytes on `ordinal`; `None`: out of memory.
fn create(ordinal: i32, size: usize) -> Result<Option<cu::CUmemGenericAllocationHandle>, CudaError> {
    let mut h = 0;
    let p = prop(ordinal);
    // SAFETY: out-pointer to a local, a valid prop.
    let r = unsafe { cu::cuMemCreate(&mut h, size, &p, 0) };
    if r == cu::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Ok(None);
    }
    check("cuMemCreate", r)?;
    Ok(Some(h))
}

/// Maps `h` at `ptr` (a reserved range of `size`) and lets the device read
/// and write it; on an error the handle is released and nothing is mapped.
fn map(ordinal: i32, ptr: u64, size: usize, h: cu::CUmemGenericAllocationHandle) -> Result<(), CudaError> {
    // SAFETY: `ptr` is a reserved, unmapped range of `size`; `h` a handle of `size`.
    let mapped = check("cuMemMap", unsafe { cu::cuMemMap(ptr, size, 0, h, 0) });
    if let Err(e) = mapped {
        // SAFETY: `h` is ours and mapped nowhere.
        unsafe { cu::cuMemRelease(h) };
        return Err(e);
    }
    let access = cu::CUmemAccessDesc {
        location: prop(ordinal).location,
        flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range was just mapped.
    let set = check("cuMemSetAccess", unsafe { cu::cuMemSetAccess(ptr, size, &access, 1) });
    if let Err(e) = set {
        // SAFETY: undoing the map above.
        unsafe {
            cu::cuMemUnmap(ptr, size);
            cu::cuMemRelease(h);
        }
        return Err(e);
    }
    Ok(())
}

/// A fresh reserved range of `size` bytes, at `hint` if the driver can.
fn reserve(size: usize, granularity: usize, hint: u64) -> Result<u64, CudaError> {
    let mut ptr = 0;
    // SAFETY: out-pointer to a local.
    check("cuMemAddressReserve", unsafe { cu::cuMemAddressReserve(&mut ptr, size, granularity, hint, 0) })?;
    Ok(ptr)
}

/// The swap stream of the current context (made on first use): non-blocking,
/// so that its copies wait for no other stream's work.
fn stream(slot: &mut Option<usize>) -> Result<cu::CUstream, CudaError> {
    if let Some(s) = *slot {
        return Ok(s as cu::CUstream);
    }
    let mut s: cu::CUstream = std::ptr::null_mut();
    let flags = cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: out-pointer to a local; the context is current.
    check("cuStreamCreate", unsafe { cu::cuStreamCreate(&mut s, flags) })?;
    *slot = Some(s as usize);
    Ok(s)
}

impl ClientDevice {
    /// The smallest buffer that is a mapping (and can be evicted), bytes;
    /// `None`: this GPU cannot map, every buffer is a `cuMemAlloc`.
    pub fn swap_granularity(&self) -> Option<u64> {
        self.st.as_ref()?.granularity.map(|g| g as u64)
    }

    /// A mapped allocation of `bytes` (≥ the granularity; module doc).
    pub(super) fn alloc_mapped(&mut self, bytes: u64, granularity: usize) -> Result<u64, MemoryError> {
        let size = round_up(bytes, granularity)?;
        let ordinal = self.ctx.ordinal;
        self.state()?;
        let ptr = reserve(size, granularity, 0)?;
        let h = match create(ordinal, size) {
            Ok(Some(h)) => h,
            other => {
                // SAFETY: reserved above, mapped nowhere.
                unsafe { cu::cuMemAddressFree(ptr, size) };
                let (free, total) = self.mem_info()?;
                return match other {
                    Err(e) => Err(e.into()),
                    _ => Err(MemoryError::OutOfMemory { bytes, free, total }),
                };
            }
        };
        if let Err(e) = map(ordinal, ptr, size, h) {
            // SAFETY: as above.
            unsafe { cu::cuMemAddressFree(ptr, size) };
            return Err(e.into());
        }
        self.state()?.mappings.insert(ptr, Mapping { size, bytes, handle: Some(h) });
        Ok(ptr)
    }

    /// Frees a mapped allocation, resident or evicted; `false`: not one.
    pub(super) fn free_mapped(&mut self, ptr: u64) -> Result<bool, MemoryError> {
        let host = self.swapped.remove(&ptr);
        if self.swapped.is_empty() {
            // Nothing evicted: no exchange to keep a pinned copy for.
            self.spare_copy = None;
        }
        let st = self.state()?;
        let Some(m) = st.mappings.remove(&ptr) else { return Ok(host.is_some()) };
        if let Some(h) = m.handle {
            // SAFETY: mapped by `map`; no bound operation uses it (the caller's rule).
            check("cuMemUnmap", unsafe { cu::cuMemUnmap(ptr, m.size) })?;
            // SAFETY: unmapped above.
            check("cuMemRelease", unsafe { cu::cuMemRelease(h) })?;
        }
        // SAFETY: reserved by `reserve`, mapped nowhere now.
        check("cuMemAddressFree", unsafe { cu::cuMemAddressFree(ptr, m.size) })?;
        Ok(true)
    }

    /// A reserved range for a buffer of `bytes` born evicted (zeroed host copy).
    pub fn reserve_evicted(&mut self, bytes: u64) -> Result<u64, MemoryError> {
        let g = self.swap_granularity().ok_or_else(|| CudaError::Invalid("this GPU cannot map memory".into()))?;
        let size = round_up(bytes, g as usize)?;
        let ptr = reserve(size, g as usize, 0)?;
        self.state()?.mappings.insert(ptr, Mapping { size, bytes, handle: None });
        self.swapped.insert(ptr, HostCopy::zeros(size, bytes));
        Ok(ptr)
    }

    /// Evicts the mapped buffer at `ptr` (module doc). Its work must be done.
    pub fn evict(&mut self, ptr: u64) -> Result<(), MemoryError> {
        let (size, bytes, h) = match self.state()?.mappings.get(&ptr) {
            Some(Mapping { size, bytes, handle: Some(h) }) => (*size, *bytes, *h),
            _ => return Err(MemoryError::NotAllocated(ptr)),
        };
        let t = Instant::now();
        // The last restore's host copy, if it fits: its pages are in place
        // (a fresh one faults each page in as the copy writes it).
        let mut host = match self.spare_copy.take() {
            Some(mut c) if c.len >= size && c.len <= size.saturating_mul(2) => {
                c.buffer = bytes;
                c
            }
            _ => HostCopy::new(size, bytes)?,
        };
        let pinned = t.elapsed();
        let st = self.state()?;
        let s = stream(&mut st.swap_stream)?;
        if st.staging.is_none() {
            st.staging = Some(Staging::new()?);
        }
        if let Some(staging) = &st.staging {
            staging.to_host(s, ptr, &mut host.bytes[..size])?;
        }
        let copied = t.elapsed() - pinned;
        // SAFETY: mapped by `map`, its copy done.
        check("cuMemUnmap", unsafe { cu::cuMemUnmap(ptr, size) })?;
        // SAFETY: unmapped above.
        check("cuMemRelease", unsafe { cu::cuMemRelease(h) })?;
        if let Some(m) = st.mappings.get_mut(&ptr) {
            m.handle = None;
        }
        self.swapped.insert(ptr, host);
        tracing::info!(
            "evicted {size} bytes at {ptr:#x}: host memory in {:.1} ms, copied in {:.1} ms ({:.1} GB/s)",
            pinned.as_secs_f64() * 1e3,
            copied.as_secs_f64() * 1e3,
            size as f64 / copied.as_secs_f64().max(1e-9) / 1e9
        );
        Ok(())
    }

    /// Restores the evicted buffer at `ptr` at the same address (module
    /// doc). Out of memory: nothing changed.
    pub fn restore(&mut self, ptr: u64) -> Result<(), MemoryError> {
        let ordinal = self.ctx.ordinal;
        let (size, bytes) = match self.state()?.mappings.get(&ptr) {
            Some(Mapping { size, bytes, handle: None }) => (*size, *bytes),
            _ => return Err(MemoryError::NotAllocated(ptr)),
        };
        if !self.swapped.contains_key(&ptr) {
            return Err(MemoryError::NotAllocated(ptr));
        }
        let t = Instant::now();
        let Some(h) = create(ordinal, size)? else {
            let (free, total) = self.mem_info()?;
            return Err(MemoryError::OutOfMemory { bytes, free, total });
        };
        map(ordinal, ptr, size, h)?;
        let mapped = t.elapsed();
        let st = self.state()?;
        if let Some(m) = st.mappings.get_mut(&ptr) {
            m.handle = Some(h);
        }
        let s = stream(&mut st.swap_stream)?;
        if st.staging.is_none() {
            st.staging = Some(Staging::new()?);
        }
        let Some(host) = self.swapped.get(&ptr) else { return Err(MemoryError::NotAllocated(ptr)) };
        let Some(staging) = self.st.as_ref().and_then(|st| st.staging.as_ref()) else {
            return Err(MemoryError::NotAllocated(ptr));
        };
        if host.is_zeros() {
            // SAFETY: `size` bytes at `ptr` were just mapped.
            check("cuMemsetD8Async", unsafe { cu::cuMemsetD8Async(ptr, 0, size, s) })?;
            // SAFETY: a stream of this context.
            check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) })?;
        } else {
            staging.to_device(s, &host.bytes[..size], ptr)?;
        }
        let copied = t.elapsed() - mapped;
        // Kept for the next eviction while others are evicted (an exchange
        // will follow): its pages are in place.
        let copy = self.swapped.remove(&ptr);
        self.spare_copy = copy.filter(|c| !c.is_zeros() && !self.swapped.is_empty());
        // The script's parser reads the last "in": the copy's time.
        tracing::info!(
            "restored {size} bytes at {ptr:#x} (memory created and mapped in {:.1} ms) in {:.1} ms ({:.1} GB/s)",
            mapped.as_secs_f64() * 1e3,
            copied.as_secs_f64() * 1e3,
            size as f64 / copied.as_secs_f64().max(1e-9) / 1e9
        );
        Ok(())
    }

    /// After a rebuild: the evicted buffer that was at `old` gets a range in
    /// the new context (at `old` where the driver can) and its host copy is
    /// pinned there; returns its address.
    pub fn readdress_evicted(&mut self, old: u64) -> Result<u64, MemoryError> {
        let g = self.swap_granularity().ok_or_else(|| CudaError::Invalid("this GPU cannot map memory".into()))?;
        let Some(host) = self.swapped.remove(&old) else { return Err(MemoryError::NotAllocated(old)) };
        let size = host.len;
        let ptr = reserve(size, g as usize, old)?;
        let bytes = host.buffer;
        self.state()?.mappings.insert(ptr, Mapping { size, bytes, handle: None });
        self.swapped.insert(ptr, host);
        Ok(ptr)
    }

    /// Bytes of mapped buffers, resident ones.
    pub(super) fn mapped_bytes(&self) -> u64 {
        self.st.as_ref().map_or(0, |st| st.mappings.values().filter(|m| m.handle.is_some()).map(|m| m.bytes).sum())
    }
}

fn round_up(bytes: u64, granularity: usize) -> Result<usize, CudaError> {
    let n = usize::try_from(bytes).map_err(|_| CudaError::Invalid(format!("{bytes} bytes")))?;
    n.checked_next_multiple_of(granularity).ok_or_else(|| CudaError::Invalid(format!("{bytes} bytes")))
}

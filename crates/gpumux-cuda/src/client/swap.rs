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
//! The moves run on a thread of their own ([`super::mover`]), on a
//! non-blocking stream of its own (so they wait for no other client's work;
//! other clients' kernels run, and are launched, meanwhile):
//! [`ClientDevice::start_move`] starts one, [`ClientDevice::take_moved`]
//! reports its end. A buffer under way is not touched by this thread until
//! then; freeing it waits for its move. Host copies are host memory that is
//! fast to write ([`super::host_copy`]): chunks of the mover's pinned host
//! pool ([`super::pinned_pool`]) laid end to end, pinned ahead of need
//! (the pool grows to a level this device sets once oversubscription is
//! possible, [`ClientDevice::update_ahead`]) and DMAed straight, or
//! ordinary memory copied through a small pinned ring (`staging`). They
//! are owned by the device rather than its context: after a lost context,
//! an evicted buffer keeps its bytes (its pins go with the context) and gets
//! its range back ([`ClientDevice::readdress_evicted`]).

use super::device::ClientDevice;
use super::host_copy::HostMem;
use super::memory::MemoryError;
use super::mover::{Done, Ended, Job, Mover, Msg};
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;
use std::time::{Duration, Instant};

/// The token of a move made in the call ([`ClientDevice::evict`],
/// [`ClientDevice::restore`]); the daemon's tokens count up from 0.
const IN_CALL: u64 = u64::MAX;

/// A mapped (resident) or reserved-only (evicted) range, in the context.
#[derive(Debug)]
pub(crate) struct Mapping {
    /// The range's size: the buffer's bytes rounded up to the granularity.
    pub size: usize,
    /// The buffer's own size.
    pub bytes: u64,
    /// Its physical memory while resident.
    pub handle: Option<cu::CUmemGenericAllocationHandle>,
    /// A move of it is under way on the mover ([`super::mover`]).
    pub moving: bool,
}

/// An evicted buffer's bytes in host memory ([`super::host_copy`]; owned
/// by the device, so that they outlive a lost context): chunks of the
/// mover's pinned pool ([`super::pinned_pool`]) laid end to end, or one
/// mapping copied through its pinned ring (or both: the pool's chunks first,
/// when its cap had room for part of the copy only); or, for a buffer born
/// evicted, nothing: it is all zeros, which the restore writes on the device.
pub(crate) struct HostCopy {
    /// Its pieces, laid end to end from the buffer's first byte; none for a
    /// buffer of zeros.
    mem: Vec<HostMem>,
    /// The range's size.
    len: usize,
    /// The buffer's own size.
    buffer: u64,
}

impl HostCopy {
    /// `len` bytes of host memory, one mapping.
    pub(super) fn new(len: usize, buffer: u64) -> Result<HostCopy, CudaError> {
        Ok(HostCopy { mem: vec![HostMem::new(len)?], len, buffer })
    }

    /// A copy for a range of `size` in `pieces` laid end to end (chunks of
    /// the pinned pool, and what the ring carries); they hold `size` bytes
    /// at least.
    pub(super) fn from_pieces(mem: Vec<HostMem>, size: usize, buffer: u64) -> HostCopy {
        HostCopy { mem, len: size, buffer }
    }

    /// Its pieces of the pinned pool's (to go back there), the others
    /// dropped; else, when it holds none, the copy as it was.
    pub(super) fn into_pooled(self) -> Result<Vec<HostMem>, HostCopy> {
        if self.is_pooled() {
            Ok(self.mem.into_iter().filter(HostMem::is_pooled).collect())
        } else {
            Err(self)
        }
    }

    /// Its pieces, laid end to end.
    pub(super) fn pieces_mut(&mut self) -> &mut [HostMem] {
        &mut self.mem
    }

    /// Holds memory of the pinned pool.
    pub(super) fn is_pooled(&self) -> bool {
        self.mem.iter().any(HostMem::is_pooled)
    }

    /// Its pins went with their context (`HostMem::forget_pins`).
    pub(super) fn forget_pins(&mut self) {
        for m in &mut self.mem {
            m.forget_pins();
        }
    }

    /// The size of the buffer it holds.
    pub(super) fn buffer(&self) -> u64 {
        self.buffer
    }

    /// Host memory of one mapping, not the pool's, that can take an
    /// eviction of a range of `size` bytes without wasting more than as
    /// much again (a spare copy; the pool's chunks go back to the pool).
    pub(super) fn fits(&self, size: usize) -> bool {
        self.mem.len() == 1 && !self.is_pooled() && super::pinned_pool::fits(self.held(), size)
    }

    /// Its host memory's bytes (0 for zeros).
    pub(super) fn held(&self) -> usize {
        self.mem.iter().map(HostMem::len).sum()
    }

    /// Now the copy of a buffer of `bytes`.
    pub(super) fn set_buffer(&mut self, bytes: u64) {
        self.buffer = bytes;
    }

    /// A buffer of zeros: no host memory at all.
    pub(super) fn zeros(len: usize, buffer: u64) -> HostCopy {
        HostCopy { mem: Vec::new(), len, buffer }
    }

    pub(crate) fn is_zeros(&self) -> bool {
        self.mem.is_empty()
    }

    /// Written whole by an eviction.
    pub(crate) fn mark_written(&mut self) {
        for m in &mut self.mem {
            m.mark_written();
        }
    }
}

impl std::fmt::Debug for HostCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostCopy({} bytes in {} pieces, zeros: {})", self.len, self.mem.len(), self.is_zeros())
    }
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

/// Whether buffers may be oversubscribed (`on`, the default, or `off`), in
/// gpumuxd's environment; its device processes inherit it (`gpumuxd
/// --oversubscribe`). Off, every buffer is a plain `cuMemAlloc`, as before
/// issue 39: nothing is mapped, so nothing can be evicted, and no pinned host
/// pool is grown (docs/oversubscription.md, "Turning it off").
pub const OVERSUBSCRIBE_VAR: &str = "GPUMUX_OVERSUBSCRIBE";

/// Whether [`OVERSUBSCRIBE_VAR`] turns oversubscription off (`off`, `0`,
/// `false`, `no`); anything else, or nothing, leaves it on. gpumuxd checks
/// the value and sets it to `on` or `off` before its devices open.
pub fn oversubscribe_off(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "off" | "0" | "false" | "no"))
}

/// The granularity of address-stable buffers on GPU `ordinal`
/// ([`granularity`]); `None` where oversubscription is off
/// ([`OVERSUBSCRIBE_VAR`]): every buffer is then a `cuMemAlloc`.
pub(crate) fn stable_granularity(ordinal: i32) -> Option<usize> {
    if oversubscribe_off(std::env::var(OVERSUBSCRIBE_VAR).ok().as_deref()) {
        tracing::info!(
            "CUDA device {ordinal}: oversubscription off ({OVERSUBSCRIBE_VAR}): every buffer is a cuMemAlloc"
        );
        return None;
    }
    granularity(ordinal)
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
pub(super) fn create(ordinal: i32, size: usize) -> Result<Option<cu::CUmemGenericAllocationHandle>, CudaError> {
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
pub(super) fn map(ordinal: i32, ptr: u64, size: usize, h: cu::CUmemGenericAllocationHandle) -> Result<(), CudaError> {
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
        self.state()?.mappings.insert(ptr, Mapping { size, bytes, handle: Some(h), moving: false });
        self.update_ahead();
        Ok(ptr)
    }

    /// Frees a mapped allocation, resident or evicted; `false`: not one.
    pub(super) fn free_mapped(&mut self, ptr: u64) -> Result<bool, MemoryError> {
        let freed = self.free_mapped_now(ptr);
        // Its bytes are no longer the pinned pool's to hold ahead.
        self.update_ahead();
        freed
    }

    fn free_mapped_now(&mut self, ptr: u64) -> Result<bool, MemoryError> {
        if self.st.as_ref().and_then(|st| st.mappings.get(&ptr)).is_some_and(|m| m.moving) {
            // Its move holds its memory: the end is kept for `take_moved`.
            self.collect_moves(true);
        }
        let mut host = self.swapped.remove(&ptr);
        if host.as_ref().is_some_and(HostCopy::is_zeros) {
            self.trim_prepared();
        }
        let freed = host.is_some();
        if let Some(Ok(m)) = host.take().map(HostCopy::into_pooled) {
            // Chunks of the pinned pool go back to it, pinned, for the next eviction.
            self.recycle(m);
        }
        if self.swapped.is_empty() {
            // Nothing evicted: no exchange to keep a pinned copy for.
            self.spare_copy = None;
        }
        let st = self.state()?;
        let Some(m) = st.mappings.remove(&ptr) else { return Ok(freed) };
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
        self.state()?.mappings.insert(ptr, Mapping { size, bytes, handle: None, moving: false });
        self.swapped.insert(ptr, HostCopy::zeros(size, bytes));
        // Its room will be made by an eviction of about its size: the mover
        // faults that eviction's host memory in now, while it is idle
        // (`Msg::Prepare`; best effort: without it the eviction faults its own).
        let _ = self.mover().map(|m| m.send_quiet(Msg::Prepare { len: size }));
        self.update_ahead();
        Ok(ptr)
    }

    /// Sets the pinned pool's level ([`super::pinned_pool`]) when it changes
    /// by a chunk or more: [`super::pinned_pool::AHEAD_VAR`] from the start
    /// (0 unless set), and once oversubscription is possible (a buffer is
    /// evicted or born evicted, or the address-stable buffers take three
    /// quarters of the device's memory, as much as the daemon hands out:
    /// [`super::pinned_pool::DEVICE_MEMORY_VAR`]) the bytes of those buffers,
    /// which are what evictions may ever need, if more. The pool grows to it
    /// while the mover has nothing to move, so that the first eviction finds
    /// its chunks pinned (a cold start's evictions went into fresh memory,
    /// pinned at 6 GB/s). Best effort: a mover that cannot start is left alone.
    pub(super) fn update_ahead(&mut self) {
        // No address-stable buffers (oversubscription off, or a GPU that
        // cannot map): nothing can be evicted, so nothing is pinned ahead.
        let Some(st) = self.st.as_ref().filter(|st| st.granularity.is_some()) else { return };
        let mapped: usize = st.mappings.values().map(|m| m.size).sum();
        let device = super::pinned_pool::device_memory_from_env().unwrap_or_else(|| {
            usize::try_from(gpumux_engine::device::Device::info(self).mem_bytes).unwrap_or(usize::MAX)
        });
        let possible = !self.swapped.is_empty() || mapped.saturating_mul(4) >= device.saturating_mul(3);
        let floor = st.mover.as_ref().map_or_else(super::pinned_pool::ahead_from_env, |m| m.ahead_floor);
        let level = if possible { mapped.max(floor) } else { floor };
        let started = st.mover.is_some();
        if level == 0 && !started {
            return;
        }
        if !started {
            // No pool (cap 0): no mover started just to be told.
            let cap = self.swap_pinned.or_else(super::pinned_pool::cap_from_env).unwrap_or(0);
            if cap == 0 {
                return;
            }
        }
        let Ok(m) = self.mover() else { return };
        let sent = m.ahead_sent;
        let chunk = super::pinned_pool::CHUNK;
        if m.pinned > 0
            && (level.abs_diff(sent) >= chunk || (level == 0) != (sent == 0))
            && m.send_quiet(Msg::Ahead { bytes: level })
        {
            m.ahead_sent = level;
        }
    }

    /// Bytes of buffers born evicted and not yet restored: what host memory
    /// faulted in ahead (`Msg::Prepare`) may hold, since the daemon counts
    /// them in `swap_memory` although they take none.
    fn zeros_bytes(&self) -> usize {
        self.swapped.values().filter(|c| c.is_zeros()).map(|c| c.len).sum()
    }

    /// Tells the mover how much host memory faulted in ahead it may keep
    /// ([`ClientDevice::zeros_bytes`]), after buffers of zeros went.
    fn trim_prepared(&mut self) {
        let keep = self.zeros_bytes();
        if let Some(m) = self.st.as_mut().and_then(|st| st.mover.as_mut()) {
            m.send_quiet(Msg::Trim { keep });
        }
    }

    /// Hands a pinned pool's chunks back to the mover's pool (dropped, and so
    /// unpinned, when there is no mover).
    fn recycle(&mut self, m: Vec<HostMem>) {
        if let Some(mover) = self.st.as_mut().and_then(|st| st.mover.as_mut()) {
            mover.send_quiet(Msg::Recycle(m));
        }
    }

    /// After a lost context: host copies were pinned in it, and their pins
    /// went with it.
    pub(super) fn forget_pins(&mut self) {
        for c in self.swapped.values_mut() {
            c.forget_pins();
        }
    }

    /// Caps the pinned host pool of the moves (`super::pinned_pool`) at
    /// `bytes` (0: none, every move goes through the ring), instead of what
    /// gpumuxd's environment says ([`super::PINNED_VAR`]); for a mover not
    /// started yet (the first move starts it).
    pub fn set_swap_pinned(&mut self, bytes: usize) {
        self.swap_pinned = Some(bytes);
    }

    /// Grows the pinned pool to `bytes` from now on, whatever is allocated,
    /// instead of what gpumuxd's environment says
    /// ([`super::pinned_pool::AHEAD_VAR`]); starts the mover.
    pub fn set_swap_ahead(&mut self, bytes: usize) {
        if let Ok(m) = self.mover() {
            m.ahead_floor = bytes;
        }
        self.update_ahead();
    }

    /// The mover, started on first use.
    fn mover(&mut self) -> Result<&mut Mover, MemoryError> {
        let ctx = self.ctx.raw();
        let told = self.swap_pinned;
        let st = self.state()?;
        if st.mover.is_none() {
            // Read once, when the mover starts (not on every move: an unreadable value warns).
            let cap = told.or_else(super::pinned_pool::cap_from_env).unwrap_or(0);
            st.mover = Some(Mover::start(ctx, cap)?);
        }
        st.mover.as_mut().ok_or_else(|| CudaError::Invalid("the buffer mover did not start".into()).into())
    }

    /// Starts evicting (`evict`) or restoring the mapped buffer at `ptr` on
    /// the mover (`super::mover`; module doc): moves run in the order they
    /// are started, so a restore started after the evictions that make its
    /// room finds it. Its end comes from [`ClientDevice::take_moved`] with
    /// `token`. An eviction's buffer must have no work left; an error here:
    /// nothing started, nothing changed.
    pub fn start_move(&mut self, token: u64, evict: bool, ptr: u64) -> Result<(), MemoryError> {
        let ordinal = self.ctx.ordinal;
        let (size, bytes, handle) = match self.state()?.mappings.get(&ptr) {
            Some(m) if !m.moving && m.handle.is_some() == evict => (m.size, m.bytes, m.handle),
            _ => return Err(MemoryError::NotAllocated(ptr)),
        };
        let job = match (evict, handle) {
            (true, Some(handle)) => {
                let t = Instant::now();
                // The last restore's host copy, if it fits: its pages are in place.
                // Else, while buffers born evicted wait, the mover's memory faulted
                // in ahead for them (`None`: the mover picks); else fresh memory.
                let host = match self.spare_copy.take() {
                    Some(mut c) if c.fits(size) => {
                        c.set_buffer(bytes);
                        Some(c)
                    }
                    _ if self.zeros_bytes() > 0 => None,
                    _ => Some(HostCopy::new(size, bytes)?),
                };
                Job::Evict { token, ptr, size, bytes, handle, host, found: t.elapsed() }
            }
            _ => {
                let host = self.swapped.remove(&ptr).ok_or(MemoryError::NotAllocated(ptr))?;
                Job::Restore { token, ptr, size, ordinal, host }
            }
        };
        let zeros_restored = matches!(&job, Job::Restore { host, .. } if host.is_zeros());
        let mover = match self.mover() {
            Ok(m) => m,
            Err(e) => {
                if let Job::Restore { host, .. } = job {
                    self.swapped.insert(ptr, host);
                }
                return Err(e);
            }
        };
        if let Err(job) = mover.send(job) {
            // The thread is gone: whatever the job holds goes back.
            if let Job::Restore { host, .. } = job {
                self.swapped.insert(ptr, host);
            }
            return Err(CudaError::Invalid("the buffer mover thread is gone".into()).into());
        }
        if zeros_restored {
            // Behind the evictions that made its room (they took what they needed).
            self.trim_prepared();
        }
        if let Some(m) = self.state()?.mappings.get_mut(&ptr) {
            m.moving = true;
        }
        Ok(())
    }

    /// Bytes the moves taken so far DMAed straight from or into pinned host
    /// memory, and bytes they moved in all (restores of buffers born
    /// evicted left out): how much the pinned pool
    /// (`super::pinned_pool`) carried.
    pub fn swap_moved_direct(&self) -> (u64, u64) {
        self.st.as_ref().and_then(|st| st.mover.as_ref()).map_or((0, 0), |m| (m.moved_direct, m.moved))
    }

    /// Bytes of pinned host memory the movers' pool holds now, its chunks
    /// free and holding evicted buffers (`super::pinned_pool`; 0 before
    /// the mover starts).
    pub fn swap_pinned_held(&self) -> usize {
        self.st.as_ref().and_then(|st| st.mover.as_ref()).map_or(0, super::mover::Mover::pinned_held)
    }

    /// Appends the moves that ended since the last call: their token, and
    /// how long the move took or why it failed (then nothing changed).
    pub fn take_moved(&mut self, out: &mut Vec<(u64, Result<Duration, MemoryError>)>) {
        self.collect_moves(false);
        out.append(&mut self.moves_ended);
    }

    /// Waits for every move under way, then appends them as
    /// [`ClientDevice::take_moved`] does.
    pub fn settle_moves(&mut self, out: &mut Vec<(u64, Result<Duration, MemoryError>)>) {
        self.collect_moves(true);
        out.append(&mut self.moves_ended);
    }

    /// Takes the mover's ends (all of them, waiting, if `wait`) and applies
    /// them to the mappings and host copies.
    pub(super) fn collect_moves(&mut self, wait: bool) {
        loop {
            let Some(mover) = self.st.as_mut().and_then(|st| st.mover.as_mut()) else { return };
            if wait && mover.under_way == 0 {
                return;
            }
            let Some(done) = mover.next(wait) else { return };
            let r = self.apply(done);
            self.moves_ended.push(r);
        }
    }

    /// One move's end on the books (module doc); the log lines are what
    /// `scripts/oversubscribe-gpu.sh` reads.
    fn apply(&mut self, done: Done) -> (u64, Result<Duration, MemoryError>) {
        let Done { token, ptr, size, host, what, prepared, copied, zeros, direct, released } = done;
        // How much went straight from or into pinned memory (no field is "in"
        // or "copied": the GPU check's parser reads those).
        let pinned = if zeros {
            String::new()
        } else {
            format!("; {} % straight from pinned memory", direct * 100 / size.max(1))
        };
        let rate = size as f64 / copied.as_secs_f64().max(1e-9) / 1e9;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mapping = self.st.as_mut().and_then(|st| st.mappings.get_mut(&ptr));
        let Some(m) = mapping else {
            // Freed while it moved (`free_mapped` waits for it: a bug if seen).
            tracing::warn!("a move of {size} bytes at {ptr:#x} ended after its buffer was freed");
            return (token, Err(MemoryError::NotAllocated(ptr)));
        };
        m.moving = false;
        let result = match what {
            Ended::Evicted => {
                m.handle = None;
                let first = self.swapped.is_empty();
                self.swapped.insert(ptr, host);
                if first {
                    // Oversubscribed now (this buffer's chunks were taken or pinned on its path).
                    self.update_ahead();
                }
                tracing::info!(
                    "evicted {size} bytes at {ptr:#x}: host memory in {:.1} ms, copied in {:.1} ms ({rate:.1} GB/s{pinned}); \
                     device memory unmapped and released after it, {:.1} ms",
                    ms(prepared),
                    ms(copied),
                    ms(released)
                );
                Ok(prepared + copied)
            }
            Ended::EvictFailed(e) => {
                match host.into_pooled() {
                    Ok(chunks) => self.recycle(chunks),
                    Err(host) => self.spare_copy = Some(host).filter(|c| !c.is_zeros()),
                }
                Err(e.into())
            }
            Ended::Restored(h) => {
                m.handle = Some(h);
                // A buffer born evicted is a memset, no copy: the GPU check's rates leave it out.
                let zeros = if zeros { " as zeros" } else { "" };
                // Kept for the next eviction while others are evicted (an
                // exchange will follow): its pages are in place.
                self.spare_copy = Some(host).filter(|c| !c.is_zeros() && !self.swapped.is_empty());
                // The script's parser reads the last "in": the copy's time.
                tracing::info!(
                    "restored {size} bytes at {ptr:#x}{zeros} (memory created and mapped in {:.1} ms) in {:.1} ms ({rate:.1} GB/s{pinned})",
                    ms(prepared),
                    ms(copied)
                );
                Ok(prepared + copied)
            }
            Ended::RestoreFailed(e, out_of_memory) => {
                let bytes = host.buffer;
                self.swapped.insert(ptr, host);
                if out_of_memory {
                    let (free, total) = self.mem_info().unwrap_or((0, 0));
                    Err(MemoryError::OutOfMemory { bytes, free, total })
                } else {
                    Err(e.into())
                }
            }
        };
        (token, result)
    }

    /// Evicts the mapped buffer at `ptr` and waits for it (module doc). Its
    /// work must be done.
    pub fn evict(&mut self, ptr: u64) -> Result<(), MemoryError> {
        self.start_move(IN_CALL, true, ptr)?;
        self.wait_in_call()
    }

    /// Restores the evicted buffer at `ptr` at the same address and waits
    /// for it (module doc). Out of memory: nothing changed.
    pub fn restore(&mut self, ptr: u64) -> Result<(), MemoryError> {
        self.start_move(IN_CALL, false, ptr)?;
        self.wait_in_call()
    }

    /// The end of the move started with [`IN_CALL`] (others ended meanwhile
    /// wait for [`ClientDevice::take_moved`]).
    fn wait_in_call(&mut self) -> Result<(), MemoryError> {
        self.collect_moves(true);
        match self.moves_ended.iter().position(|(t, _)| *t == IN_CALL) {
            Some(i) => self.moves_ended.remove(i).1.map(|_| ()),
            None => Err(CudaError::Invalid("the buffer mover thread ended before the move".into()).into()),
        }
    }

    /// After a rebuild: the evicted buffer that was at `old` gets a range in
    /// the new context (at `old` where the driver can) and its host copy is
    /// pinned there; returns its address.
    pub fn readdress_evicted(&mut self, old: u64) -> Result<u64, MemoryError> {
        self.collect_moves(true);
        let g = self.swap_granularity().ok_or_else(|| CudaError::Invalid("this GPU cannot map memory".into()))?;
        let Some(host) = self.swapped.remove(&old) else { return Err(MemoryError::NotAllocated(old)) };
        let size = host.len;
        let ptr = reserve(size, g as usize, old)?;
        let bytes = host.buffer;
        self.state()?.mappings.insert(ptr, Mapping { size, bytes, handle: None, moving: false });
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

#[cfg(test)]
mod tests {
    use super::oversubscribe_off;

    #[test]
    fn oversubscription_is_off_only_when_the_variable_says_so() {
        for off in ["off", "0", "false", "no", " OFF "] {
            assert!(oversubscribe_off(Some(off)), "{off:?} turns it off");
        }
        for on in [None, Some("on"), Some("1"), Some(""), Some("offf")] {
            assert!(!oversubscribe_off(on), "{on:?} leaves it on");
        }
    }
}

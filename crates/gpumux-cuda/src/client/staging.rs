//! Evictions and restores through a small pinned ring (Share-a-GPU's double
//! buffering): the DMA of one chunk overlaps the CPU copy of the one before,
//! between a few pinned slots and the evicted buffer's ordinary (pageable)
//! host copy.
//!
//! The ring carries what the pinned host pool ([`super::pinned_pool`]) does
//! not: every move when the pool is off or the driver will not pin, the
//! first evictions before the pool has grown, and the part of a copy not
//! pinned yet. Pinning a host copy on the move's path cost about 0.4 s per
//! GB of fresh 4 KiB pages on the H200 machine (an 84 GB buffer: 33 s,
//! against 1.5 s for its copy; issue 39's first GPU run, 100 s of pinning in
//! a 122 s makespan). The ring is pinned once per context ([`SLOTS`] x
//! [`CHUNK`]).
//!
//! How the two overlap. To the host: up to [`SLOTS`] chunks' DMAs are
//! queued on the stream; the mover waits for the oldest, copies it out of
//! its slot, queues the next DMA into that slot, and so on, so while one
//! chunk is copied the next three are moving. To the device: a chunk is
//! copied into a slot whose last DMA is done, then its DMA is queued behind
//! the ones still moving. The DMA and the CPU copies overlapped so already
//! with 8 threads spawned per chunk, and both directions ran at 22-28 GB/s
//! against 55 for the link (H200 machine, 84 GB buffers): the CPU copies
//! were the bound. They now run on a persistent pool of threads, a chunk
//! split into 2 MiB pieces ([`super::copy_pool`]).

use super::copy_pool::CopyPool;
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;
use std::collections::VecDeque;

/// Bytes per slot.
pub(crate) const CHUNK: usize = 64 << 20;
/// Slots in the ring: the DMA of up to SLOTS - 1 chunks waits behind the
/// CPU copy of one.
pub(crate) const SLOTS: usize = 4;

/// The pinned ring of one context (module doc).
pub(crate) struct Staging {
    /// Pinned slots (`cuMemHostAlloc`), CHUNK bytes each.
    slots: Vec<usize>,
    /// One event per slot: its last DMA is done.
    events: Vec<usize>,
    /// The CPU copies' threads.
    pool: CopyPool,
}

impl Staging {
    /// The ring, pinned in the current context.
    /// `pinned`: the pinned pool's cap, for the log ([`super::pinned_pool`]).
    pub(crate) fn new(pinned: usize) -> Result<Staging, CudaError> {
        let pool = CopyPool::new(CopyPool::default_threads());
        tracing::info!(
            "buffer mover: pinned ring of {SLOTS} x {} MiB, host copies on {} threads, transparent huge pages: {}, \
             pinned host pool of at most {pinned} bytes",
            CHUNK >> 20,
            pool.threads(),
            huge_pages(),
        );
        let mut st = Staging { slots: Vec::new(), events: Vec::new(), pool };
        for _ in 0..SLOTS {
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; freed in Drop.
            check("cuMemHostAlloc", unsafe { cu::cuMemHostAlloc(&mut p, CHUNK, 0) })?;
            st.slots.push(p as usize);
            let mut e: cu::CUevent = std::ptr::null_mut();
            let flags = cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: out-pointer to a local; destroyed in Drop.
            check("cuEventCreate", unsafe { cu::cuEventCreate(&mut e, flags) })?;
            st.events.push(e as usize);
        }
        Ok(st)
    }

    fn slot(&self, i: usize) -> *mut u8 {
        self.slots[i] as *mut u8
    }

    fn event(&self, i: usize) -> cu::CUevent {
        self.events[i] as cu::CUevent
    }

    /// The copy pool's threads.
    pub(crate) fn copy_pool(&self) -> &CopyPool {
        &self.pool
    }

    /// Faults fresh host memory in on the copy pool (writes nothing).
    pub(crate) fn populate(&self, host: &mut [u8]) {
        self.pool.populate(host);
    }

    /// Copies `host.len()` bytes at device address `dev` into `host` on `s`;
    /// `fresh`: `host` was never written (its pages are faulted in as it is).
    pub(crate) fn to_host(&self, s: cu::CUstream, dev: u64, host: &mut [u8], fresh: bool) -> Result<(), CudaError> {
        let chunks = host.len().div_ceil(CHUNK);
        let mut in_flight: VecDeque<(usize, usize)> = VecDeque::new();
        for k in 0..chunks {
            let slot = k % SLOTS;
            if in_flight.len() == SLOTS {
                self.drain_one(&mut in_flight, host, fresh)?;
            }
            let len = CHUNK.min(host.len() - k * CHUNK);
            // SAFETY: the slot has CHUNK bytes; `len` bytes at dev + k*CHUNK are the buffer's.
            check("cuMemcpyDtoHAsync", unsafe {
                cu::cuMemcpyDtoHAsync_v2(self.slot(slot).cast(), dev + (k * CHUNK) as u64, len, s)
            })?;
            // SAFETY: an event and a stream of this context.
            check("cuEventRecord", unsafe { cu::cuEventRecord(self.event(slot), s) })?;
            in_flight.push_back((k, slot));
        }
        while !in_flight.is_empty() {
            self.drain_one(&mut in_flight, host, fresh)?;
        }
        Ok(())
    }

    /// The oldest chunk in flight to the host: waits for its DMA, then
    /// copies it out of its slot.
    fn drain_one(
        &self,
        in_flight: &mut VecDeque<(usize, usize)>,
        host: &mut [u8],
        fresh: bool,
    ) -> Result<(), CudaError> {
        let Some((k, slot)) = in_flight.pop_front() else { return Ok(()) };
        // SAFETY: an event of this context.
        check("cuEventSynchronize", unsafe { cu::cuEventSynchronize(self.event(slot)) })?;
        let len = CHUNK.min(host.len() - k * CHUNK);
        // SAFETY: the slot's DMA is done; it holds `len` bytes.
        let from = unsafe { std::slice::from_raw_parts(self.slot(slot), len) };
        self.pool.copy(&mut host[k * CHUNK..k * CHUNK + len], from, fresh);
        Ok(())
    }

    /// Copies `host` to device address `dev` on `s`, and waits for it.
    pub(crate) fn to_device(&self, s: cu::CUstream, host: &[u8], dev: u64) -> Result<(), CudaError> {
        let chunks = host.len().div_ceil(CHUNK);
        for k in 0..chunks {
            let slot = k % SLOTS;
            if k >= SLOTS {
                // The slot's last DMA must be done before it is written again.
                // SAFETY: an event of this context.
                check("cuEventSynchronize", unsafe { cu::cuEventSynchronize(self.event(slot)) })?;
            }
            let len = CHUNK.min(host.len() - k * CHUNK);
            // SAFETY: the slot has CHUNK bytes and no DMA reads it now.
            let to = unsafe { std::slice::from_raw_parts_mut(self.slot(slot), len) };
            self.pool.copy(to, &host[k * CHUNK..k * CHUNK + len], false);
            // SAFETY: `len` bytes at dev + k*CHUNK are the buffer's; the slot holds them.
            check("cuMemcpyHtoDAsync", unsafe {
                cu::cuMemcpyHtoDAsync_v2(dev + (k * CHUNK) as u64, self.slot(slot).cast(), len, s)
            })?;
            // SAFETY: an event and a stream of this context.
            check("cuEventRecord", unsafe { cu::cuEventRecord(self.event(slot), s) })?;
        }
        // SAFETY: a stream of this context.
        check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // Errors (a context already lost) have no one to go to.
        for &p in &self.slots {
            // SAFETY: allocated by cuMemHostAlloc in `new`.
            unsafe { cu::cuMemFreeHost(p as *mut std::ffi::c_void) };
        }
        for &e in &self.events {
            // SAFETY: created in `new`.
            unsafe { cu::cuEventDestroy_v2(e as cu::CUevent) };
        }
    }
}

/// The kernel's transparent huge page setting (the bracketed word of
/// `/sys/kernel/mm/transparent_hugepage/enabled`), for the log: with
/// `never`, fresh host copies fault 4 KiB at a time.
fn huge_pages() -> String {
    let read = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    let Ok(line) = read else { return "unknown".into() };
    match (line.find('['), line.find(']')) {
        (Some(a), Some(b)) if a < b => line[a + 1..b].to_string(),
        _ => line.trim().to_string(),
    }
}

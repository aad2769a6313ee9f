//! Host memory the daemon copies from and to directly: [`HostBuffer`]
//! (`Client::alloc_host`, `gpumux_host_alloc`), the equivalent of
//! `cudaHostAlloc` memory.
//!
//! A host buffer is a sealed memfd mapped here, like the staging region,
//! attached to the daemon as a host region of its own (`AttachHost`): the
//! daemon maps it too and pins it, so a copy between it and device memory is
//! one DMA with no `memcpy` on either side. The client keeps a table of its
//! buffers' address ranges; a copy whose host slice lies entirely inside one
//! of them goes direct, any other through the staging region.

use crate::conn::Connection;
use crate::error::Result;
use crate::shm::SharedRegion;
use gpumux_proto::{HostRegionId, HostSlice, Request};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

/// The address ranges of a client's host buffers: start → (length, region).
#[derive(Debug, Default)]
pub(crate) struct HostTable {
    ranges: Mutex<BTreeMap<usize, (usize, HostRegionId)>>,
}

impl HostTable {
    fn ranges(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, (usize, HostRegionId)>> {
        self.ranges.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn insert(&self, start: usize, len: usize, region: HostRegionId) {
        self.ranges().insert(start, (len, region));
    }

    fn remove(&self, start: usize) {
        self.ranges().remove(&start);
    }

    /// Where `[ptr, ptr + len)` lies, if entirely inside one host buffer (`len` > 0).
    pub(crate) fn find(&self, ptr: *const u8, len: usize) -> Option<HostSlice> {
        let start = ptr as usize;
        let end = start.checked_add(len).filter(|_| len > 0)?;
        let ranges = self.ranges();
        let (&base, &(size, region)) = ranges.range(..=start).next_back()?;
        (end <= base + size).then_some(HostSlice { region, offset: (start - base) as u64 })
    }
}

/// Host memory the daemon copies from and to directly (DMA, no staging
/// copy): the equivalent of `cudaHostAlloc` memory. Made by
/// [`crate::Client::alloc_host`]; dereferences to `[u8]` (zeroed at first).
///
/// Pass a slice of it to [`crate::Client::copy_to_device`] or
/// [`crate::Client::copy_to_host`]: a slice that lies entirely inside one
/// host buffer of the client is copied in one request straight between this
/// memory and the device, at the bus's speed; any other slice goes through
/// the client's shared region, in chunks, as before.
///
/// **Copies wait**, unless asked not to. A copy from or to a host buffer
/// returns when it is done, as a staging copy does: the borrow of the slice
/// ends with the call, so the buffer can be written, read or freed right
/// after it and never while the device uses it.
/// [`crate::Client::copy_to_device_async`] and
/// [`crate::Client::copy_to_host_async`] return once the copy is queued, as
/// `cudaMemcpyAsync` from pinned memory does (`unsafe`: the span is the
/// device's until a sync or an event says the stream got there); copies on
/// several streams, ordered by events, then overlap each other and kernels
/// from one thread, as in a CUDA program.
///
/// **Freed** on drop or with [`HostBuffer::free`] (which reports the
/// daemon's answer): its handle goes at once; the daemon unpins it once
/// copies queued before are done. Its bytes count against the daemon's
/// `host_memory` limit for this client (`Limits::host_memory_bytes`) while
/// it lives. It may outlive its client (it then stays plain memory).
pub struct HostBuffer {
    region: SharedRegion,
    id: HostRegionId,
    conn: Arc<Connection>,
    hosts: Arc<HostTable>,
    /// `DetachHost` was sent (by [`HostBuffer::free`]).
    detached: bool,
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer").field("region", &self.id.0).field("len", &self.region.len()).finish()
    }
}

impl HostBuffer {
    /// Attached by the client: `region` is mapped and known to the daemon as `id`.
    pub(crate) fn new(region: SharedRegion, id: HostRegionId, conn: Arc<Connection>, hosts: Arc<HostTable>) -> Self {
        hosts.insert(region.as_ptr() as usize, region.len(), id);
        HostBuffer { region, id, conn, hosts, detached: false }
    }

    /// Its size, bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// Never true: a host buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.region.len() == 0
    }

    /// The protocol's name for it.
    pub fn id(&self) -> HostRegionId {
        self.id
    }

    /// Its bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, lives as long as self, and the
        // daemon writes it only during a copy into it, which borrows it mutably.
        unsafe { std::slice::from_raw_parts(self.region.as_ptr(), self.region.len()) }
    }

    /// Its bytes, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_slice`, and `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.region.as_ptr(), self.region.len()) }
    }

    /// Start of its bytes.
    pub fn as_ptr(&self) -> *const u8 {
        self.region.as_ptr()
    }

    /// Start of its bytes, to fill.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// Frees it now and says whether the daemon took it back (dropping it
    /// does the same without waiting for the answer).
    pub fn free(mut self) -> Result<()> {
        self.detached = true;
        self.hosts.remove(self.region.as_ptr() as usize);
        let pending = self.conn.send(Request::DetachHost(self.id), None)?;
        crate::client::expect_done(pending)
    }
}

impl std::ops::Deref for HostBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for HostBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl AsRef<[u8]> for HostBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for HostBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if !self.detached {
            // Out of the table before the mapping goes (a new mapping may
            // take its addresses); the answer is not awaited, and a client
            // gone already has detached it.
            self.hosts.remove(self.region.as_ptr() as usize);
            if !self.conn.is_closed() {
                let _ = self.conn.send(Request::DetachHost(self.id), None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_buffer_goes_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<HostBuffer>();
    }

    #[test]
    fn a_slice_is_found_only_entirely_inside_one_buffer() {
        let t = HostTable::default();
        t.insert(0x1000, 0x100, HostRegionId(1));
        t.insert(0x1100, 0x100, HostRegionId(2));
        let at = |p: usize, n: usize| t.find(p as *const u8, n);
        assert_eq!(at(0x1000, 0x100), Some(HostSlice { region: HostRegionId(1), offset: 0 }));
        assert_eq!(at(0x1010, 0x10), Some(HostSlice { region: HostRegionId(1), offset: 0x10 }));
        assert_eq!(at(0x1100, 1), Some(HostSlice { region: HostRegionId(2), offset: 0 }));
        assert_eq!(at(0x10ff, 2), None, "across two buffers");
        assert_eq!(at(0x0fff, 2), None, "starts before the first");
        assert_eq!(at(0x11ff, 2), None, "runs past the last");
        assert_eq!(at(0x1010, 0), None, "an empty slice goes the usual way");
        assert_eq!(at(usize::MAX, 2), None, "no overflow");
        t.remove(0x1000);
        assert_eq!(at(0x1010, 0x10), None);
    }
}

//! A buffer's bytes read back and written in at once, in pieces, for a
//! client moving to another GPU (gpumuxd's `--rebalance`; gpumuxd's
//! `core/handover.rs`): the daemon asks only while nothing of that client
//! runs or is queued, and one piece at a time, so that it can bound how
//! long one call holds it.
//!
//! The bytes go the way a client's own copies go: an async copy on the
//! device's copy stream of that direction, into or out of host memory the
//! daemon registered (pinned) with [`ClientDevice::register_host`], then a
//! wait for that stream. Other copies queued on the same stream before it
//! run first; nothing else waits.

use super::{state_of, ClientDevice};
use crate::client::work::CopyLane;
use crate::error::CudaError;

impl ClientDevice {
    /// Copies `into.len()` bytes of the allocation at `addr`, from `offset`
    /// on, into `into`, and waits for them. `into` should be registered
    /// host memory (pinned: one DMA); ordinary memory works, at the
    /// driver's staged pace.
    pub fn read_piece(&mut self, addr: u64, offset: u64, into: &mut [u8]) -> Result<(), CudaError> {
        self.check_piece(addr, offset, into.len())?;
        let st = state_of(&self.ctx, &mut self.st)?;
        let s = &st.copy_streams[CopyLane::DeviceToHost as usize];
        // SAFETY: `into` is `into.len()` writable bytes, borrowed until the
        // stream's sync below returns; the device range was checked above.
        unsafe { s.copy_to_host_async(into.as_mut_ptr(), addr + offset, into.len())? };
        s.sync()
    }

    /// Copies `from` into the allocation at `addr` from `offset` on, and
    /// waits for it (host memory as for [`ClientDevice::read_piece`]).
    pub fn write_piece(&mut self, addr: u64, offset: u64, from: &[u8]) -> Result<(), CudaError> {
        self.check_piece(addr, offset, from.len())?;
        let st = state_of(&self.ctx, &mut self.st)?;
        let s = &st.copy_streams[CopyLane::HostToDevice as usize];
        // SAFETY: `from` is `from.len()` readable bytes, borrowed until the
        // stream's sync below returns; the device range was checked above.
        unsafe { s.copy_to_device_async(addr + offset, from.as_ptr(), from.len())? };
        s.sync()
    }

    /// `[offset, offset + len)` lies inside the resident allocation at `addr`.
    fn check_piece(&mut self, addr: u64, offset: u64, len: usize) -> Result<(), CudaError> {
        let st = state_of(&self.ctx, &mut self.st)?;
        let size = match (st.allocations.get(&addr), st.mappings.get(&addr)) {
            (Some(&bytes), _) => bytes,
            (None, Some(m)) if m.handle.is_some() && !m.moving => m.bytes,
            (None, Some(_)) => {
                return Err(CudaError::Invalid(format!("the buffer at {addr:#x} is evicted or moving to host memory")))
            }
            (None, None) => return Err(CudaError::Invalid(format!("no allocation at {addr:#x}"))),
        };
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|end| end > size) {
            return Err(CudaError::Invalid(format!(
                "{len} bytes at offset {offset} of the buffer at {addr:#x}, of {size} bytes"
            )));
        }
        Ok(())
    }
}

//! Moves straight between the device and a host copy's pinned part, with no
//! CPU copy (issue 39): the copies of the pinned pool
//! ([`super::pinned_pool`]) are pinned ahead of the move, so a move only
//! queues one DMA per pinned piece ([`PIN_PIECE`]); what is not pinned yet
//! (a copy still growing, or no pool) goes through the ring
//! ([`super::staging`]) behind them, on the same stream.

use super::host_copy::PIN_PIECE;
use super::staging::Staging;
use super::swap::HostCopy;
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;

/// Copies `len` bytes at device address `dev` into `host` on `s` and waits
/// for them; returns the bytes DMAed straight (the rest went through `ring`).
pub(crate) fn to_host(
    s: cu::CUstream,
    dev: u64,
    host: &mut HostCopy,
    len: usize,
    ring: &Staging,
) -> Result<usize, CudaError> {
    let (p, direct) = host.pinned_part(len);
    queue(s, dev, p, direct, true)?;
    let mut r = Ok(());
    if direct < len {
        let fresh = host.is_fresh();
        // Queued behind the DMAs above on the same stream; the ring waits for its own.
        r = ring.to_host(s, dev + direct as u64, &mut host.bytes_mut(len)[direct..], fresh);
    }
    // Every DMA is done before `host` is the caller's again, failed or not.
    // SAFETY: a stream of the current context.
    let synced = check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) });
    r.and(synced).map(|()| direct)
}

/// Copies `len` bytes of `host` to device address `dev` on `s` and waits
/// for them; returns the bytes DMAed straight.
pub(crate) fn to_device(
    s: cu::CUstream,
    host: &mut HostCopy,
    len: usize,
    dev: u64,
    ring: &Staging,
) -> Result<usize, CudaError> {
    let (p, direct) = host.pinned_part(len);
    queue(s, dev, p, direct, false)?;
    let mut r = Ok(());
    if direct < len {
        r = ring.to_device(s, &host.bytes(len)[direct..], dev + direct as u64);
    }
    // SAFETY: a stream of the current context.
    let synced = check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) });
    r.and(synced).map(|()| direct)
}

/// Queues the DMAs of `n` pinned bytes at `p`, one per pinned piece (each
/// piece is its own registration), to the host if `out`.
fn queue(s: cu::CUstream, dev: u64, p: *mut u8, n: usize, out: bool) -> Result<(), CudaError> {
    let mut at = 0;
    while at < n {
        let k = PIN_PIECE.min(n - at);
        let (d, h) = (dev + at as u64, p.wrapping_add(at));
        // SAFETY: `k` bytes at `d` are the buffer's, `k` at `h` are pinned host
        // memory the caller holds borrowed until the stream is synchronized.
        let r = unsafe {
            if out {
                cu::cuMemcpyDtoHAsync_v2(h.cast(), d, k, s)
            } else {
                cu::cuMemcpyHtoDAsync_v2(d, h.cast(), k, s)
            }
        };
        if r != cu::CUresult::CUDA_SUCCESS {
            // Nothing queued may outlive the borrow: wait for what was.
            // SAFETY: a stream of the current context.
            unsafe { cu::cuStreamSynchronize(s) };
            return check(if out { "cuMemcpyDtoHAsync" } else { "cuMemcpyHtoDAsync" }, r);
        }
        at += k;
    }
    Ok(())
}

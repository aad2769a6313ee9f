//! Moves straight between the device and a host copy, with no CPU copy
//! (issue 39; opt-in: [`DIRECT_VAR`]`=1` in gpumuxd's environment).
//!
//! Through the pinned ring ([`super::staging`]) every byte is copied once
//! more by the CPU, and host memory bandwidth bounds that copy at about
//! 40 GB/s (8-16 threads on the H200 machine), under the link's 55. Here
//! the host copy itself is pinned for the move, [`PIECE`] bytes at a time
//! (`cuMemHostRegister`), and each piece's DMA is queued as soon as it is
//! pinned, so pinning the next piece overlaps the DMA of the one before;
//! every piece is unpinned once all are done. A fresh piece (a host copy
//! never written) is faulted in on the copy pool first, in parallel, so
//! that pinning does not fault it in page by page on one thread. Pinning
//! fresh 4 KiB pages cost about 0.4 s per GB on the H200 machine.
//!
//! Measured on the H200 x4 machine (d805194, `scripts/oversubscribe-gpu.sh`):
//! pinning 8 GiB already faulted in as huge pages ran at 51.5 GB/s (fresh:
//! 7.8), unpinning at 70, a DMA into it at 55.3; yet moves made this way
//! ran at 18.5 GB/s out and 24.6 in (pinning, the DMA and unpinning add up
//! more than they overlap), and the urgent client beside them lost 36.9 %
//! of its rate, against 14.8-16.1 % through the ring. So it stays off by
//! default.
//!
//! A piece the driver will not pin makes the whole move fall back to the
//! ring (which rewrites every byte, so DMAs already made do no harm).

use super::copy_pool::CopyPool;
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;

/// Bytes pinned and moved at a time.
pub(crate) const PIECE: usize = 256 << 20;

/// Turns the direct moves on (`1`).
pub(crate) const DIRECT_VAR: &str = "GPUMUX_SWAP_DIRECT";

/// Whether [`DIRECT_VAR`] asks for direct moves.
pub(crate) fn enabled() -> bool {
    std::env::var(DIRECT_VAR).is_ok_and(|v| v.trim() == "1")
}

/// Which way a direct move goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Way {
    /// Device to host; `fresh`: the host copy was never written.
    ToHost {
        fresh: bool,
    },
    ToDevice,
}

/// Moves `len` bytes between device address `dev` and host memory at
/// `host` on stream `s` (module doc), and waits for them. `Ok(false)`: a
/// piece could not be pinned; nothing is pinned any more and the caller
/// moves the bytes through the ring instead.
///
/// # Safety
/// `host` must point to `len` bytes of the caller's host memory, writable
/// for [`Way::ToHost`], that nothing else touches until this returns.
pub(crate) unsafe fn copy(
    s: cu::CUstream,
    dev: u64,
    host: *mut u8,
    len: usize,
    way: Way,
    pool: &CopyPool,
) -> Result<bool, CudaError> {
    let mut pinned: Vec<usize> = Vec::new();
    let mut outcome = Ok(true);
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        // SAFETY: inside the caller's `len` bytes.
        let p = unsafe { host.add(at) };
        if let Way::ToHost { fresh: true } = way {
            // SAFETY: the caller's memory, touched by no one else (the caller's rule).
            pool.populate(unsafe { std::slice::from_raw_parts_mut(p, n) });
        }
        // SAFETY: `n` bytes of the caller's host memory; unpinned below.
        let r = unsafe { cu::cuMemHostRegister_v2(p.cast(), n, 0) };
        if r != cu::CUresult::CUDA_SUCCESS {
            tracing::warn!("pinning {n} bytes of a host copy in place failed ({r:?}); moving it through the ring");
            outcome = Ok(false);
            break;
        }
        pinned.push(p as usize);
        let d = dev + at as u64;
        // SAFETY: `n` bytes at `d` are the buffer's, `n` at `p` are pinned; both live until the sync below.
        let queued = match way {
            Way::ToHost { .. } => check("cuMemcpyDtoHAsync", unsafe { cu::cuMemcpyDtoHAsync_v2(p.cast(), d, n, s) }),
            Way::ToDevice => check("cuMemcpyHtoDAsync", unsafe { cu::cuMemcpyHtoDAsync_v2(d, p.cast(), n, s) }),
        };
        if let Err(e) = queued {
            outcome = Err(e);
            break;
        }
        at += n;
    }
    // Every DMA queued is done (or failed) before its memory is unpinned.
    // SAFETY: a stream of the current context.
    let synced = check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) });
    for p in pinned {
        // SAFETY: pinned above; no DMA uses it any more.
        unsafe { cu::cuMemHostUnregister(p as *mut std::ffi::c_void) };
    }
    match (outcome, synced) {
        (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        (Ok(done), Ok(())) => Ok(done),
    }
}

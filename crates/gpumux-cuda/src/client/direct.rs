//! Moves straight between the device and a host copy's pinned part, with no
//! CPU copy (issue 39). The copies of the pinned pool
//! ([`super::pinned_pool`]) are pinned ahead of the move, so a move only
//! queues one DMA per pinned piece ([`PIN_PIECE`]). A pool's copy not pinned
//! whole yet (the pool grows while the mover is idle, and a move can come
//! first) has its remaining pieces pinned on the move's path, each piece's
//! DMA queued as soon as it is pinned, so pinning the next piece overlaps
//! the DMA of the one before (and faulting in the piece after overlaps the
//! pinning, on the copy pool's threads); the pins are kept for the next moves (the
//! former per-move pinning also unpinned everything afterwards). What is
//! not pinned (a copy that is not the pool's, or the driver refused)
//! goes through the ring ([`super::staging`]) behind them, on the same
//! stream.
//!
//! [`PACE_VAR`] (GB/s, off by default) paces the DMAs below the link's
//! rate, leaving the link some room for other clients' traffic (a question
//! for the GPU check: does a move at the full rate cost an urgent client
//! launching beside it?).

use super::host_copy::{PinStop, PIN_PIECE};
use super::staging::Staging;
use super::swap::HostCopy;
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;
use std::time::{Duration, Instant};

/// Paces straight moves at this many GB/s (unset or 0: as fast as the link).
pub const PACE_VAR: &str = "GPUMUX_SWAP_PACE";

/// The pace [`PACE_VAR`] asks, bytes per second.
pub(crate) fn pace_from_env() -> Option<f64> {
    let v = std::env::var(PACE_VAR).ok()?;
    v.trim().parse::<f64>().ok().filter(|r| r.is_finite() && *r > 0.0).map(|gbs| gbs * 1e9)
}

/// How a straight move went: bytes DMAed straight, and why pinning on the
/// path stopped if it failed (the pool then grows no more).
pub(crate) struct Straight {
    pub direct: usize,
    pub pin_failed: Option<CudaError>,
}

/// The DMAs of one move, queued piece by piece, paced if asked.
struct Queue {
    s: cu::CUstream,
    dev: u64,
    out: bool,
    pace: Option<f64>,
    start: Instant,
    /// Bytes queued so far, from the start of the copy.
    at: usize,
}

impl Queue {
    /// Queues the DMAs of the pinned bytes from `at` to `to` (host memory
    /// from `p`), one per pinned piece (each piece is its own registration).
    fn up_to(&mut self, p: *mut u8, to: usize) -> Result<(), CudaError> {
        while self.at < to {
            let k = (PIN_PIECE - self.at % PIN_PIECE).min(to - self.at);
            let (d, h) = (self.dev + self.at as u64, p.wrapping_add(self.at));
            // SAFETY: `k` bytes at `d` are the buffer's, `k` at `h` are pinned host
            // memory the caller holds borrowed until the stream is synchronized.
            let r = unsafe {
                if self.out {
                    cu::cuMemcpyDtoHAsync_v2(h.cast(), d, k, self.s)
                } else {
                    cu::cuMemcpyHtoDAsync_v2(d, h.cast(), k, self.s)
                }
            };
            check(if self.out { "cuMemcpyDtoHAsync" } else { "cuMemcpyHtoDAsync" }, r)?;
            self.at += k;
            if let Some(rate) = self.pace {
                // Queue no further ahead than the pace allows (a piece at a time).
                let due = self.start + Duration::from_secs_f64(self.at as f64 / rate);
                let ahead = due.saturating_duration_since(Instant::now());
                if ahead > Duration::ZERO {
                    std::thread::sleep(ahead);
                }
            }
        }
        Ok(())
    }
}

/// Queues the straight part of a move of `len` bytes: the pinned part, then,
/// if `grow` (a pool's copy, the pool not broken), the rest pinned piece by
/// piece on the path. Returns how far it got.
fn straight(q: &mut Queue, host: &mut HostCopy, len: usize, grow: bool, ring: &Staging) -> Result<Straight, CudaError> {
    let (p, direct) = host.pinned_part(len);
    q.up_to(p, direct)?;
    let mut pin_failed = None;
    // Only the pool's copies: their bytes count against its cap.
    if grow && host.is_pooled() && direct < len {
        match host.pin_upto(len, ring.copy_pool(), |p, pinned| q.up_to(p, pinned.min(len))) {
            Ok(()) => {}
            Err(PinStop::Pin(e)) => pin_failed = Some(e),
            Err(PinStop::Dma(e)) => return Err(e),
        }
    }
    Ok(Straight { direct: host.pinned_part(len).1, pin_failed })
}

/// Copies `len` bytes at device address `dev` into `host` on `s` and waits
/// for them (module doc); the rest of what is not straight goes through `ring`.
pub(crate) fn to_host(
    s: cu::CUstream,
    dev: u64,
    host: &mut HostCopy,
    len: usize,
    ring: &Staging,
    grow: bool,
) -> Result<Straight, CudaError> {
    let mut q = Queue { s, dev, out: true, pace: pace_from_env(), start: Instant::now(), at: 0 };
    let r = straight(&mut q, host, len, grow, ring).and_then(|st| {
        if st.direct < len {
            let fresh = host.is_fresh();
            // Queued behind the DMAs above on the same stream; the ring waits for its own.
            ring.to_host(s, dev + st.direct as u64, &mut host.bytes_mut(len)[st.direct..], fresh)?;
        }
        Ok(st)
    });
    // Every DMA is done before `host` is the caller's again, failed or not.
    // SAFETY: a stream of the current context.
    let synced = check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) });
    let st = r?;
    synced.map(|()| st)
}

/// Copies `len` bytes of `host` to device address `dev` on `s` and waits
/// for them (module doc).
pub(crate) fn to_device(
    s: cu::CUstream,
    host: &mut HostCopy,
    len: usize,
    dev: u64,
    ring: &Staging,
    grow: bool,
) -> Result<Straight, CudaError> {
    let mut q = Queue { s, dev, out: false, pace: pace_from_env(), start: Instant::now(), at: 0 };
    let r = straight(&mut q, host, len, grow, ring).and_then(|st| {
        if st.direct < len {
            ring.to_device(s, &host.bytes(len)[st.direct..], dev + st.direct as u64)?;
        }
        Ok(st)
    });
    // SAFETY: a stream of the current context.
    let synced = check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) });
    let st = r?;
    synced.map(|()| st)
}

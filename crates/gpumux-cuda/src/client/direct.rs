//! Moves straight between the device and a host copy's pinned pieces, with
//! no CPU copy (issue 39). A host copy is pieces laid end to end (the pinned
//! pool's chunks, [`super::pinned_pool`]), pinned ahead of the move, so a
//! move only queues one DMA per chunk ([`PIN_PIECE`] each). A pool's chunk
//! not pinned whole yet (the pool grows while the mover is idle, and a move
//! can come first, or the cap had room for new chunks only) is pinned on
//! the move's path, each piece's
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
    out: bool,
    pace: Option<f64>,
    start: Instant,
    /// Bytes queued so far in all (for the pace).
    queued: usize,
}

impl Queue {
    /// Queues the DMAs of bytes `from..to` of a host piece at `h` (pinned
    /// there) and device address `dev` (the piece's first byte's), one per
    /// pinned [`PIN_PIECE`] of it (each is its own registration).
    fn dma(&mut self, dev: u64, h: *mut u8, from: usize, to: usize) -> Result<(), CudaError> {
        let mut at = from;
        while at < to {
            let k = (PIN_PIECE - at % PIN_PIECE).min(to - at);
            let (d, h) = (dev + at as u64, h.wrapping_add(at));
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
            at += k;
            self.queued += k;
            if let Some(rate) = self.pace {
                // Queue no further ahead than the pace allows (a piece at a time).
                let due = self.start + Duration::from_secs_f64(self.queued as f64 / rate);
                let ahead = due.saturating_duration_since(Instant::now());
                if ahead > Duration::ZERO {
                    std::thread::sleep(ahead);
                }
            }
        }
        Ok(())
    }
}

/// Moves `len` bytes between device address `dev` and `host`'s pieces, laid
/// end to end: for each piece, its pinned part straight; if `grow` (the
/// pool not broken), the rest of a pool's piece pinned on the path, each
/// pinned part's DMA queued as soon as it is pinned; what is left through
/// `ring`, behind the DMAs on the same stream. Does not wait for the DMAs.
fn move_pieces(
    q: &mut Queue,
    dev: u64,
    host: &mut HostCopy,
    len: usize,
    grow: bool,
    ring: &Staging,
) -> Result<Straight, CudaError> {
    let (mut at, mut direct, mut pin_failed) = (0usize, 0usize, None);
    for m in host.pieces_mut() {
        if at >= len {
            break;
        }
        let n = m.len().min(len - at);
        let d = dev + at as u64;
        let mut from = m.pinned().min(n);
        q.dma(d, m.as_mut_ptr(), 0, from)?;
        // Only the pool's pieces: their bytes count against its cap.
        if grow && pin_failed.is_none() && m.is_pooled() && from < n {
            let pinned = m.pin_upto(n, ring.copy_pool(), |p, pinned| {
                let to = pinned.min(n);
                q.dma(d, p, from, to)?;
                from = to;
                Ok(())
            });
            match pinned {
                Ok(()) => {}
                Err(PinStop::Pin(e)) => pin_failed = Some(e),
                Err(PinStop::Dma(e)) => return Err(e),
            }
        }
        let straight = m.pinned().min(n);
        direct += straight;
        if straight < n {
            // Queued behind the DMAs above on the same stream; the ring waits for its own.
            if q.out {
                let fresh = m.is_fresh();
                ring.to_host(q.s, d + straight as u64, &mut m.as_mut_slice()[straight..n], fresh)?;
            } else {
                ring.to_device(q.s, &m.as_slice()[straight..n], d + straight as u64)?;
            }
        }
        at += n;
    }
    if at < len {
        return Err(CudaError::Invalid(format!("a host copy of {at} bytes for a move of {len}")));
    }
    Ok(Straight { direct, pin_failed })
}

/// Copies `len` bytes between device address `dev` and `host` on `s` (to
/// the host if `out`) and waits for them (module doc).
fn copy(
    s: cu::CUstream,
    out: bool,
    dev: u64,
    host: &mut HostCopy,
    len: usize,
    ring: &Staging,
    grow: bool,
) -> Result<Straight, CudaError> {
    let mut q = Queue { s, out, pace: pace_from_env(), start: Instant::now(), queued: 0 };
    let r = move_pieces(&mut q, dev, host, len, grow, ring);
    // Every DMA is done before `host` is the caller's again, failed or not.
    // SAFETY: a stream of the current context.
    let synced = check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) });
    let st = r?;
    synced.map(|()| st)
}

/// Copies `len` bytes at device address `dev` into `host` on `s` and waits
/// for them (module doc).
pub(crate) fn to_host(
    s: cu::CUstream,
    dev: u64,
    host: &mut HostCopy,
    len: usize,
    ring: &Staging,
    grow: bool,
) -> Result<Straight, CudaError> {
    copy(s, true, dev, host, len, ring, grow)
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
    copy(s, false, dev, host, len, ring, grow)
}

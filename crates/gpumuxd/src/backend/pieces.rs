//! A buffer's bytes read back and written in piece by piece, for a client
//! moving to another GPU (`core/handover.rs`; docs/multi-gpu.md, "Moving a
//! client between GPUs").
//!
//! A real GPU's bytes travel through one staging region of [`PIECE`]
//! bytes, registered with the device as a client's shared region is (a
//! CUDA device pins it, so each piece is one DMA, the way a client's copy
//! of a device buffer to its region goes), made on the first move and kept.
//! A device process maps the same memfd: each piece is one exchange on its
//! link ([`super::wire::ToDevice::ReadPiece`]), so the device process is
//! held by one piece at a time, never by a whole buffer.

use super::MemError;
use crate::shm::ShmRegion;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

/// Bytes per piece, and the staging region's size: what one call holds
/// the device (or its process) for, at most (64 MiB, the CUDA device's
/// eviction ring's slot too: gpumux-cuda's `staging::CHUNK`).
pub const PIECE: usize = 64 << 20;

/// A region of `bytes` bytes of this process's own (a sealed memfd, as a
/// client's), to register with a device as staging.
pub fn staging_region(bytes: usize) -> Result<Arc<ShmRegion>, MemError> {
    let fail = |what: &str| MemError::Device(format!("the staging region of {bytes} bytes: {what}"));
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(c"gpumuxd-staging".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(fail(&std::io::Error::last_os_error().to_string()));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscalls on a descriptor we own.
    let sized = unsafe {
        libc::ftruncate(raw, bytes as libc::off_t) == 0 && libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) == 0
    };
    if !sized {
        return Err(fail(&std::io::Error::last_os_error().to_string()));
    }
    ShmRegion::map(fd, bytes as u64).map(Arc::new).map_err(|e| fail(&e.to_string()))
}

/// The staging region as bytes for a device to copy into or out of. Only
/// the thread that owns the backend touches it, one piece at a time, and
/// holds no other view of it meanwhile.
#[allow(clippy::mut_from_ref)]
pub fn staging_bytes(region: &ShmRegion) -> &mut [u8] {
    // SAFETY: the mapping is `len()` bytes, live while `region` is; its one
    // user (the thread that owns the backend) makes one piece at a time.
    unsafe { std::slice::from_raw_parts_mut(region.as_ptr(), region.len()) }
}

/// `len` bytes of `region` from `at`, for a device to copy into or out of
/// (a split's region: [`super::Backend::read_to_region`]); an error naming
/// the numbers past the region's end. The caller holds no other view of
/// these bytes meanwhile (a split's GPUs use disjoint spans of its region).
#[allow(clippy::mut_from_ref)]
pub fn region_span(region: &ShmRegion, at: u64, len: u64) -> Result<&mut [u8], MemError> {
    let r = region_range(region, at, len)?;
    // SAFETY: inside the mapping (checked), live while `region` is; no other
    // view of these bytes is held meanwhile (above).
    Ok(unsafe { std::slice::from_raw_parts_mut(region.as_ptr().add(r.start), r.len()) })
}

/// [`region_span`] to read only (a device copying from it, the merge
/// comparing two spans): shared views of a region may overlap.
pub fn region_bytes(region: &ShmRegion, at: u64, len: u64) -> Result<&[u8], MemError> {
    let r = region_range(region, at, len)?;
    // SAFETY: inside the mapping (checked), live while `region` is.
    Ok(unsafe { std::slice::from_raw_parts(region.as_ptr().add(r.start), r.len()) })
}

fn region_range(region: &ShmRegion, at: u64, len: u64) -> Result<std::ops::Range<usize>, MemError> {
    usize::try_from(at)
        .ok()
        .zip(usize::try_from(len).ok())
        .and_then(|(a, n)| Some(a..a.checked_add(n)?))
        .filter(|r| r.end <= region.len())
        .ok_or_else(|| MemError::Device(format!("{len} bytes at {at} of a region of {} bytes", region.len())))
}

/// Calls `piece(offset, len)` over `[0, total)` in pieces of at most
/// [`PIECE`] bytes, in order, stopping at the first error: what one call
/// holds the device (or its process) for stays bounded.
pub fn in_pieces(total: u64, mut piece: impl FnMut(u64, u64) -> Result<(), MemError>) -> Result<(), MemError> {
    let mut o = 0;
    while o < total {
        let n = (PIECE as u64).min(total - o);
        piece(o, n)?;
        o += n;
    }
    Ok(())
}

/// Reads `bytes` bytes from `start` on back through `staging`:
/// `piece(offset, len)` puts the buffer's `len` bytes from `offset` at the
/// start of `staging`. Each piece is copied once, from the staging region
/// into the result (no zero-fill of the result first: a fresh allocation's
/// pages are touched once, by that copy).
pub fn read_back(
    start: u64,
    bytes: u64,
    staging: &ShmRegion,
    mut piece: impl FnMut(u64, usize) -> Result<(), MemError>,
) -> Result<Vec<u8>, MemError> {
    let total = usize::try_from(bytes).map_err(|_| MemError::Device(format!("a read-back of {bytes} bytes")))?;
    let step = staging.len().min(PIECE);
    let mut out = Vec::new();
    out.try_reserve_exact(total)
        .map_err(|_| MemError::Device(format!("no host memory for a read-back of {bytes} bytes")))?;
    while out.len() < total {
        let len = step.min(total - out.len());
        piece(start + out.len() as u64, len)?;
        out.extend_from_slice(&staging_bytes(staging)[..len]);
    }
    Ok(out)
}

/// Writes `data` in at `start` through `staging`: `piece(offset, len)`
/// copies the first `len` bytes of `staging` into the buffer at `offset`.
pub fn write_in(
    start: u64,
    data: &[u8],
    staging: &ShmRegion,
    mut piece: impl FnMut(u64, usize) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let step = staging.len().min(PIECE);
    for (i, chunk) in data.chunks(step).enumerate() {
        staging.write(0, chunk);
        piece(start + (i * step) as u64, chunk.len())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_go_through_a_small_staging_region_in_order_and_come_out_whole() {
        // A device of 10_000 bytes, staging of 4096: pieces of 4096, 4096, 1808.
        let staging = staging_region(4096).expect("a memfd");
        let device: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut offsets = Vec::new();
        let back = read_back(0, device.len() as u64, &staging, |offset, len| {
            offsets.push((offset, len));
            let o = offset as usize;
            staging_bytes(&staging)[..len].copy_from_slice(&device[o..o + len]);
            Ok(())
        })
        .expect("read back");
        assert_eq!(back, device);
        assert_eq!(offsets, vec![(0, 4096), (4096, 4096), (8192, 1808)]);

        let mut written = vec![0u8; device.len()];
        write_in(0, &device, &staging, |offset, len| {
            let o = offset as usize;
            written[o..o + len].copy_from_slice(&staging_bytes(&staging)[..len]);
            Ok(())
        })
        .expect("write in");
        assert_eq!(written, device);
    }

    /// A span from `start`: its pieces are at the buffer's offsets, and the
    /// bytes are the span's.
    #[test]
    fn a_span_goes_through_in_pieces_from_its_start() {
        let staging = staging_region(4096).expect("a memfd");
        let device: Vec<u8> = (0..20_000u32).map(|i| (i * 13 % 241) as u8).collect();
        let mut offsets = Vec::new();
        let back = read_back(7000, 9000, &staging, |offset, len| {
            offsets.push((offset, len));
            let o = offset as usize;
            staging_bytes(&staging)[..len].copy_from_slice(&device[o..o + len]);
            Ok(())
        })
        .expect("read back");
        assert!(back[..] == device[7000..16_000]);
        assert_eq!(offsets, vec![(7000, 4096), (11_096, 4096), (15_192, 808)]);
        let mut written = device.clone();
        let new: Vec<u8> = (0..5000u32).map(|i| (i % 7) as u8).collect();
        write_in(12_345, &new, &staging, |offset, len| {
            let o = offset as usize;
            written[o..o + len].copy_from_slice(&staging_bytes(&staging)[..len]);
            Ok(())
        })
        .expect("write in");
        assert!(written[12_345..17_345] == new[..]);
        assert!(written[..12_345] == device[..12_345] && written[17_345..] == device[17_345..], "nothing else moved");
    }

    #[test]
    fn a_failed_piece_stops_the_read_with_its_error() {
        let staging = staging_region(1024).expect("a memfd");
        let mut calls = 0;
        let r = read_back(0, 5000, &staging, |offset, _| {
            calls += 1;
            if offset >= 2048 {
                Err(MemError::Device("gone".into()))
            } else {
                Ok(())
            }
        });
        assert!(matches!(r, Err(MemError::Device(ref w)) if w == "gone"), "{r:?}");
        assert_eq!(calls, 3);
    }
}

//! A client's shared-memory region: a memfd it created and sent with
//! `SCM_RIGHTS`, mapped here so copies read and write it in place.
//!
//! The client keeps its own mapping and could shrink the file under us,
//! which would turn our next access into SIGBUS. So a region is accepted
//! only if the memfd is sealed against shrinking (`F_SEAL_SHRINK`, which the
//! client library sets) and is at least as long as the client says.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

/// Why a region was refused.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    /// `fstat` or `fcntl` failed on the descriptor.
    #[error("cannot inspect the shared region's descriptor: {0}")]
    Inspect(std::io::Error),
    /// The file is not sealed against shrinking.
    #[error("the shared region must be a memfd sealed with F_SEAL_SHRINK (the client library does this)")]
    NotSealed,
    /// Shorter than the client said.
    #[error("the shared region is {actual} bytes, not the {claimed} bytes claimed")]
    TooShort {
        /// What the client said.
        claimed: u64,
        /// What the file is.
        actual: u64,
    },
    /// Zero bytes, or over what this machine can map.
    #[error("a shared region of {0} bytes cannot be mapped")]
    BadSize(u64),
    /// `mmap` failed.
    #[error("cannot map the shared region: {0}")]
    Map(std::io::Error),
}

/// A mapped, sealed region (see the module doc). Unmapped on drop.
#[derive(Debug)]
pub struct ShmRegion {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is plain shared memory owned by this value; concurrent
// access is the protocol's business (a copy touches a span only while the
// client waits for its answer), and the pointer is valid until drop.
unsafe impl Send for ShmRegion {}
unsafe impl Sync for ShmRegion {}

impl ShmRegion {
    /// Checks and maps `bytes` bytes of `fd`.
    pub fn map(fd: OwnedFd, bytes: u64) -> Result<ShmRegion, ShmError> {
        let len = usize::try_from(bytes).ok().filter(|&n| n > 0).ok_or(ShmError::BadSize(bytes))?;
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own; F_GET_SEALS takes no argument.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(ShmError::Inspect(std::io::Error::last_os_error()));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(ShmError::NotSealed);
        }
        // SAFETY: fstat fills a zeroed stat for a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(raw, &mut st) } != 0 {
            return Err(ShmError::Inspect(std::io::Error::last_os_error()));
        }
        let actual = st.st_size as u64;
        if actual < bytes {
            return Err(ShmError::TooShort { claimed: bytes, actual });
        }
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least that
        // long (and sealed so it stays so); checked for MAP_FAILED below.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, raw, 0)
        };
        if p == libc::MAP_FAILED {
            return Err(ShmError::Map(std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(ShmError::BadSize(bytes))?;
        Ok(ShmRegion { ptr, len, fd })
    }

    /// Its length, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (a region has at least one byte); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd, to hand the same region to the device process (`SCM_RIGHTS`).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether `[offset, offset + bytes)` lies inside the region.
    pub fn contains(&self, offset: u64, bytes: u64) -> bool {
        offset.checked_add(bytes).is_some_and(|end| end <= self.len as u64)
    }

    /// Copies `dst.len()` bytes out of the region from `offset`. Panics if out
    /// of range: callers check with [`ShmRegion::contains`] when the request comes.
    pub fn read(&self, offset: u64, dst: &mut [u8]) {
        assert!(self.contains(offset, dst.len() as u64), "shm read out of range");
        // SAFETY: in range (asserted); the region is mapped while self lives.
        unsafe { std::ptr::copy_nonoverlapping(self.as_ptr().add(offset as usize), dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies `src` into the region at `offset` (range as for [`ShmRegion::read`]).
    pub fn write(&self, offset: u64, src: &[u8]) {
        assert!(self.contains(offset, src.len() as u64), "shm write out of range");
        // SAFETY: in range (asserted); the region is mapped while self lives.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.as_ptr().add(offset as usize), src.len()) }
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

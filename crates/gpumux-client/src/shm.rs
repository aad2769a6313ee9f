//! The client's side of the shared-memory region: a sealed memfd, mapped
//! here and sent to the daemon, through which host copies move.
//!
//! The daemon maps the same file, so a copy is one `memcpy` into the region
//! here and one DMA there. The daemon refuses a region that could shrink
//! under it (a shrink would turn its next access into SIGBUS), so the file is
//! sealed against shrinking and growing, and the seals themselves are sealed.
//!
//! A host buffer (`Client::alloc_host`) is the same kind of file: the caller
//! writes and reads the mapping itself, and the daemon DMAs from and to it.

use crate::copier::{Copier, Toward};
use crate::error::{ClientError, Result};
use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// A mapped, sealed memfd of a fixed size. Unmapped on drop.
#[derive(Debug)]
pub(crate) struct SharedRegion {
    ptr: NonNull<u8>,
    len: usize,
    /// Until sent to the daemon (`close_fd`: a host buffer needs it no more,
    /// and a process has only so many descriptors).
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is owned by this value and valid until drop; who may
// touch which bytes when is the client's business (it holds the region's
// lock for a whole copy).
unsafe impl Send for SharedRegion {}
unsafe impl Sync for SharedRegion {}

/// The staging region's memfd name (seen in /proc/PID/fd and the daemon's log).
pub(crate) const MEMFD_NAME: &CStr = c"gpumux-shm";
/// A host buffer's memfd name.
pub(crate) const HOST_MEMFD_NAME: &CStr = c"gpumux-host";

impl SharedRegion {
    /// Creates, sizes, seals and maps a region of `bytes` bytes (> 0), its
    /// memfd named `name`. The memory reads as zeros.
    pub(crate) fn create(bytes: u64, name: &CStr) -> Result<SharedRegion> {
        let err = |cause| ClientError::Shm { bytes, cause };
        let len = usize::try_from(bytes)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let off =
            libc::off_t::try_from(bytes).map_err(|_| err(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
        // SAFETY: plain syscalls on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), off) } != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: as above; F_ADD_SEALS takes an int.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        // SAFETY: a shared mapping of exactly the file's (sealed) length; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(err(std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| err(std::io::Error::other("mmap returned null")))?;
        Ok(SharedRegion { ptr, len, fd: Some(fd) })
    }

    /// Its size, bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd, to send to the daemon (`None` once closed).
    pub(crate) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|fd| fd.as_fd())
    }

    /// Closes the memfd (the mapping stays): the daemon has its own.
    pub(crate) fn close_fd(&mut self) {
        self.fd = None;
    }

    /// Start of the mapping.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `src` into the region at `offset` with `copier` (split across
    /// its threads when large). The caller plans offsets inside the region
    /// ([`crate::chunk::plan`]) and writes a span only while the daemon does
    /// not use it; out of range panics.
    pub(crate) fn write(&self, offset: usize, src: &[u8], copier: &Copier) {
        assert!(offset.checked_add(src.len()).is_some_and(|end| end <= self.len), "shared region write out of range");
        // SAFETY: in range (asserted) and mapped while self lives; the
        // caller's slice is not the region's (the region is the library's
        // own), and nothing else writes the span meanwhile (the caller's plan).
        unsafe { copier.copy_raw(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len(), Toward::Region) }
    }

    /// Copies bytes out of the region from `offset` into `dst` (range as for [`SharedRegion::write`]).
    pub(crate) fn read(&self, offset: usize, dst: &mut [u8], copier: &Copier) {
        assert!(offset.checked_add(dst.len()).is_some_and(|end| end <= self.len), "shared region read out of range");
        // SAFETY: as for `write`; the daemon is done writing the span (its reply came).
        unsafe { copier.copy_raw(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len(), Toward::Caller) }
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `create`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

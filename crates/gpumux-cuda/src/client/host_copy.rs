//! An evicted buffer's bytes in host memory (issue 39), in memory that is
//! fast to write the first time.
//!
//! The first GPU runs with the pinned ring copied into fresh memory from the
//! system allocator: every 4 KiB page was faulted in (and zeroed) by the
//! kernel as the ring's copy first wrote it, and evictions ran at 5.1 GB/s
//! against 55 for the link. Here a host copy is its own anonymous mapping,
//! advised to the kernel for transparent huge pages (`MADV_HUGEPAGE`): a
//! fault brings 2 MiB, 512 times fewer faults, and the ring's copy threads
//! fault their own parts in parallel. Where the kernel has huge pages off
//! (`/sys/kernel/mm/transparent_hugepage/enabled` is `never`), the advice
//! does nothing and the copy is as before. A copy is reused for the next
//! eviction of about its size while anything is evicted (`spare_copy` in
//! [`super::swap`]), so an exchange writes into pages already there.

use crate::error::CudaError;

/// Huge pages are asked for copies of at least this many bytes.
const HUGE: usize = 2 << 20;

/// Host memory of a host copy: an anonymous private mapping (zeros until
/// written), unmapped on drop.
pub(crate) struct HostMem {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: owned memory, reached only through `&self`/`&mut self`.
unsafe impl Send for HostMem {}

impl HostMem {
    /// `len` bytes (> 0), or an error naming them (not an abort, as `vec!`
    /// would on a host out of memory).
    pub(crate) fn new(len: usize) -> Result<HostMem, CudaError> {
        let no_memory =
            |why: String| CudaError::Invalid(format!("no host memory for an evicted buffer of {len} bytes: {why}"));
        if len == 0 {
            return Err(no_memory("an empty buffer".into()));
        }
        // SAFETY: a fresh anonymous mapping; no address asked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(no_memory(std::io::Error::last_os_error().to_string()));
        }
        if len >= HUGE {
            // Advice only: refused (huge pages off, an old kernel), the copy is slower, not wrong.
            // SAFETY: the mapping just made.
            let _ = unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
        }
        Ok(HostMem { ptr: p.cast(), len })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable and writable for our life.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; no borrow outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_memory_starts_zero_holds_what_is_written_and_refuses_nothing_at_all() {
        for len in [1usize, 4096, HUGE, HUGE + 12345] {
            let mut m = HostMem::new(len).expect("host memory");
            assert_eq!(m.len(), len);
            assert!(m.as_slice().iter().all(|&b| b == 0), "{len} bytes start zero");
            for (i, b) in m.as_mut_slice().iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            assert!(m.as_slice().iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "{len} bytes kept");
        }
        let e = HostMem::new(0).err().expect("0 bytes is refused");
        assert!(e.to_string().contains("0 bytes"), "{e}");
    }
}

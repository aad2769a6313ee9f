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
//!
//! A copy of 2 MiB or more starts on a 2 MiB boundary (the mapping is made
//! 2 MiB longer and trimmed), so that every 2 MiB piece the copy pool
//! ([`super::copy_pool`]) faults in can be one huge page. A copy never
//! written is `fresh`: the pool faults it in (`MADV_POPULATE_WRITE`) as it
//! copies.
//!
//! A host copy of the pinned pool ([`super::pinned_pool`]) is also pinned,
//! [`PIN_PIECE`] bytes at a time from its start (`cuMemHostRegister`, one
//! registration per piece): a move DMAs its pinned part straight to or from
//! it and sends only the rest through the ring. It is unpinned when dropped.

use super::copy_pool::{CopyPool, Pending};
use crate::error::CudaError;
use crate::runtime::check;
use cudarc::driver::sys as cu;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Bytes pinned at a time (one registration, one DMA): small enough that
/// pinning one piece (populated, at about 50 GB/s on the H200 machine)
/// delays a move that arrives meanwhile by milliseconds.
pub(crate) const PIN_PIECE: usize = 128 << 20;

/// Huge pages are asked for copies of at least this many bytes.
const HUGE: usize = 2 << 20;

/// Why [`HostMem::pin_upto`] stopped short.
pub(crate) enum PinStop {
    /// The driver would not pin a piece.
    Pin(CudaError),
    /// The DMA queued after a piece failed.
    Dma(CudaError),
}

/// Host memory of a host copy: an anonymous private mapping (zeros until
/// written), unmapped on drop.
pub(crate) struct HostMem {
    ptr: *mut u8,
    len: usize,
    /// Never written: its pages are not there yet.
    fresh: bool,
    /// Bytes pinned from the start, whole [`PIN_PIECE`]s (the last one may
    /// be shorter): each piece is one registration.
    pinned: usize,
    /// The pinned pool's count of its memory, which this copy's `len` is
    /// part of until it is dropped ([`super::pinned_pool`]).
    book: Option<Arc<AtomicUsize>>,
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
        // Room to start on a 2 MiB boundary (trimmed below).
        let pad = if len >= HUGE { HUGE } else { 0 };
        let mapped = len.checked_add(pad).ok_or_else(|| no_memory("too large".into()))?;
        // SAFETY: a fresh anonymous mapping; no address asked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(no_memory(std::io::Error::last_os_error().to_string()));
        }
        let head = (HUGE - p as usize % HUGE) % HUGE;
        let head = if pad == 0 { 0 } else { head };
        // SAFETY: `head` bytes at the start and what is past `len` after them are
        // ours and unused (a failed munmap leaves them mapped: memory, not safety).
        unsafe {
            if head > 0 {
                libc::munmap(p, head);
            }
            // munmap takes whole pages: from the page after the copy's last byte.
            let page = usize::try_from(libc::sysconf(libc::_SC_PAGESIZE)).unwrap_or(4096).max(1);
            let tail = (head + len).next_multiple_of(page);
            let end = mapped.next_multiple_of(page);
            if pad > 0 && end > tail {
                libc::munmap(p.cast::<u8>().add(tail).cast(), end - tail);
            }
        }
        // SAFETY: `head < pad`, inside the mapping.
        let p = unsafe { p.cast::<u8>().add(head) };
        if len >= HUGE {
            // Advice only: refused (huge pages off, an old kernel), the copy is slower, not wrong.
            // SAFETY: the mapping just made.
            let _ = unsafe { libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE) };
        }
        Ok(HostMem { ptr: p, len, fresh: true, pinned: 0, book: None })
    }

    /// Counted in the pinned pool's `book` (its `len` was added there).
    pub(crate) fn set_book(&mut self, book: Arc<AtomicUsize>) {
        self.book = Some(book);
    }

    /// Made by the pinned pool (and counted there).
    pub(crate) fn is_pooled(&self) -> bool {
        self.book.is_some()
    }

    /// Bytes pinned from the start.
    pub(crate) fn pinned(&self) -> usize {
        self.pinned
    }

    /// Bytes of the next piece to pin; 0: pinned whole.
    pub(crate) fn next_pin(&self) -> usize {
        PIN_PIECE.min(self.len - self.pinned)
    }

    /// Pins pieces until `upto` bytes (at most its length) are pinned, for a
    /// move waiting on them: while one piece is pinned, the pool's threads
    /// fault the next in (fresh memory), so the two overlap instead of adding
    /// up. After each piece, `then(start, pinned)` queues its DMA.
    pub(crate) fn pin_upto(
        &mut self,
        upto: usize,
        pool: &CopyPool,
        mut then: impl FnMut(*mut u8, usize) -> Result<(), CudaError>,
    ) -> Result<(), PinStop> {
        let upto = upto.min(self.len);
        let mut ahead: Option<(Pending, usize)> = None;
        let mut out = Ok(());
        while self.pinned < upto {
            let (at, n) = (self.pinned, self.next_pin());
            if self.fresh {
                match ahead.take() {
                    Some((p, from)) => {
                        pool.wait(p);
                        if from != at {
                            pool.populate(&mut self.as_mut_slice()[at..at + n]);
                        }
                    }
                    None => pool.populate(&mut self.as_mut_slice()[at..at + n]),
                }
                let next = at + n;
                if next < upto {
                    let m = PIN_PIECE.min(self.len - next);
                    // SAFETY: `m` bytes of our mapping past the piece pinned below, touched
                    // by no one else (we hold `&mut self`) until waited for.
                    ahead = Some((unsafe { pool.start_populate(self.ptr.add(next), m) }, next));
                }
            }
            // SAFETY: `n` bytes of our mapping; unregistered in Drop (or forgotten with their context).
            let r = check("cuMemHostRegister", unsafe { cu::cuMemHostRegister_v2(self.ptr.add(at).cast(), n, 0) });
            if let Err(e) = r {
                out = Err(PinStop::Pin(e));
                break;
            }
            self.pinned += n;
            if let Err(e) = then(self.ptr, self.pinned) {
                out = Err(PinStop::Dma(e));
                break;
            }
        }
        if let Some((p, _)) = ahead {
            pool.wait(p);
        }
        if self.pinned == self.len {
            // Every piece was populated before it was pinned.
            self.fresh = false;
        }
        out
    }

    /// The context its pieces were pinned in is gone, and so are their
    /// registrations: nothing to unpin any more, and no longer the pool's.
    pub(crate) fn forget_pins(&mut self) {
        self.pinned = 0;
        if let Some(b) = self.book.take() {
            b.fetch_sub(self.len, Ordering::AcqRel);
        }
    }

    /// The address of its first byte (for DMAs into its pinned part).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    /// Never written (its pages are not there yet).
    pub(crate) fn is_fresh(&self) -> bool {
        self.fresh
    }

    /// Written whole: its pages are there.
    pub(crate) fn mark_written(&mut self) {
        self.fresh = false;
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
        let mut at = 0;
        while at < self.pinned {
            // A failure (its context already gone) leaves nothing to do.
            // SAFETY: a piece pinned by `pin_upto`; no DMA uses it (its move ended).
            unsafe { cu::cuMemHostUnregister(self.ptr.add(at).cast()) };
            at += PIN_PIECE;
        }
        if let Some(b) = self.book.take() {
            b.fetch_sub(self.len, Ordering::AcqRel);
        }
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
            assert!(m.is_fresh(), "{len} bytes: fresh");
            if len >= HUGE {
                assert_eq!(m.as_slice().as_ptr() as usize % HUGE, 0, "{len} bytes start on a huge page");
            }
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

//! A `memcpy` whose stores bypass the caches, for the large parts of the
//! staging copies (issue 35: a pageable copier beside a client of short
//! launches cost the latter 1.41x on 8 threads, 1.06x on 2).
//!
//! A staging copy's destination is not read again by this process soon: the
//! device reads the shared region by DMA, and a copy to the host fills a
//! caller's buffer of up to GiBs that no cache holds. A plain `memcpy` (and
//! `rep movsb` below glibc's non-temporal threshold, which a part of a few
//! MiB is) reads each destination line before writing it, a third memory
//! transfer per byte, and fills the last-level cache that the daemon's core,
//! its device process and the other clients share with lines nobody reads.
//! Non-temporal stores write whole lines to memory: on the 2-core dev VM
//! (AMD EPYC, 256 MiB in parts of 1 and 16 MiB, interleaved, 2026-11-29) one
//! thread moved 7.8-12.1 GB/s this way against 4.9-6.7 with
//! `copy_nonoverlapping`, so fewer threads move the same bytes.
//!
//! x86-64 only (SSE2's `movntdq`, part of the base instruction set); other
//! targets copy with `copy_nonoverlapping`.

/// Copies `len` bytes from `src` to `dst` with non-temporal stores, then
/// fences them (`sfence`), so that whatever this thread does after the call
/// (releasing a lock, a request to the daemon) is seen after the bytes.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, and they do
/// not overlap.
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's guarantee.
    unsafe {
        x86::copy(src, dst, len)
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's guarantee.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    /// A cache line: the stores of one loop turn fill one.
    const LINE: usize = 64;

    /// # Safety
    /// As [`super::copy`].
    pub(super) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
        // Up to the destination's first whole line with a plain copy: the
        // streaming stores need 16-byte alignment, and whole lines are what
        // the write-combining buffers send out at once.
        let head = ((dst as usize).wrapping_neg() & (LINE - 1)).min(len);
        // SAFETY: `head <= len`, inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
        let mut at = head;
        while at + LINE <= len {
            // SAFETY: `at + LINE <= len`, inside both ranges; `dst + at` is
            // 64-byte aligned (the head above); loads may be unaligned.
            unsafe {
                let s = src.add(at).cast::<__m128i>();
                let d = dst.add(at).cast::<__m128i>();
                let (a, b, c, e) = (
                    _mm_loadu_si128(s),
                    _mm_loadu_si128(s.add(1)),
                    _mm_loadu_si128(s.add(2)),
                    _mm_loadu_si128(s.add(3)),
                );
                _mm_stream_si128(d, a);
                _mm_stream_si128(d.add(1), b);
                _mm_stream_si128(d.add(2), c);
                _mm_stream_si128(d.add(3), e);
            }
            at += LINE;
        }
        // SAFETY: the tail, `len - at < LINE` bytes inside both ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), len - at) };
        // Streaming stores are weakly ordered: fence them before anything the
        // caller does next (module doc).
        // SAFETY: SSE is part of x86-64's base instruction set.
        unsafe { _mm_sfence() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_bitwise_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..4096u32 + 300).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for src_at in [0usize, 1, 15, 16, 63, 64] {
            for dst_at in [0usize, 1, 8, 17, 63] {
                for len in [0usize, 1, 15, 63, 64, 65, 127, 128, 1000, 4096] {
                    let mut dst = vec![0xa5u8; len + 200];
                    // SAFETY: both ranges lie inside their vectors and are distinct allocations.
                    unsafe { copy(src.as_ptr().add(src_at), dst.as_mut_ptr().add(dst_at), len) };
                    assert_eq!(&dst[dst_at..dst_at + len], &src[src_at..src_at + len], "{src_at}/{dst_at}/{len}");
                    assert!(
                        dst[..dst_at].iter().all(|&b| b == 0xa5),
                        "nothing written before ({src_at}/{dst_at}/{len})"
                    );
                    assert!(
                        dst[dst_at + len..].iter().all(|&b| b == 0xa5),
                        "nothing written after ({src_at}/{dst_at}/{len})"
                    );
                }
            }
        }
    }
}

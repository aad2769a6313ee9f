//! How a host copy is cut to fit the shared region (a pure plan, tested alone).
//!
//! A copy that fits in half the region goes in one request. A larger one is
//! cut into chunks of half the region each, alternating between the two
//! halves, so that while the daemon moves one chunk the client fills (or
//! empties) the other half: double buffering, with at most two chunk
//! requests in flight. Before a half is touched again, the reply of the
//! chunk that last used it must have come back; [`Chunk::reuses`] names it.

/// One request of a planned copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset of this chunk within the copy (host slice and device range alike).
    pub offset: u64,
    /// Where in the shared region it goes.
    pub shm_offset: u64,
    /// Its length, bytes (> 0).
    pub bytes: u64,
    /// The earlier chunk whose half of the region this one uses: its reply
    /// must be in before this chunk's bytes are written to (or, for a copy to
    /// the host, before that chunk's bytes are read out of) the region.
    pub reuses: Option<usize>,
}

/// Plans a copy of `total` bytes through a region of `region` bytes.
///
/// Returns no chunks for an empty copy. `region` must be at least 2 bytes
/// (the client never attaches a smaller one); with fewer, every chunk is one
/// byte at offset 0, each waiting for the one before.
pub fn plan(total: u64, region: u64) -> Vec<Chunk> {
    let half = (region / 2).max(1);
    if total <= half {
        return if total == 0 {
            Vec::new()
        } else {
            vec![Chunk { offset: 0, shm_offset: 0, bytes: total, reuses: None }]
        };
    }
    let halves: u64 = if region >= 2 { 2 } else { 1 };
    let mut chunks = Vec::with_capacity(total.div_ceil(half) as usize);
    let mut offset = 0;
    while offset < total {
        let index = chunks.len();
        let bytes = half.min(total - offset);
        chunks.push(Chunk {
            offset,
            shm_offset: (index as u64 % halves) * half,
            bytes,
            reuses: index.checked_sub(halves as usize),
        });
        offset += bytes;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_within_half_the_region_is_one_request() {
        assert_eq!(plan(0, 4096), vec![]);
        assert_eq!(plan(2048, 4096), vec![Chunk { offset: 0, shm_offset: 0, bytes: 2048, reuses: None }]);
    }

    #[test]
    fn a_larger_copy_alternates_halves_and_waits_two_back() {
        let chunks = plan(5000, 4096);
        assert_eq!(
            chunks,
            vec![
                Chunk { offset: 0, shm_offset: 0, bytes: 2048, reuses: None },
                Chunk { offset: 2048, shm_offset: 2048, bytes: 2048, reuses: None },
                Chunk { offset: 4096, shm_offset: 0, bytes: 904, reuses: Some(0) },
            ]
        );
    }

    #[test]
    fn chunks_cover_the_copy_exactly_and_stay_in_their_half() {
        for (total, region) in [(1u64, 2u64), (3, 2), (4097, 4096), (1 << 20, 4096), (12345, 1000), (7, 3)] {
            let chunks = plan(total, region);
            let half = region / 2;
            let mut next = 0;
            for (i, c) in chunks.iter().enumerate() {
                assert_eq!(c.offset, next, "chunks of {total} through {region} are contiguous");
                assert!(c.bytes > 0 && c.bytes <= half);
                assert!(c.shm_offset + c.bytes <= region, "chunk {i} stays in the region");
                assert_eq!(c.shm_offset, (i as u64 % 2) * half, "chunk {i} alternates halves");
                assert_eq!(c.reuses, i.checked_sub(2), "chunk {i} waits for the one that last used its half");
                next += c.bytes;
            }
            assert_eq!(next, total);
        }
    }

    #[test]
    fn a_one_byte_region_serialises_byte_by_byte() {
        let chunks = plan(3, 1);
        assert_eq!(
            chunks.iter().map(|c| (c.shm_offset, c.bytes, c.reuses)).collect::<Vec<_>>(),
            vec![(0, 1, None), (0, 1, Some(0)), (0, 1, Some(1))]
        );
    }
}

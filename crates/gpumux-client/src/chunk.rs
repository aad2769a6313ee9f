//! How a host copy is cut to fit the shared region (a pure plan, tested alone).
//!
//! The region is cut into equal slots ([`slots_for`]: four in a region of at
//! least [`MIN_SLOT_BYTES`] × 4, else two halves). A copy that fits in one
//! slot goes in one request. A larger one is cut into chunks of one slot
//! each, taking the slots in turn, so that while the daemon moves some
//! chunks the client fills (or empties) another: up to one chunk request in
//! flight per slot. Before a slot is touched again, the reply of the chunk
//! that last used it must have come back; [`Chunk::reuses`] names it.

/// The smallest slot worth a request of its own when a region is cut in
/// four (a smaller region keeps two halves).
pub const MIN_SLOT_BYTES: u64 = 1 << 20;

/// Slots a region of `region` bytes is cut into (module doc).
///
/// Four, not two, even in the largest default region (32 MiB): a chunk's
/// reply waits for the daemon's core, which beside another client's short
/// launches answers 0.5-1 ms late (issue 35), and two 16 MiB slots then
/// kept the device waiting (1 GiB up at 16.8 GB/s on an H200, 2026-11-29,
/// 2d3d1a2, against 26.7 through four). More requests cost the launching
/// client nothing measurable: the same four slots on 2 copy threads left
/// its chain at 1.06x its time alone.
pub fn slots_for(region: u64) -> u64 {
    if region >= 4 * MIN_SLOT_BYTES {
        4
    } else {
        2
    }
}

/// [`slots_for`], unless `GPUMUX_COPY_SLOTS` names a count from 1 to 16
/// (for comparisons).
pub fn slots_from_env(region: u64) -> u64 {
    std::env::var("GPUMUX_COPY_SLOTS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| (1..=16).contains(n))
        .unwrap_or_else(|| slots_for(region))
}

/// One request of a planned copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// Offset of this chunk within the copy (host slice and device range alike).
    pub offset: u64,
    /// Where in the shared region it goes.
    pub shm_offset: u64,
    /// Its length, bytes (> 0).
    pub bytes: u64,
    /// The earlier chunk whose slot of the region this one uses: its reply
    /// must be in before this chunk's bytes are written to (or, for a copy to
    /// the host, before that chunk's bytes are read out of) the region.
    pub reuses: Option<usize>,
}

/// Plans a copy of `total` bytes through a region of `region` bytes cut into
/// `slots` slots (at least 1).
///
/// Returns no chunks for an empty copy. `region` must be at least `slots`
/// bytes (the client never attaches a smaller one); with fewer, every chunk
/// is one byte at offset 0, each waiting for the one before.
pub fn plan(total: u64, region: u64, slots: u64) -> Vec<Chunk> {
    let slots = slots.max(1);
    let slot = (region / slots).max(1);
    if total <= slot {
        return if total == 0 {
            Vec::new()
        } else {
            vec![Chunk { offset: 0, shm_offset: 0, bytes: total, reuses: None }]
        };
    }
    let slots = if region >= slots { slots } else { 1 };
    let mut chunks = Vec::with_capacity(total.div_ceil(slot) as usize);
    let mut offset = 0;
    while offset < total {
        let index = chunks.len();
        let bytes = slot.min(total - offset);
        chunks.push(Chunk {
            offset,
            shm_offset: (index as u64 % slots) * slot,
            bytes,
            reuses: index.checked_sub(slots as usize),
        });
        offset += bytes;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_within_one_slot_is_one_request() {
        assert_eq!(plan(0, 4096, 2), vec![]);
        assert_eq!(plan(2048, 4096, 2), vec![Chunk { offset: 0, shm_offset: 0, bytes: 2048, reuses: None }]);
        assert_eq!(plan(2 << 20, 8 << 20, 4).len(), 1);
        assert_eq!(plan((2 << 20) + 1, 8 << 20, 4).len(), 2);
    }

    #[test]
    fn a_larger_copy_alternates_halves_and_waits_two_back() {
        let chunks = plan(5000, 4096, 2);
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
    fn chunks_cover_the_copy_exactly_and_stay_in_their_slot() {
        for slots in [1u64, 2, 4] {
            for (total, region) in [(1u64, 4u64), (5, 4), (4097, 4096), (1 << 20, 4096), (12345, 1000), (7, 6)] {
                let chunks = plan(total, region, slots);
                let slot = region / slots;
                let mut next = 0;
                for (i, c) in chunks.iter().enumerate() {
                    assert_eq!(c.offset, next, "chunks of {total} through {region} are contiguous");
                    assert!(c.bytes > 0 && c.bytes <= slot);
                    assert!(c.shm_offset + c.bytes <= region, "chunk {i} stays in the region");
                    assert_eq!(c.shm_offset, (i as u64 % slots) * slot, "chunk {i} takes the slots in turn");
                    assert_eq!(c.reuses, i.checked_sub(slots as usize), "chunk {i} waits for its slot's last user");
                    next += c.bytes;
                }
                assert_eq!(next, total);
            }
        }
    }

    #[test]
    fn a_large_region_is_cut_in_four_a_small_one_in_halves() {
        assert_eq!(slots_for(4096), 2);
        assert_eq!(slots_for(4 * MIN_SLOT_BYTES - 1), 2);
        assert_eq!(slots_for(8 << 20), 4);
        assert_eq!(slots_for(32 << 20), 4);
        let chunks = plan(1 << 30, 64 << 20, slots_for(64 << 20));
        assert_eq!(chunks.len(), 64, "16 MiB chunks");
        assert_eq!(chunks[5].shm_offset, 16 << 20);
        assert_eq!(chunks[5].reuses, Some(1));
    }

    #[test]
    fn a_region_smaller_than_its_slots_serialises_byte_by_byte() {
        let chunks = plan(3, 1, 2);
        assert_eq!(
            chunks.iter().map(|c| (c.shm_offset, c.bytes, c.reuses)).collect::<Vec<_>>(),
            vec![(0, 1, None), (0, 1, Some(0)), (0, 1, Some(1))]
        );
    }
}

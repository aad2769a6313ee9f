//! How a split launch's buffers are replicated before it and its outputs
//! merged after it, planned without a GPU.
//!
//! Two merge methods:
//!
//! * **Shadow** (GPU-SPARC's shadow buffers): every GPU runs on a full copy
//!   of the output that holds the pre-launch contents; afterwards each other
//!   GPU's copy is brought to the home GPU and a merge kernel
//!   ([`MERGE_SOURCE`]) takes, per 4-byte word, the other copy's value where
//!   it differs from the pre-launch contents (a snapshot taken on the home
//!   GPU before the launch). Bitwise correct when the words that different
//!   GPUs' blocks write are disjoint and whole 4-byte words. Costs, per other
//!   GPU: the whole output replicated there and copied back over the link,
//!   and a merge kernel that reads it and the snapshot.
//! * **Slices** (declared write sets, [`BlockSlices`]): the kernel declares
//!   that blocks `[g·G, (g+1)·G)` write only inside bytes
//!   `[offset + g·U, offset + (g+1)·U)` of the output. The split then cuts
//!   the blocks at multiples of G ([`super::partition`](fn@super::partition)), and each other GPU's
//!   slice is copied back into the home copy: no replication of a write-only
//!   output, no merge kernel, and only the bytes the GPU wrote cross the link.
//!   A wrong declaration gives wrong bytes, silently: `verify` runs the
//!   declaration's check on the GPU ([`COUNT_OUTSIDE`]), which counts the
//!   words a GPU changed outside its slices.

use super::SplitError;
use std::ops::Range;

/// What a kernel does with a buffer argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Only read: replicated to every GPU, never merged.
    In,
    /// Written, and not read before it is written: merged.
    Out,
    /// Read and written: replicated and merged.
    InOut,
}

/// A declared write set: which bytes of one output a run of blocks writes
/// (module doc). Block `b` writes only inside bytes
/// `[offset + ⌊b / granule_blocks⌋ × bytes_per_granule, + bytes_per_granule)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSlices {
    /// Blocks (linear index) that write one slice together: 1 for a
    /// kernel whose every block writes its own slice (triad: 256 floats a
    /// block); `gridDim.x` for a 2-D kernel whose rows of blocks write rows
    /// of a row-major output (sgemm: a row of 64×64 tiles writes 64 rows).
    pub granule_blocks: u32,
    /// Bytes of the output one granule writes.
    pub bytes_per_granule: u64,
    /// Where the first granule's slice starts, in bytes.
    pub offset: u64,
}

impl BlockSlices {
    /// The bytes blocks `blocks` write, clipped to a buffer of `len` bytes
    /// (`blocks` must start on a granule; it may end inside the last one).
    pub fn bytes_of(&self, blocks: &Range<u32>, len: u64) -> Range<u64> {
        if blocks.is_empty() {
            return 0..0;
        }
        let g = self.granule_blocks.max(1) as u64;
        let first = blocks.start as u64 / g;
        let end = (blocks.end as u64).div_ceil(g);
        let lo = (self.offset + first * self.bytes_per_granule).min(len);
        let hi = (self.offset + end * self.bytes_per_granule).min(len);
        lo..hi
    }
}

/// How one output is merged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Merge {
    /// GPU-SPARC's shadow-buffer merge.
    Shadow,
    /// Copy back the slices the kernel declares; `verify`: also check on the
    /// GPU that no GPU wrote outside its slices (costs a shadow copy and a
    /// count; for checks, not for timed runs).
    Slices {
        /// The declaration.
        slices: BlockSlices,
        /// Check the declaration on the GPU.
        verify: bool,
    },
}

/// One buffer argument as the plan sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferUse {
    /// Its size in bytes.
    pub bytes: u64,
    /// What the kernel does with it.
    pub role: Role,
    /// How it is merged (outputs; ignored for [`Role::In`]).
    pub merge: Merge,
}

/// What happens to one buffer around the launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferPlan {
    /// Copied from the home GPU to every other GPU that runs blocks, before the launch.
    pub replicate: bool,
    /// A snapshot of the home copy is taken before the launch (the shadow
    /// merge's pre-launch contents).
    pub snapshot: bool,
    /// Per GPU (index as in the split; the home GPU's entry is empty): the
    /// byte ranges copied back into the home copy as they are.
    pub copy_back: Vec<Vec<Range<u64>>>,
    /// Per GPU: its whole copy is brought home and merged word by word.
    pub shadow_merge: Vec<bool>,
    /// Per GPU: the words it changed outside its declared slices are counted
    /// (a declaration's check; the home GPU's too).
    pub verify: Vec<bool>,
}

/// The whole plan: the block ranges and what happens to each buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    /// Blocks per GPU (index 0: the home GPU).
    pub ranges: Vec<Range<u32>>,
    /// One per buffer argument, in argument order.
    pub buffers: Vec<BufferPlan>,
}

impl SplitPlan {
    /// Bytes that cross between GPUs: replication, copies back, shadows.
    pub fn link_bytes(&self, uses: &[BufferUse]) -> u64 {
        let others = self.ranges.iter().skip(1).filter(|r| !r.is_empty()).count() as u64;
        self.buffers
            .iter()
            .zip(uses)
            .map(|(p, u)| {
                let rep = if p.replicate { u.bytes * others } else { 0 };
                let back: u64 = p.copy_back.iter().flatten().map(|r| r.end - r.start).sum();
                let shadow = p.shadow_merge.iter().chain(&p.verify).filter(|&&s| s).count() as u64 * u.bytes;
                rep + back + shadow
            })
            .sum()
    }
}

/// The block granule a set of outputs needs: the least common multiple of
/// their declared granules (1 without any).
pub fn granule(uses: &[BufferUse]) -> Result<u32, SplitError> {
    let mut g: u64 = 1;
    for u in uses.iter().filter(|u| u.role != Role::In) {
        if let Merge::Slices { slices, .. } = u.merge {
            if slices.granule_blocks == 0 {
                return Err(SplitError::Invalid("a declared write set with a granule of 0 blocks".into()));
            }
            let b = slices.granule_blocks as u64;
            g = g / gcd(g, b) * b;
            if g > u32::MAX as u64 {
                return Err(SplitError::Invalid(format!(
                    "the declared write sets' granules have a common multiple of {g} blocks, more than a grid holds"
                )));
            }
        }
    }
    Ok(g as u32)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Plans the buffers of a launch whose blocks run as `ranges` (one per GPU,
/// from [`super::partition`](fn@super::partition) with [`granule`]).
pub fn plan(ranges: Vec<Range<u32>>, uses: &[BufferUse]) -> Result<SplitPlan, SplitError> {
    let n = ranges.len();
    let runs = |g: usize| g > 0 && !ranges[g].is_empty();
    let mut buffers = Vec::with_capacity(uses.len());
    for (i, u) in uses.iter().enumerate() {
        let mut p = BufferPlan {
            replicate: u.role != Role::Out,
            snapshot: false,
            copy_back: vec![Vec::new(); n],
            shadow_merge: vec![false; n],
            verify: vec![false; n],
        };
        match (u.role, u.merge) {
            (Role::In, _) => {}
            (_, Merge::Shadow) => {
                if u.bytes % 4 != 0 {
                    return Err(SplitError::Invalid(format!(
                        "buffer argument {i} has {} bytes, not a whole number of the shadow merge's 4-byte words",
                        u.bytes
                    )));
                }
                p.replicate = true;
                for g in (0..n).filter(|&g| runs(g)) {
                    p.shadow_merge[g] = true;
                }
                // On one GPU nothing is merged, so nothing needs the pre-launch contents.
                p.snapshot = p.shadow_merge.iter().any(|&m| m);
            }
            (_, Merge::Slices { slices, verify }) => {
                if slices.bytes_per_granule == 0 {
                    return Err(SplitError::Invalid(format!("buffer argument {i} declares slices of 0 bytes")));
                }
                let gb = slices.granule_blocks;
                for g in (0..n).filter(|&g| !ranges[g].is_empty()) {
                    let r = &ranges[g];
                    if !r.start.is_multiple_of(gb) {
                        return Err(SplitError::Invalid(format!(
                            "GPU {g}'s blocks start at {}, inside a granule of {gb} blocks declared for buffer argument {i}",
                            r.start
                        )));
                    }
                    let bytes = slices.bytes_of(r, u.bytes);
                    if g > 0 && !bytes.is_empty() {
                        p.copy_back[g].push(bytes);
                    }
                    if verify {
                        p.verify[g] = true;
                    }
                }
                if verify {
                    // The check compares with the pre-launch contents on every GPU.
                    p.replicate = true;
                    p.snapshot = true;
                }
            }
        }
        buffers.push(p);
    }
    Ok(SplitPlan { ranges, buffers })
}

/// The merge kernels, compiled with NVRTC for the home GPU.
pub const MERGE_SOURCE: &str = r#"
// GPU-SPARC's shadow-buffer merge, per 4-byte word: `dst` is the home GPU's
// copy of an output (it holds what the home GPU's blocks wrote), `shadow`
// another GPU's copy, `pristine` the output before the launch. A word the
// other GPU changed is taken from it. 16 bytes per thread where aligned.
extern "C" __global__ void gmx_shadow_merge(unsigned int* __restrict__ dst, const unsigned int* __restrict__ shadow,
                                            const unsigned int* __restrict__ pristine, unsigned long long words) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long quads = words / 4;
    uint4* d4 = reinterpret_cast<uint4*>(dst);
    const uint4* s4 = reinterpret_cast<const uint4*>(shadow);
    const uint4* p4 = reinterpret_cast<const uint4*>(pristine);
    for (unsigned long long q = first; q < quads; q += stride) {
        const uint4 s = s4[q], p = p4[q];
        if (s.x != p.x || s.y != p.y || s.z != p.z || s.w != p.w) {
            uint4 d = d4[q];
            if (s.x != p.x) d.x = s.x;
            if (s.y != p.y) d.y = s.y;
            if (s.z != p.z) d.z = s.z;
            if (s.w != p.w) d.w = s.w;
            d4[q] = d;
        }
    }
    for (unsigned long long w = quads * 4 + first; w < words; w += stride) {
        const unsigned int s = shadow[w];
        if (s != pristine[w]) dst[w] = s;
    }
}

// A declared write set's check: counts the words of `copy` (a GPU's copy of
// an output after its blocks ran) that differ from `pristine` outside the
// words [lo, hi) its slice covers.
extern "C" __global__ void gmx_count_outside(const unsigned int* __restrict__ copy,
                                             const unsigned int* __restrict__ pristine, unsigned long long words,
                                             unsigned long long lo, unsigned long long hi,
                                             unsigned long long* __restrict__ count) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long mine = 0;
    for (unsigned long long w = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; w < words; w += stride)
        if ((w < lo || w >= hi) && copy[w] != pristine[w]) ++mine;
    if (mine != 0) atomicAdd(count, mine);
}
"#;

/// The shadow merge kernel's name in [`MERGE_SOURCE`].
pub const SHADOW_MERGE: &str = "gmx_shadow_merge";
/// The declaration check's name in [`MERGE_SOURCE`].
pub const COUNT_OUTSIDE: &str = "gmx_count_outside";

#[cfg(test)]
mod tests {
    use super::*;

    fn slices(g: u32, u: u64) -> Merge {
        Merge::Slices { slices: BlockSlices { granule_blocks: g, bytes_per_granule: u, offset: 0 }, verify: false }
    }

    #[test]
    fn inputs_are_replicated_and_never_merged() {
        let p = plan(vec![0..5, 5..10], &[BufferUse { bytes: 40, role: Role::In, merge: Merge::Shadow }]).unwrap();
        assert_eq!(
            p.buffers[0],
            BufferPlan {
                replicate: true,
                snapshot: false,
                copy_back: vec![vec![], vec![]],
                shadow_merge: vec![false, false],
                verify: vec![false, false],
            }
        );
    }

    #[test]
    fn shadow_outputs_are_replicated_snapshotted_and_merged_from_every_other_gpu_that_ran() {
        let u = [BufferUse { bytes: 4096, role: Role::Out, merge: Merge::Shadow }];
        let p = plan(vec![0..2, 2..4, 4..4], &u).unwrap();
        let b = &p.buffers[0];
        assert!(b.replicate && b.snapshot);
        assert_eq!(b.shadow_merge, vec![false, true, false]);
        // Replicated to one GPU, brought back from one.
        assert_eq!(p.link_bytes(&u), 2 * 4096);
        // Alone on the home GPU: nothing to merge, no snapshot.
        let alone = plan(std::iter::once(0..4).collect(), &u).unwrap();
        assert!(!alone.buffers[0].snapshot && alone.buffers[0].shadow_merge == vec![false]);
        let odd = plan(vec![0..1, 1..2], &[BufferUse { bytes: 6, role: Role::Out, merge: Merge::Shadow }]);
        assert!(odd.unwrap_err().to_string().contains("6 bytes, not a whole number"));
    }

    #[test]
    fn declared_slices_copy_back_only_what_each_gpu_wrote() {
        // triad-like: 1000 blocks of 1 KiB each, the last buffer 1000 KiB less 512 B.
        let len = 1000 * 1024 - 512;
        let u = [BufferUse { bytes: len, role: Role::Out, merge: slices(1, 1024) }];
        let p = plan(vec![0..500, 500..1000], &u).unwrap();
        let b = &p.buffers[0];
        assert!(!b.replicate && !b.snapshot);
        assert_eq!(b.copy_back, vec![vec![], vec![500 * 1024..len]]);
        assert_eq!(p.link_bytes(&u), len - 500 * 1024);
        // sgemm-like: rows of 16 blocks write 64 rows of 4096 B.
        let s = slices(16, 64 * 4096);
        let p = plan(vec![0..128, 128..256], &[BufferUse { bytes: 1024 * 4096, role: Role::Out, merge: s }]).unwrap();
        assert_eq!(p.buffers[0].copy_back[1], vec![512 * 4096..1024 * 4096]);
    }

    #[test]
    fn a_range_inside_a_granule_is_refused_and_granules_combine() {
        let u = [BufferUse { bytes: 1 << 20, role: Role::Out, merge: slices(16, 4096) }];
        assert!(plan(vec![0..8, 8..32], &u).unwrap_err().to_string().contains("inside a granule of 16"));
        let two = [
            BufferUse { bytes: 1 << 20, role: Role::Out, merge: slices(6, 64) },
            BufferUse { bytes: 1 << 20, role: Role::InOut, merge: slices(4, 64) },
            BufferUse { bytes: 1 << 20, role: Role::In, merge: slices(7, 64) },
        ];
        assert_eq!(granule(&two).unwrap(), 12);
        assert_eq!(granule(&[]).unwrap(), 1);
        assert!(granule(&[BufferUse { bytes: 4, role: Role::Out, merge: slices(0, 4) }]).is_err());
    }

    #[test]
    fn verified_slices_are_replicated_for_the_check() {
        let m =
            Merge::Slices { slices: BlockSlices { granule_blocks: 1, bytes_per_granule: 64, offset: 0 }, verify: true };
        let p = plan(vec![0..2, 2..4], &[BufferUse { bytes: 256, role: Role::Out, merge: m }]).unwrap();
        let b = &p.buffers[0];
        assert!(b.replicate && b.snapshot);
        // The home GPU's blocks are checked too (before the others' slices arrive).
        assert_eq!(b.verify, vec![true, true]);
        assert_eq!(b.copy_back[1], vec![128..256]);
    }

    #[test]
    fn slices_clip_to_the_buffer_and_honour_the_offset() {
        let s = BlockSlices { granule_blocks: 2, bytes_per_granule: 100, offset: 50 };
        assert_eq!(s.bytes_of(&(0..4), 1000), 50..250);
        assert_eq!(s.bytes_of(&(4..5), 1000), 250..350);
        assert_eq!(s.bytes_of(&(4..5), 300), 250..300);
        assert_eq!(s.bytes_of(&(8..10), 300), 300..300);
        assert_eq!(s.bytes_of(&(3..3), 1000), 0..0);
    }
}

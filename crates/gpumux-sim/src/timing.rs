//! How long a block takes: its own variation and memory contention.

use gpumux_engine::kernel::KernelDesc;
use gpumux_engine::time::Nanos;

/// SplitMix64 finaliser: a good 64-bit mix, so per-block times are a pure
/// function of (seed, kernel key, block index) with no RNG state to thread
/// through. That keeps a block's time the same under every policy and in the
/// isolated run, which is what NTT needs.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Uncontended time of block `index`: mean × (1 + spread × u), u uniform in [-1, 1).
#[inline]
pub fn block_time(desc: &KernelDesc, seed: u64, time_key: u64, index: u64) -> Nanos {
    if desc.block_time_spread <= 0.0 {
        return desc.block_time_ns;
    }
    let h = mix64(seed ^ mix64(time_key ^ mix64(index)));
    let u = (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    let t = desc.block_time_ns as f64 * (1.0 + desc.block_time_spread.min(1.0) * u);
    t.max(1.0) as Nanos
}

/// Bandwidth demand of one resident block, as a fraction of the device's:
/// a kernel filling every SM with its blocks demands `mem_intensity`.
pub fn mem_demand_per_block(desc: &KernelDesc, blocks_per_sm: u32, num_sms: u16) -> f64 {
    desc.mem_intensity.clamp(0.0, 1.0) / (blocks_per_sm.max(1) as f64 * num_sms.max(1) as f64)
}

/// Stretches the memory-bound part of a block when the device's summed
/// bandwidth demand (including this block) exceeds what it has. The demand is
/// sampled when the block starts; blocks are short next to the changes of
/// co-runners, and sampling once keeps the simulator O(1) per block.
#[inline]
pub fn stretch(t: Nanos, mem_intensity: f64, demand: f64) -> Nanos {
    if demand <= 1.0 || mem_intensity <= 0.0 {
        return t;
    }
    let m = mem_intensity.clamp(0.0, 1.0);
    (t as f64 * ((1.0 - m) + m * demand)) as Nanos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretch_only_above_saturation() {
        assert_eq!(stretch(100, 1.0, 0.9), 100);
        assert_eq!(stretch(100, 1.0, 2.0), 200);
        assert_eq!(stretch(100, 0.5, 2.0), 150);
        assert_eq!(stretch(100, 0.0, 5.0), 100);
    }
}

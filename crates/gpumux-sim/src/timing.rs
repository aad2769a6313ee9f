//! How long a block takes alone: its own variation (contention: `memory.rs`).

use gpumux_engine::kernel::SimTiming;
use gpumux_engine::time::Nanos;

/// A kernel that reached the simulator without a block-time model (a
/// description made for a real device only). The simulator refuses its launch
/// rather than invent a time; workload files always give one
/// (`block_time_us` is required).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "kernel `{kernel}` has no simulator timing (block time, spread, memory intensity), so the simulated GPU \
     cannot run it: give it one (`block_time_us` in a workload file, `KernelDesc::with_sim_timing` in code)"
)]
pub struct NoSimTiming {
    /// The kernel's name.
    pub kernel: String,
}

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
pub fn block_time(timing: &SimTiming, seed: u64, time_key: u64, index: u64) -> Nanos {
    if timing.block_time_spread <= 0.0 {
        return timing.block_time_ns;
    }
    let h = mix64(seed ^ mix64(time_key ^ mix64(index)));
    let u = (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
    let t = timing.block_time_ns as f64 * (1.0 + timing.block_time_spread.min(1.0) * u);
    // At most twice the mean (spread < 1), itself a Nanos: no saturation.
    t.max(1.0) as Nanos
}

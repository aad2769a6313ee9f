//! First-order DRAM model: a per-SM ceiling and one device-wide bandwidth.
//!
//! Two limits decide how fast a block's memory-bound part runs:
//!
//! 1. **Per SM.** An SM full of a fully memory-bound kernel draws at most
//!    `sm_bandwidth` bytes/s (its memory-level parallelism over DRAM latency).
//!    A resident block of a kernel with memory intensity `m` and occupancy
//!    `bps` blocks per SM asks for `m × sm_bandwidth / bps`: `m` is the share
//!    of the block's time spent waiting on memory when nothing else limits it.
//! 2. **Device.** All resident blocks on all SMs share `mem_bandwidth`. When
//!    their summed demand `D` (in units of `mem_bandwidth`) exceeds 1, every
//!    block gets the same fraction `1 / D` of what it asks for, so its
//!    memory-bound part stretches by `D`: time `∝ (1 − m) + m × max(1, D)`.
//!
//! Because `sm_bandwidth × num_sms` is larger than `mem_bandwidth` (the ratio
//! is `saturation_ratio`, κ), a memory-bound kernel saturates DRAM with about
//! `num_sms / κ` SMs and gets no faster with more, and two memory-bound
//! kernels on disjoint SM sets slow each other down.
//!
//! **Calibration.** A kernel's `block_time_ns` is the time of a block when its
//! kernel runs alone on the whole device (that is what Tanasic Table 1 and
//! Adriaens Table 3.2 measure, and what the workloads are fitted to). So block
//! times are scaled by `f(D) / f(D_alone)`, `D_alone` being the demand the
//! kernel has alone on all `calibration_sms` SMs: alone on the whole GPU a
//! block takes exactly `block_time_ns`, on fewer SMs or next to lighter
//! co-runners it can be faster, next to memory-bound co-runners slower.
//!
//! **Sampling.** `D` is read once per block, at the end of the instant in
//! which the block starts (all blocks issued at the same virtual time see the
//! demand of all of them), and fixed for the block's life. That keeps the
//! simulator O(1) per block; blocks are short next to their co-runners'
//! changes. Context saves and restores run at `mem_bandwidth / num_sms` each
//! (Tanasic's assumption, pinned by `tests/tanasic_save_time.rs`) and are not
//! counted as demand.

use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::time::Nanos;

/// The memory parameters of a simulated device beyond `DeviceInfo`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemModel {
    /// Bytes per second one SM full of a memory-bound kernel can draw.
    pub sm_bandwidth: f64,
    /// SM count that block times are calibrated on (`None`: the device's own).
    /// Set it when simulating a cut-down copy of a device with the block
    /// times of the full one (isolated profiles on 1..N SMs).
    pub calibration_sms: Option<u16>,
}

impl MemModel {
    /// A model in which a memory-bound kernel saturates DRAM with `num_sms / ratio` SMs.
    pub fn with_ratio(info: &DeviceInfo, ratio: f64) -> Self {
        MemModel { sm_bandwidth: ratio * info.per_sm_bandwidth(), calibration_sms: None }
    }

    /// κ = SMs' summed ceiling / DRAM bandwidth on `info`.
    pub fn saturation_ratio(&self, info: &DeviceInfo) -> f64 {
        self.sm_bandwidth * info.num_sms as f64 / info.mem_bandwidth.max(1.0)
    }
}

/// What the model needs of one launch, computed once when it starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelMem {
    /// Memory-bound share of a block's unconstrained time, in [0, 1].
    pub intensity: f64,
    /// Demand of one resident block, as a fraction of the device's bandwidth.
    pub demand_per_block: f64,
    /// `f(D_alone)`: the slowdown already contained in `block_time_ns`.
    pub alone_factor: f64,
}

/// Slowdown of a block's time at summed demand `d`, relative to no DRAM limit.
#[inline]
fn slowdown(m: f64, d: f64) -> f64 {
    (1.0 - m) + m * d.max(1.0)
}

impl KernelMem {
    /// The model of a kernel of `blocks` blocks with memory intensity
    /// `mem_intensity`, `bps` of them resident per SM.
    pub fn new(mem_intensity: f64, blocks: u64, bps: u32, info: &DeviceInfo, model: &MemModel) -> Self {
        let m = mem_intensity.clamp(0.0, 1.0);
        let bandwidth = info.mem_bandwidth.max(1.0);
        let demand_per_block = m * model.sm_bandwidth / (bps.max(1) as f64 * bandwidth);
        // Alone on the whole (calibration) device: as many blocks resident as
        // fit, or as the grid has.
        let sms = model.calibration_sms.unwrap_or(info.num_sms).max(1) as u64;
        let resident = blocks.min(sms * bps.max(1) as u64) as f64;
        KernelMem { intensity: m, demand_per_block, alone_factor: slowdown(m, resident * demand_per_block) }
    }

    /// A block's time at summed device demand `demand` (this block included),
    /// from its time alone on the whole device.
    #[inline]
    pub fn block_time(&self, t: Nanos, demand: f64) -> Nanos {
        if self.intensity <= 0.0 || (demand <= 1.0 && self.alone_factor <= 1.0) {
            return t;
        }
        // Cannot saturate: t is at most 2 × 10^12 ns (a validated block time
        // with its spread) and the factor at most the resident blocks' summed
        // demand, a few thousand; the caller's `now + t` is checked.
        ((t as f64 * slowdown(self.intensity, demand) / self.alone_factor).round() as Nanos).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;

    #[test]
    fn compute_bound_is_never_stretched() {
        let info = presets::k20c();
        let k = KernelMem::new(0.0, 10_000, 4, &info, &MemModel::with_ratio(&info, 2.5));
        assert_eq!(k.block_time(1_000, 0.1), 1_000);
        assert_eq!(k.block_time(1_000, 50.0), 1_000);
    }

    #[test]
    fn alone_on_the_whole_device_takes_the_nominal_time() {
        // κ = 2.5, m = 1, 4 blocks per SM on all 13 SMs: D_alone = 2.5.
        let info = presets::k20c();
        let model = MemModel::with_ratio(&info, 2.5);
        let k = KernelMem::new(1.0, 10_000, 4, &info, &model);
        assert!((k.demand_per_block - 2.5 / 52.0).abs() < 1e-12);
        assert!((k.alone_factor - 2.5).abs() < 1e-12);
        assert_eq!(k.block_time(1_000, 2.5), 1_000);
        // Below saturation the memory part runs at the SM's own rate: 1000 / 2.5.
        assert_eq!(k.block_time(1_000, 0.5), 400);
        // Twice the alone demand: twice the time.
        assert_eq!(k.block_time(1_000, 5.0), 2_000);
    }
}

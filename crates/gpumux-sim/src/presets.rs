//! Device presets. Numbers are the vendors' published limits; where a paper
//! fixes them (Tanasic Table 2 for the K20c) the paper's numbers win.

use crate::memory::MemModel;
use gpumux_engine::kernel::{DeviceInfo, SmLimits};

const KB: u32 = 1024;
const GB: f64 = 1e9;

/// The simulated GPU of Tanasic et al. Table 2 (NVIDIA Kepler K20c): 13 SMs,
/// 2048 threads, 16 blocks and 64K registers per SM, 48 KB shared memory
/// (the configuration the table's resource percentages and save times are
/// computed with), 208 GB/s. PCIe 2.0 x16 at a measured-typical 6 GB/s.
pub fn k20c() -> DeviceInfo {
    DeviceInfo {
        name: "sim:k20c".into(),
        num_sms: 13,
        sm: SmLimits { max_threads: 2048, max_blocks: 16, registers: 65536, smem_bytes: 48 * KB },
        mem_bandwidth: 208.0 * GB,
        pcie_bandwidth: 6.0 * GB,
        pcie_latency_ns: 10_000,
        mem_bytes: 5 << 30,
    }
}

/// NVIDIA H100 SXM5 80 GB: 132 SMs, 2048 threads, 32 blocks, 64K registers
/// and 228 KB shared memory per SM, 3.35 TB/s HBM3, PCIe 5.0 x16 (~55 GB/s
/// achievable per direction).
pub fn h100() -> DeviceInfo {
    DeviceInfo {
        name: "sim:h100".into(),
        num_sms: 132,
        sm: SmLimits { max_threads: 2048, max_blocks: 32, registers: 65536, smem_bytes: 228 * KB },
        mem_bandwidth: 3350.0 * GB,
        pcie_bandwidth: 55.0 * GB,
        pcie_latency_ns: 5_000,
        mem_bytes: 80 << 30,
    }
}

/// NVIDIA H200 SXM 141 GB: the H100's SMs with 4.8 TB/s HBM3e.
pub fn h200() -> DeviceInfo {
    DeviceInfo { name: "sim:h200".into(), mem_bandwidth: 4800.0 * GB, mem_bytes: 141 << 30, ..h100() }
}

/// H100 per-SM memory ceiling: κ = 2.5, i.e. 2.5 × 3.35 TB/s / 132 = 63.4 GB/s
/// per SM, so a streaming kernel saturates HBM with 53 of the 132 SMs.
/// Source: our own H100 measurement (docs/history/benchmarks.md, "gpumux-cuda: preemptible workers on a real H100",
/// 2026-11-22): the memory-bound triad took 10.64 ms on all 132 SMs, 17.32 ms
/// on 33 and 33.86 ms on 16 (next to a compute-bound sgemm). Below saturation
/// time ∝ 1 / (SMs × per-SM rate), so the per-SM rate is
/// 10.64 / (16 × 33.86) = 1/50.9 and 10.64 / (33 × 17.32) = 1/53.7 of the
/// achieved whole-device bandwidth: κ = 132/50.9 = 2.59 and 132/53.7 = 2.46.
pub fn h100_memory() -> MemModel {
    MemModel::with_ratio(&h100(), 2.5)
}

/// H200: the H100's SMs (same per-SM ceiling in bytes/s: an SM's memory-level
/// parallelism, and HBM3e's latency is HBM3's to first order) with 4.8 TB/s,
/// so κ = 63.4 GB/s × 132 / 4.8 TB/s = 1.74. Derived, not measured.
pub fn h200_memory() -> MemModel {
    MemModel { sm_bandwidth: h100_memory().sm_bandwidth, calibration_sms: None }
}

/// K20c: no per-SM bandwidth measurement of our own or in Tanasic et al.;
/// we assume the H100's ratio κ = 2.5 (a streaming kernel saturates the 208
/// GB/s with 5-6 of 13 SMs). An assumption: docs/simulator.md says what
/// depends on it.
pub fn k20c_memory() -> MemModel {
    MemModel::with_ratio(&k20c(), DEFAULT_SATURATION_RATIO)
}

/// κ for devices with no measurement of their own: the H100's measured ratio
/// (see [`h100_memory`]), rounded.
pub const DEFAULT_SATURATION_RATIO: f64 = 2.5;

/// The memory model the simulator gives `info`: its preset's ([`memory`]),
/// else κ = [`DEFAULT_SATURATION_RATIO`].
pub fn memory_model(info: &DeviceInfo) -> MemModel {
    memory(info).unwrap_or_else(|| MemModel::with_ratio(info, DEFAULT_SATURATION_RATIO))
}

/// The memory model of a preset, by the device's name (with or without `sim:`).
pub fn memory(info: &DeviceInfo) -> Option<MemModel> {
    match info.name.strip_prefix("sim:").unwrap_or(&info.name) {
        "k20c" => Some(k20c_memory()),
        "h100" => Some(h100_memory()),
        "h200" => Some(h200_memory()),
        _ => None,
    }
}

/// The presets [`by_name`] knows, as `--device sim:NAME` takes them (listed by `gpumux devices`).
pub const NAMES: &[&str] = &["k20c", "h100", "h200"];

/// A preset by name (`k20c`, `h100`, `h200`), with or without `sim:`.
pub fn by_name(name: &str) -> Option<DeviceInfo> {
    match name.strip_prefix("sim:").unwrap_or(name) {
        "k20c" => Some(k20c()),
        "h100" => Some(h100()),
        "h200" => Some(h200()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_matches_the_preset() {
        let info = h100();
        let r = memory_model(&info).saturation_ratio(&info);
        assert!((r - 2.5).abs() < 1e-9, "{r}");
        let h200 = h200();
        let r200 = memory_model(&h200).saturation_ratio(&h200);
        // Same SMs, same per-SM ceiling, 4.8 / 3.35 times the DRAM bandwidth.
        assert!((r200 - 2.5 * 3350.0 / 4800.0).abs() < 1e-9, "{r200}");
    }

    #[test]
    fn other_devices_get_the_default_ratio() {
        let other = DeviceInfo { name: "sim:custom".into(), ..k20c() };
        assert_eq!(memory(&other), None);
        let r = memory_model(&other).saturation_ratio(&other);
        assert!((r - DEFAULT_SATURATION_RATIO).abs() < 1e-9, "{r}");
    }
}

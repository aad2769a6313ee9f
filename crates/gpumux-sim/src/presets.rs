//! Device presets. Numbers are the vendors' published limits; where a paper
//! fixes them (Tanasic Table 2 for the K20c) the paper's numbers win.

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

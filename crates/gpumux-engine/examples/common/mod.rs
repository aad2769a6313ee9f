//! What the engine's cost examples share: a device shaped like an H100 (the
//! simulator's preset lives in `gpumux-sim`, which depends on this crate).

use gpumux_engine::kernel::{DeviceInfo, SmLimits};

/// 132 SMs of 2,048 threads, 32 blocks, 64 Ki registers and 228 KiB of shared memory each.
pub fn h100_like() -> DeviceInfo {
    DeviceInfo {
        name: "h100-like".into(),
        num_sms: 132,
        sm: SmLimits { max_threads: 2048, max_blocks: 32, registers: 65536, smem_bytes: 228 * 1024 },
        mem_bandwidth: 3e12,
        pcie_bandwidth: 5e10,
        pcie_latency_ns: 1_000,
        mem_bytes: 80 << 30,
    }
}

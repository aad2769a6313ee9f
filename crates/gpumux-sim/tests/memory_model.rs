//! The memory model worked by hand (`src/memory.rs`), driving the simulator
//! directly with launches on chosen SM sets.
//!
//! Device: 8 SMs, 1 block per SM, κ = 2 (an SM can draw 2 × B / 8 = B / 4,
//! so four SMs of a fully memory-bound kernel saturate DRAM). Kernels of 32
//! blocks whose block takes 1 µs alone on all 8 SMs. For a kernel with
//! m = 1 a resident block demands 1/4 of B; alone on 8 SMs D = 2, which is
//! already in the 1 µs (f(D_alone) = 2). A block's time is
//! 1 µs × max(1, D) / 2.

use gpumux_engine::device::{Command, Device, Event};
use gpumux_engine::ids::{KernelId, LaunchId, OpId, ProcessId};
use gpumux_engine::kernel::{DeviceInfo, KernelDesc, KernelShape, SimTiming, SmLimits};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use gpumux_sim::memory::MemModel;
use gpumux_sim::{MemStats, SimGpu};
use std::collections::HashMap;
use std::sync::Arc;

fn device() -> DeviceInfo {
    DeviceInfo {
        name: "test-8".into(),
        num_sms: 8,
        sm: SmLimits { max_threads: 2048, max_blocks: 16, registers: 65536, smem_bytes: 48 * 1024 },
        mem_bandwidth: 100e9,
        pcie_bandwidth: 6e9,
        pcie_latency_ns: 10_000,
        mem_bytes: 1 << 30,
    }
}

fn kernel(name: &str, mem_intensity: f64) -> Arc<KernelDesc> {
    Arc::new(
        KernelDesc::new(name, KernelShape::new(32, 256, 16).with_max_blocks_per_sm(1))
            .with_sim_timing(SimTiming::new(1_000).with_mem_intensity(mem_intensity)),
    )
}

/// Launches each kernel on its SM range at time 0; returns when each ended.
fn run(launches: &[(Arc<KernelDesc>, u16, u16)]) -> Vec<Nanos> {
    run_stats(launches).0
}

fn run_stats(launches: &[(Arc<KernelDesc>, u16, u16)]) -> (Vec<Nanos>, MemStats) {
    let info = device();
    let mut gpu = SimGpu::new(info.clone(), 1).with_memory(MemModel::with_ratio(&info, 2.0));
    for (i, (desc, a, b)) in launches.iter().enumerate() {
        let cmd = Command::Launch {
            launch: LaunchId(i as u64),
            kernel: KernelId(i as u64),
            op: OpId(i as u64),
            process: ProcessId(i as u32),
            priority: 0,
            desc: Arc::clone(desc),
            time_key: i as u64,
            blocks: BlockRanges::full(desc.shape.blocks),
            restore: Vec::new(),
            sms: SmSet::range(*a, *b),
        };
        gpu.submit(0, cmd).expect("launch");
    }
    let mut ended: HashMap<u64, Nanos> = HashMap::new();
    let mut events = Vec::new();
    while ended.len() < launches.len() {
        events.clear();
        let now = gpu.advance(None, &mut events).expect("advance");
        for e in &events {
            if let Event::LaunchEnded { launch, .. } = e {
                ended.insert(launch.0, now);
            }
        }
    }
    ((0..launches.len() as u64).map(|i| ended[&i]).collect(), gpu.mem_stats())
}

#[test]
fn the_model_has_the_ratio_it_was_given() {
    let info = device();
    let m = MemModel::with_ratio(&info, 2.0);
    assert!((m.sm_bandwidth - 25e9).abs() < 1.0);
    assert!((m.saturation_ratio(&info) - 2.0).abs() < 1e-12);
}

#[test]
fn alone_on_every_sm_a_block_takes_its_nominal_time() {
    // 32 blocks, 8 at a time, 1 µs each: 4 µs.
    assert_eq!(run(&[(kernel("mem", 1.0), 0, 8)]), vec![4_000]);
}

#[test]
fn memory_bound_kernel_saturates_with_half_the_sms_and_gets_no_faster() {
    // j SMs: D = j/4, block = 1 µs × max(1, j/4) / 2, 32/j waves.
    // 1 SM: 500 ns × 32 = 16 µs; 2: × 16 = 8 µs; 4: D = 1, 500 ns × 8 = 4 µs;
    // 8: D = 2, 1 µs × 4 = 4 µs. Saturated at 4 SMs; 8 are no faster.
    let t: Vec<Nanos> = [1u16, 2, 4, 8].iter().map(|&j| run(&[(kernel("mem", 1.0), 0, j)])[0]).collect();
    assert_eq!(t, vec![16_000, 8_000, 4_000, 4_000]);
}

#[test]
fn two_memory_bound_kernels_on_disjoint_sms_each_get_half_the_bandwidth() {
    // Alone on SMs 0-3 the kernel saturates DRAM: 4 µs (above). Next to the
    // same kernel on SMs 4-7: D = 2, blocks take 1 µs, 8 waves: 8 µs each,
    // i.e. each moves its bytes at half the device's bandwidth.
    let (both, stats) = run_stats(&[(kernel("a", 1.0), 0, 4), (kernel("b", 1.0), 4, 8)]);
    assert_eq!(both, vec![8_000, 8_000]);
    // DRAM saturated (D = 2) for all 8 µs; blocks took their alone time.
    assert_eq!(stats.saturated_ns, 8_000.0);
    assert_eq!(stats.busy_ns, 8_000.0);
    assert_eq!(stats.issued_ns, stats.alone_ns);
    // Alone on SMs 0-3: D = 1, not saturated, blocks at half their alone time.
    let (_, alone) = run_stats(&[(kernel("a", 1.0), 0, 4)]);
    assert_eq!(alone.saturated_ns, 0.0);
    assert_eq!(alone.busy_ns, 4_000.0);
    assert_eq!(alone.issued_ns * 2.0, alone.alone_ns);
}

#[test]
fn compute_bound_kernel_is_unaffected_and_does_not_slow_a_memory_bound_one() {
    // m = 0 on SMs 4-7: 32 blocks of 1 µs, 8 waves = 8 µs, with or without
    // the memory-bound neighbour; it adds no demand, so the neighbour on
    // SMs 0-3 sees D = 1 and keeps its 4 µs.
    assert_eq!(run(&[(kernel("alu", 0.0), 4, 8)]), vec![8_000]);
    assert_eq!(run(&[(kernel("mem", 1.0), 0, 4), (kernel("alu", 0.0), 4, 8)]), vec![4_000, 8_000]);
}

#[test]
fn half_memory_bound_kernel_stretches_only_its_memory_part() {
    // m = 0.5: a block demands B/8; alone on 8 SMs D = 1, f(D_alone) = 1.
    // Next to the fully memory-bound kernel, both on 4 SMs:
    // D = 4 × 1/4 + 4 × 1/8 = 1.5.
    // Fully bound block: 1 µs × 1.5 / 2 = 750 ns, 8 waves = 6 µs.
    // Half-bound block: 1 µs × (0.5 + 0.5 × 1.5) / 1 = 1.25 µs while its
    // neighbour runs: waves start at 0, 1.25, 2.5, 3.75 and 5 µs (the last
    // ends at 6.25 µs). Blocks started after 6 µs see D = 0.5 and take 1 µs:
    // the 3 waves left end at 7.25, 8.25, 9.25 µs. (Demand is sampled when
    // a block starts, so the 5-µs wave keeps its stretched time.)
    assert_eq!(run(&[(kernel("mem", 1.0), 0, 4), (kernel("half", 0.5), 4, 8)]), vec![6_000, 9_250]);
}

//! Tanasic et al. Table 1, "Save Time": the time to context-switch one SM
//! full of a kernel's blocks at the SM's share of the K20c's bandwidth. We
//! preempt each of the 24 kernels on the simulated K20c with PPQ + context
//! switch and compare the preemption latency the engine measures with the
//! table. The table rounds to 0.01 µs; we match within 0.5%.

use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumux_engine::{driver, policies, Replay};
use gpumux_sim::{presets, SimGpu};
use std::sync::Arc;

/// (kernel, registers per block, shared memory per block, blocks per SM, save time µs) from Table 1.
const TABLE1: &[(&str, u32, u32, u32, f64)] = &[
    ("StreamCollide", 4320, 0, 15, 16.20),
    ("final", 19456, 0, 3, 14.59),
    ("prescan", 9216, 4096, 4, 10.24),
    ("intermediates", 8964, 0, 4, 8.96),
    ("main", 16896, 24576, 1, 5.76),
    ("genhists", 7680, 13312, 1, 2.75),
    ("spmvjds", 928, 0, 16, 3.71),
    ("ComputeQ", 5376, 0, 8, 10.75),
    ("ComputePhiMag", 6144, 0, 4, 6.14),
    ("largersadcalc8", 3328, 0, 16, 13.31),
    ("largersadcalc16", 832, 0, 16, 3.33),
    ("mbsadcalc", 2135, 2224, 7, 4.71),
    ("mysgemmNT", 4480, 512, 14, 16.13),
    ("block2Dregtiling", 41984, 0, 1, 10.50),
    ("lattice6overlap", 3328, 4116, 3, 3.27),
    ("binning", 4096, 0, 4, 4.10),
    ("scaninter1", 1173, 665, 16, 5.36),
    ("scanL1", 9216, 4368, 3, 7.73),
    ("uniformAdd", 4096, 16, 4, 4.10),
    ("reorder", 8192, 0, 4, 8.19),
    ("splitSort", 10240, 4484, 3, 8.52),
    ("griddingGPU", 3648, 1536, 10, 10.08),
    ("splitRearrange", 5888, 4160, 3, 5.20),
    ("scaninter2", 1173, 665, 16, 5.36),
];

fn kernel(name: &str, regs_per_block: u32, smem: u32, bps: u32, blocks: u64, t_ns: u64) -> Arc<KernelDesc> {
    // One "thread" carrying the block's registers: Table 1 gives registers per block only.
    let shape = KernelShape::new(blocks, 1, regs_per_block).with_smem_per_block(smem).with_max_blocks_per_sm(bps);
    Arc::new(KernelDesc::new(name, shape).with_sim_timing(SimTiming::new(t_ns)))
}

#[test]
fn context_save_times_match_tanasic_table1() {
    let gpu = presets::k20c();
    for &(name, regs, smem, bps, save_us) in TABLE1 {
        // A long low-priority kernel fills every SM; a high-priority one arrives at 50 µs.
        let low = ProcessSpec {
            name: "low".into(),
            priority: 0,
            weight: 1.0,
            arrival_ns: 0,
            repetitions: 1,
            async_depth: 0,
            ops: vec![Op::Kernel(kernel(name, regs, smem, bps, bps as u64 * 13 * 4, 1_000_000))],
        };
        let high = ProcessSpec {
            name: "high".into(),
            priority: 1,
            arrival_ns: 50_000,
            ops: vec![Op::Kernel(kernel("hp", 256, 0, 1, 13, 10_000))],
            ..low.clone()
        };
        let w = Workload { name: name.into(), processes: vec![low, high], replay_min_runs: None };
        let policy = policies::by_name("ppq-excl-cs").expect("policy");
        let mut engine = Replay::new(&w, gpu.clone(), policy, None).expect("engine");
        let mut dev = SimGpu::new(gpu.clone(), 1);
        let out = driver::run(&mut engine, &mut dev, &mut driver::NoHooks).expect("run");
        let lat = &out.record.preemptions;
        assert_eq!(lat.len(), 13, "{name}: every SM preempted once");
        let measured_us = lat.iter().map(|p| p.latency_ns).max().unwrap_or(0) as f64 / 1000.0;
        let err = (measured_us - save_us).abs() / save_us;
        assert!(
            err < 0.005,
            "{name}: save time {measured_us:.3} µs, Table 1 says {save_us} µs ({:.2}% off)",
            err * 100.0
        );
    }
}

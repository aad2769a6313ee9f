//! A synthetic workload for measuring the simulator itself (`gpumux bench sim`
//! and `cargo bench -p gpumux-sim`): P processes, each running two kernels of
//! different shapes so SMs mix them, with priorities alternating.

use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use std::sync::Arc;

/// `processes` processes sharing about `blocks_total` blocks, arriving 10 µs apart.
pub fn workload(processes: usize, blocks_total: u64) -> Workload {
    let per = (blocks_total / processes as u64).max(1);
    let procs = (0..processes)
        .map(|p| ProcessSpec {
            name: format!("p{p}"),
            priority: (p % 2) as i32,
            weight: 1.0,
            arrival_ns: p as u64 * 10_000,
            repetitions: 1,
            async_depth: 0,
            // Two kernels with different shapes, so SMs mix them.
            ops: vec![
                Op::Kernel(Arc::new(
                    KernelDesc::new(format!("k{p}a"), KernelShape::new(per / 2, 256, 32).with_smem_per_block(8192))
                        .with_sim_timing(SimTiming::new(5_000).with_spread(0.2).with_mem_intensity(0.5)),
                )),
                Op::Kernel(Arc::new(
                    KernelDesc::new(format!("k{p}b"), KernelShape::new(per - per / 2, 128, 64))
                        .with_sim_timing(SimTiming::new(20_000).with_spread(0.1).with_mem_intensity(0.1)),
                )),
            ],
        })
        .collect();
    Workload { name: format!("bench-{processes}p-{blocks_total}b"), processes: procs, replay_min_runs: None }
}

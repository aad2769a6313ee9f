//! A synthetic workload for measuring the simulator itself (`gpumux bench sim`
//! and `cargo bench -p gpumux-sim`): P processes, each running two kernels of
//! different shapes so SMs mix them, with priorities alternating.

use gpumux_engine::kernel::KernelDesc;
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use std::sync::Arc;

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
                Op::Kernel(Arc::new(KernelDesc {
                    name: format!("k{p}a"),
                    blocks: per / 2,
                    threads_per_block: 256,
                    regs_per_thread: 32,
                    smem_per_block: 8192,
                    block_time_ns: 5_000,
                    block_time_spread: 0.2,
                    mem_intensity: 0.5,
                    idempotent: true,
                    max_blocks_per_sm: None,
                    suite: None,
                })),
                Op::Kernel(Arc::new(KernelDesc {
                    name: format!("k{p}b"),
                    blocks: per - per / 2,
                    threads_per_block: 128,
                    regs_per_thread: 64,
                    smem_per_block: 0,
                    block_time_ns: 20_000,
                    block_time_spread: 0.1,
                    mem_intensity: 0.1,
                    idempotent: true,
                    max_blocks_per_sm: None,
                    suite: None,
                })),
            ],
        })
        .collect();
    Workload { name: format!("bench-{processes}p-{blocks_total}b"), processes: procs, replay_min_runs: None }
}

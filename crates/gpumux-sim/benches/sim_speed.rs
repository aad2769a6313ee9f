//! Criterion benchmark of the simulator: one engine + SimGpu run of a
//! synthetic workload, reported as simulated blocks per second of wall time.
//! The wider sweep (SMs, processes, blocks, every policy) is `gpumux bench sim`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumux_engine::kernel::KernelDesc;
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumux_engine::{driver, policies, Engine};
use gpumux_sim::{presets, SimGpu};
use std::sync::Arc;

fn workload(procs: usize, blocks: u64) -> Workload {
    let processes = (0..procs)
        .map(|p| ProcessSpec {
            name: format!("p{p}"),
            priority: (p % 2) as i32,
            weight: 1.0,
            arrival_ns: 0,
            repetitions: 1,
            async_depth: 0,
            ops: vec![Op::Kernel(Arc::new(KernelDesc {
                name: format!("k{p}"),
                blocks: blocks / procs as u64,
                threads_per_block: 256,
                regs_per_thread: 32,
                smem_per_block: 4096,
                block_time_ns: 5_000,
                block_time_spread: 0.2,
                mem_intensity: 0.5,
                idempotent: true,
                max_blocks_per_sm: None,
                suite: None,
            }))],
        })
        .collect();
    Workload { name: "bench".into(), processes, replay_min_runs: None }
}

fn bench(c: &mut Criterion) {
    let blocks = 200_000u64;
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Elements(blocks));
    g.sample_size(20);
    for policy in ["fcfs", "ppq-excl-cs", "dss-cs"] {
        g.bench_function(format!("h100/4procs/{policy}"), |b| {
            let w = workload(4, blocks);
            b.iter(|| {
                let info = presets::h100();
                let mut e =
                    Engine::new(&w, info.clone(), policies::by_name(policy).expect("policy"), None).expect("engine");
                let mut gpu = SimGpu::new(info, 1);
                driver::run(&mut e, &mut gpu, &mut |_| {}).expect("run")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

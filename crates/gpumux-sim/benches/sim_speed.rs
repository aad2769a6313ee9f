//! Criterion benchmark of the simulator: one engine + SimGpu run of the
//! synthetic workload of `gpumux bench sim`, reported as simulated blocks per second of wall time.
//! The wider sweep (SMs, processes, blocks, every policy) is `gpumux bench sim`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumux_engine::{driver, policies, Replay};
use gpumux_sim::{presets, SimGpu};

fn bench(c: &mut Criterion) {
    let blocks = 200_000u64;
    let mut g = c.benchmark_group("sim");
    g.throughput(Throughput::Elements(blocks));
    g.sample_size(20);
    for policy in ["fcfs", "ppq-excl-cs", "dss-cs"] {
        g.bench_function(format!("h100/4procs/{policy}"), |b| {
            let w = gpumux_sim::synthetic::workload(4, blocks);
            b.iter(|| {
                let info = presets::h100();
                let mut e =
                    Replay::new(&w, info.clone(), policies::by_name(policy).expect("policy"), None).expect("engine");
                let mut gpu = SimGpu::new(info, 1);
                driver::run(&mut e, &mut gpu, &mut driver::NoHooks).expect("run")
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

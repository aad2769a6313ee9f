//! Criterion benchmarks: one schedulability analysis and each assignment method on sets of
//! 5, 10 and 20 tasks (same sets as `gpumux rt bench`). `cargo bench -p gpumux-rt`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use gpumux_rt::analysis::Analyzer;
use gpumux_rt::assign::{assign_with, Method};
use gpumux_rt::bench::bench_sets;
use gpumux_rt::generate::GenConfig;
use gpumux_rt::model::Mode;

fn methods(c: &mut Criterion) {
    let gen = GenConfig::default();
    for n in [5usize, 10, 20] {
        let sets = bench_sets(n, 50, 1, &gen);
        let mut g = c.benchmark_group(format!("n{n}"));
        g.sample_size(10);
        g.throughput(Throughput::Elements(sets.len() as u64));
        g.bench_function("analysis", |b| {
            let mut an = Analyzer::new();
            b.iter(|| sets.iter().filter(|s| an.schedulable(s, &vec![Mode::Single; s.len()])).count())
        });
        for m in Method::ALL {
            g.bench_with_input(BenchmarkId::new("assign", m.name()), &m, |b, &m| {
                let mut an = Analyzer::new();
                b.iter(|| sets.iter().filter(|s| assign_with(s, m, &mut an).schedulable).count())
            });
        }
        g.finish();
    }
}

criterion_group!(benches, methods);
criterion_main!(benches);

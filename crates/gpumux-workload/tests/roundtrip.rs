//! Property tests: valid workloads survive TOML and back; no input panics the parser.

use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming, SuiteKernelRef};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumux_workload::{parse_str, to_toml};
use proptest::prelude::*;
use std::sync::Arc;

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9_ .#-]{0,8}"
}

/// A suite app: no '.', and no kernel part (`APP.KERNEL` names have rules of
/// their own, and one process's kernels of an app must agree on params: tested
/// in errors.rs and suite_kernels.rs).
fn suite_name() -> impl Strategy<Value = String> {
    "[A-Za-z][A-Za-z0-9_ #-]{0,8}"
}

fn kernel() -> impl Strategy<Value = KernelDesc> {
    (
        (name(), 1u64..=(1u64 << 40), 1u32..=1024, 1u32..=255, 0u32..=(1 << 20)),
        (1u64..=1_000_000_000_000, 0.0f64..1.0, 0.0f64..=1.0, any::<bool>(), proptest::option::of(1u32..=64)),
        proptest::option::of((suite_name(), proptest::collection::btree_map("[a-z]{1,4}", -1e12f64..1e12, 0..3))),
    )
        .prop_map(|((name, blocks, threads, regs, smem), (t, spread, mem, idem, maxb), suite)| KernelDesc {
            name,
            shape: KernelShape {
                blocks,
                threads_per_block: threads,
                regs_per_thread: regs,
                smem_per_block: smem,
                max_blocks_per_sm: maxb,
            },
            idempotent: idem,
            sim_timing: Some(SimTiming { block_time_ns: t, block_time_spread: spread, mem_intensity: mem }),
            suite: suite.map(|(app, params)| SuiteKernelRef { app, kernel: None, params }),
        })
}

fn op(kernels: Vec<Arc<KernelDesc>>) -> impl Strategy<Value = Op> {
    let n = kernels.len();
    prop_oneof![
        (1u64..=(1u64 << 50)).prop_map(|bytes| Op::CopyToDevice { bytes }),
        (1u64..=(1u64 << 50)).prop_map(|bytes| Op::CopyToHost { bytes }),
        (0u64..=1_000_000_000_000_000).prop_map(|ns| Op::Cpu { ns }),
        Just(Op::Sync),
        "[a-c]".prop_map(|event| Op::Record { event }),
        "[a-c]".prop_map(|event| Op::WaitEvent { event }),
        (0..n).prop_map(move |i| Op::Kernel(kernels[i].clone())),
    ]
}

fn workload() -> impl Strategy<Value = Workload> {
    proptest::collection::vec(kernel(), 1..4).prop_flat_map(|ks| {
        let ks: Vec<Arc<KernelDesc>> = ks.into_iter().map(Arc::new).collect();
        let process =
            (
                name(),
                any::<i32>(),
                (1e-6f64..=1e6),
                0u64..=1_000_000_000_000_000,
                1u32..=1000,
                0u32..=64,
                proptest::collection::vec(op(ks.clone()), 1..12),
            )
                .prop_map(|(name, priority, weight, arrival_ns, repetitions, async_depth, ops)| {
                    ProcessSpec { name, priority, weight, arrival_ns, repetitions, async_depth, ops }
                });
        (name(), proptest::option::of(1u32..=100), proptest::collection::vec(process, 1..5)).prop_map(
            |(name, replay_min_runs, mut processes)| {
                for (i, p) in processes.iter_mut().enumerate() {
                    p.name = format!("{}{i}", p.name);
                }
                // Every event waited for is recorded somewhere (else the file is refused).
                for event in ["a", "b", "c"] {
                    processes[0].ops.push(Op::Record { event: event.into() });
                }
                Workload { name, processes, replay_min_runs }
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn toml_roundtrip(w in workload()) {
        let text = to_toml(&w);
        let back = parse_str(&text, "prop.toml");
        prop_assert!(back.is_ok(), "{}\n---\n{}", back.unwrap_err(), text);
        prop_assert_eq!(back.unwrap(), w);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = parse_str(&text, "fuzz.toml");
    }

    #[test]
    fn random_tomlish_never_panics(text in "(\\[\\[process(\\.op)?\\]\\]\n|[a-z_]{1,16} = (-?[0-9]{1,20}(\\.[0-9]+)?|\"[a-z]{0,5}\"|\\[[0-9, ]{0,12}\\]|true|nan|inf)\n){0,20}") {
        let _ = parse_str(&text, "fuzz.toml");
    }

    #[test]
    fn random_specs_never_panic(spec in "parboil-k20c(:[a-z]{1,5}=[-0-9a-z]{0,22}(,[a-z]{1,5}=[-0-9a-z]{0,22}){0,3})?") {
        let _ = gpumux_workload::resolve(&spec);
    }
}

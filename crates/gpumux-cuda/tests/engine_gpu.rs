//! On a machine with a GPU: the engine drives the CUDA device under a
//! non-preemptive, a spatial-preemptive and a time-slicing policy; every run
//! completes and its outputs match a native launch (and the CPU reference).
//! Elsewhere the test prints why it skipped.

use gpumux_cuda::CudaDevice;
use gpumux_engine::device::Device;
use gpumux_engine::kernel::{KernelDesc, SuiteKernelRef};
use gpumux_engine::{driver, policies, Engine, Op, ProcessSpec, Workload};
use std::collections::BTreeMap;
use std::sync::Arc;

fn kernel(name: &str, suite: &str, n: f64, blocks: u64, idempotent: bool) -> Arc<KernelDesc> {
    Arc::new(KernelDesc {
        name: name.into(),
        blocks,
        threads_per_block: 256,
        regs_per_thread: 32,
        smem_per_block: 1024,
        block_time_ns: 5_000,
        block_time_spread: 0.0,
        mem_intensity: 0.5,
        idempotent,
        max_blocks_per_sm: None,
        suite: Some(SuiteKernelRef {
            name: suite.into(),
            params: BTreeMap::from([("n".to_string(), n)]),
        }),
    })
}

fn process(name: &str, priority: i32, arrival_ns: u64, k: Arc<KernelDesc>, launches: usize) -> ProcessSpec {
    ProcessSpec {
        name: name.into(),
        priority,
        weight: 1.0,
        arrival_ns,
        repetitions: 1,
        async_depth: 0,
        ops: std::iter::once(Op::CopyToDevice { bytes: 1 << 20 })
            .chain((0..launches).map(|_| Op::Kernel(k.clone())))
            .chain(std::iter::once(Op::CopyToHost { bytes: 1 << 16 }))
            .collect(),
    }
}

#[test]
fn engine_runs_suite_kernels_on_the_gpu_with_correct_results() {
    if let Err(e) = gpumux_cuda::cuda_available() {
        eprintln!("SKIPPED engine_runs_suite_kernels_on_the_gpu_with_correct_results: {e}");
        return;
    }
    if !gpumux_cuda::nvrtc::nvrtc_present() {
        eprintln!("SKIPPED engine_runs_suite_kernels_on_the_gpu_with_correct_results: libnvrtc not found");
        return;
    }
    let w = Workload {
        name: "engine-gpu-test".into(),
        processes: vec![
            // Engine grids differ from the suite's (triad: 4096 blocks; sgemm 512: 64 blocks).
            process("triad", 0, 0, kernel("triad", "triad", (1 << 22) as f64, 1000, true), 20),
            process("sgemm", 1, 200_000, kernel("sgemm", "sgemm", 512.0, 64, true), 10),
            process("histo", 0, 100_000, kernel("histo", "histogram", (1 << 24) as f64, 333, false), 10),
        ],
        replay_min_runs: None,
    };
    for policy in ["fcfs", "dss-cs", "rr"] {
        let mut dev = CudaDevice::open(0, 1).expect("open cuda:0");
        let mut engine = Engine::new(&w, dev.info().clone(), policies::by_name(policy).expect("policy"), None)
            .expect("engine");
        let out = driver::run(&mut engine, &mut dev, &mut |_| {}).unwrap_or_else(|e| panic!("{policy}: {e}"));
        assert_eq!(out.record.processes.len(), 3, "{policy}: every process recorded");
        assert_eq!(out.record.kernels_completed, 40, "{policy}: every kernel invocation completed");
        let lines = dev.verify().expect("read outputs back");
        assert_eq!(lines.len(), 3, "{policy}: three kernels prepared: {lines:?}");
        for l in &lines {
            assert!(l.contains(": OK"), "{policy}: {l}");
        }
    }
}

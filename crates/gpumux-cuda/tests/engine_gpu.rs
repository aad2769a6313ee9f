//! On a machine with a GPU: the engine drives the CUDA device under a
//! non-preemptive, a spatial-preemptive and a time-slicing policy; every run
//! completes and its outputs match a native launch (and the CPU reference).
//! Multi-kernel apps (kmeans, stencil, reduction) run as one instance per
//! process; their final outputs match a native run of the same kernel
//! sequence. Elsewhere the tests print why they skipped.

use gpumux_cuda::device::{KernelCheck, Verdict};
use gpumux_cuda::error::Chain;
use gpumux_cuda::CudaDevice;
use gpumux_engine::device::Device;
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming, SuiteKernelRef};
use gpumux_engine::{driver, policies, Op, ProcessSpec, Replay, Workload};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A suite reference as a workload file writes it: `APP` or `APP.KERNEL`.
fn suite_ref(name: &str, params: &[(&str, f64)]) -> SuiteKernelRef {
    let (app, kernel) = match name.split_once('.') {
        Some((a, k)) => (a.to_string(), Some(k.to_string())),
        None => (name.to_string(), None),
    };
    SuiteKernelRef { app, kernel, params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>() }
}

fn kernel(name: &str, suite: &str, n: f64, blocks: u64, idempotent: bool) -> Arc<KernelDesc> {
    kernel_with(name, suite, &[("n", n)], blocks, idempotent)
}

fn kernel_with(name: &str, suite: &str, params: &[(&str, f64)], blocks: u64, idempotent: bool) -> Arc<KernelDesc> {
    // The block time sizes round-robin slices; the CUDA backend itself ignores it.
    Arc::new(
        KernelDesc::new(name, KernelShape::new(blocks, 256, 32).with_smem_per_block(1024))
            .with_sim_timing(SimTiming::new(5_000).with_mem_intensity(0.5))
            .with_idempotent(idempotent)
            .with_suite(suite_ref(suite, params)),
    )
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
        let mut engine =
            Replay::new(&w, dev.info().clone(), policies::by_name(policy).expect("policy"), None).expect("engine");
        let out = driver::run(&mut engine, &mut dev, &mut driver::NoHooks).unwrap_or_else(|e| panic!("{policy}: {e}"));
        assert_eq!(out.record.processes.len(), 3, "{policy}: every process recorded");
        assert_eq!(out.record.kernels_completed, 40, "{policy}: every kernel invocation completed");
        let v = dev.finish().expect("read outputs back");
        // Apps of other tests in this binary (the GPU's state is shared) did not run.
        let ran: Vec<&KernelCheck> = v.ran().collect();
        assert_eq!(ran.len(), 3, "{policy}: three kernels run: {ran:?}");
        for c in &ran {
            assert!(matches!(c.verdict, Verdict::Ok(_)), "{policy}: {c}");
        }
    }
}

/// Skips (with the reason on stderr) where there is no GPU or no NVRTC.
fn gpu_or_skip(test: &str) -> bool {
    if let Err(e) = gpumux_cuda::cuda_available() {
        eprintln!("SKIPPED {test}: {e}");
        return false;
    }
    if !gpumux_cuda::nvrtc::nvrtc_present() {
        eprintln!("SKIPPED {test}: libnvrtc not found");
        return false;
    }
    true
}

fn process_of(name: &str, priority: i32, arrival_ns: u64, ops: Vec<Arc<KernelDesc>>) -> ProcessSpec {
    ProcessSpec {
        name: name.into(),
        priority,
        weight: 1.0,
        arrival_ns,
        repetitions: 1,
        async_depth: 0,
        ops: ops.into_iter().map(Op::Kernel).collect(),
    }
}

#[test]
fn engine_runs_multi_kernel_apps_on_the_gpu_with_correct_results() {
    let test = "engine_runs_multi_kernel_apps_on_the_gpu_with_correct_results";
    if !gpu_or_skip(test) {
        return;
    }
    let km = [("n", 65536.0), ("k", 16.0)];
    let km_small = [("n", 16384.0), ("k", 8.0)];
    // Engine grids differ from the suite's: assign 256 suite blocks, stencil
    // 32 x 32 = 1024, partial 128 (final: 1 block, update: one per cluster).
    let assign = kernel_with("assign", "kmeans.assign", &km, 100, true);
    let update = kernel_with("update", "kmeans.update", &km, 16, true);
    let assign_s = kernel_with("assign-s", "kmeans.assign", &km_small, 64, true);
    let update_s = kernel_with("update-s", "kmeans.update", &km_small, 8, true);
    let step = kernel_with("step", "stencil.step", &[("n", 512.0)], 300, true);
    let partial = kernel_with("partial", "reduction.partial", &[("n", (1 << 20) as f64)], 64, true);
    let fin = kernel_with("final", "reduction.final", &[("n", (1 << 20) as f64)], 1, true);
    let mut kmeans_ops = Vec::new();
    for _ in 0..4 {
        kmeans_ops.push(assign.clone());
        kmeans_ops.push(update.clone());
    }
    kmeans_ops.push(assign.clone());
    let mut small_ops = Vec::new();
    for _ in 0..3 {
        small_ops.push(assign_s.clone());
        small_ops.push(update_s.clone());
    }
    let stencil_ops = vec![step.clone(); 21];
    let reduction_ops: Vec<_> = (0..3).flat_map(|_| [partial.clone(), fin.clone()]).collect();
    let invocations = (kmeans_ops.len() + small_ops.len() + stencil_ops.len() + reduction_ops.len()) as u64;
    let w = Workload {
        name: "engine-gpu-multi".into(),
        processes: vec![
            process_of("kmeans", 0, 0, kmeans_ops),
            // Urgent: preempts the others under the preemptive policies.
            process_of("kmeans-small", 1, 300_000, small_ops),
            process_of("stencil", 0, 100_000, stencil_ops),
            process_of("reduction", 0, 50_000, reduction_ops),
        ],
        replay_min_runs: None,
    };
    gpumux_cuda::device::check_workload(&w).expect("the workload is valid for the device");
    for policy in ["fcfs", "dss-cs", "ppq-excl-cs", "rr"] {
        let mut dev = CudaDevice::open(0, 1).expect("open cuda:0");
        let mut engine =
            Replay::new(&w, dev.info().clone(), policies::by_name(policy).expect("policy"), None).expect("engine");
        let out = driver::run(&mut engine, &mut dev, &mut driver::NoHooks).unwrap_or_else(|e| panic!("{policy}: {e}"));
        assert_eq!(out.record.processes.len(), 4, "{policy}: every process recorded");
        assert_eq!(out.record.kernels_completed, invocations, "{policy}: every kernel invocation completed");
        let v = dev.finish().expect("read outputs back");
        let lines: Vec<String> = v.ran().map(|c| c.to_string()).collect();
        for l in &lines {
            eprintln!("{policy}: {l}");
        }
        assert!(v.passed(), "{policy}: {lines:?}");
        assert_eq!(lines.len(), 4, "{policy}: one instance per process: {lines:?}");
        for want in [
            "kmeans(65536, k=16) of process 0: OK after 9 kernels (assign ×5, update ×4)",
            "kmeans(16384, k=8) of process 1: OK after 6 kernels (assign ×3, update ×3)",
            "stencil(512) of process 2: OK after 21 kernels (21 steps): outputs (b) equal",
            "reduction(1048576) of process 3: OK after 6 kernels (partial ×3, final ×3): outputs (out, partial)",
        ] {
            assert!(lines.iter().any(|l| l.starts_with(want)), "{policy}: no line starts with {want:?}: {lines:?}");
        }
        for l in &lines {
            assert!(l.contains("native = CPU reference"), "{policy}: {l}");
        }
    }
}

#[test]
fn the_device_refuses_a_kernel_order_the_app_cannot_run() {
    let test = "the_device_refuses_a_kernel_order_the_app_cannot_run";
    if !gpu_or_skip(test) {
        return;
    }
    let n = [("n", 4096.0)];
    let cases = [
        (vec![kernel_with("update", "kmeans.update", &n, 16, true)], "cannot run before any `assign`"),
        (vec![kernel_with("final", "reduction.final", &n, 1, true)], "cannot run before any `partial`"),
        (
            vec![
                kernel_with("assign", "kmeans.assign", &n, 16, true),
                kernel_with("u", "kmeans.update", &[("n", 2048.0)], 16, true),
            ],
            "must have the same params",
        ),
        (vec![kernel_with("x", "kmeans.move", &n, 16, true)], "has no kernel `move`"),
        (vec![kernel_with("r", "reduction", &n, 16, true)], "has 2 kernels (partial, final): name one"),
    ];
    for (ops, want) in cases {
        let w = Workload {
            name: "engine-gpu-bad-order".into(),
            processes: vec![process_of("p", 0, 0, ops)],
            replay_min_runs: None,
        };
        let pre = gpumux_cuda::device::check_workload(&w).err().map(|e| Chain(&e).to_string()).unwrap_or_default();
        assert!(pre.contains(want), "check_workload: {pre:?} lacks {want:?}");
        let mut dev = CudaDevice::open(0, 1).expect("open cuda:0");
        let mut engine =
            Replay::new(&w, dev.info().clone(), policies::by_name("fcfs").expect("policy"), None).expect("engine");
        match driver::run(&mut engine, &mut dev, &mut driver::NoHooks) {
            Ok(_) => panic!("the device ran a workload it must refuse ({want})"),
            Err(e) => {
                let e = Chain(&e).to_string();
                assert!(e.contains(want), "{e} lacks {want:?}");
            }
        }
    }
}

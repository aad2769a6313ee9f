//! On a machine with two GPUs: suite kernels split over both give the same
//! bytes as the native kernel on one GPU, with the shadow merge and with
//! declared slices; a kernel whose writes cannot merge is refused; a wrong
//! declaration is caught by its check. Elsewhere each test says why it skipped.

use gpumux_cuda::split::{BlockSlices, Merge, SplitError, SplitGpus, Splittable, SuiteLaunch};
use gpumux_cuda::suite::{self, App, Scale};

/// GPUs 0 and 1 with NVRTC, or why not.
fn two_gpus(test: &str) -> Option<SplitGpus> {
    if let Err(e) = gpumux_cuda::runtime::Gpu::open(1) {
        eprintln!("SKIPPED {test}: needs 2 GPUs ({e})");
        return None;
    }
    if !gpumux_cuda::nvrtc::nvrtc_present() {
        eprintln!("SKIPPED {test}: libnvrtc not found");
        return None;
    }
    Some(SplitGpus::open(&[0, 1]).expect("open GPUs 0 and 1"))
}

/// The slices each block of these suite launches writes (see the kernels).
fn slices(app: App, w: &suite::Workload) -> Option<BlockSlices> {
    let l = &w.launches[0];
    let s = |granule_blocks, bytes_per_granule| Some(BlockSlices { granule_blocks, bytes_per_granule, offset: 0 });
    match app {
        // 256 floats a block.
        App::Triad => s(1, 256 * 4),
        // One float4 per thread, 256 threads a block.
        App::Nbody => s(1, 256 * 16),
        // A row of 64×64 tiles writes 64 whole rows of the n×n output.
        App::Sgemm => s(l.grid[0], 64 * l.grid[0] as u64 * 64 * 4),
        // One matrix of the batch per z: its tiles write that n×n matrix.
        App::Transpose => s(l.grid[0] * l.grid[1], w.size * w.size * 4),
        // One partial sum per block.
        App::Reduction => s(1, 4),
        _ => None,
    }
}

#[test]
fn split_suite_kernels_equal_one_gpu_bitwise() {
    let Some(gpus) = two_gpus("split_suite_kernels_equal_one_gpu_bitwise") else { return };
    eprintln!("links: {:?}", gpus.links());
    for app in
        [App::Triad, App::Transpose, App::Spmv, App::Sgemm, App::Nbody, App::Stencil, App::Reduction, App::Kmeans]
    {
        let w = suite::build(app, Scale::Check, 11);
        let declared = slices(app, &w);
        let l = SuiteLaunch::new(&gpus, w, 0, Splittable::IfChecked).unwrap_or_else(|e| panic!("{}: {e}", app.name()));
        l.run_native().expect("native");
        let want = l.read_outputs().expect("read");
        let mut merges = vec![("shadow", Merge::Shadow)];
        if let Some(s) = declared {
            merges.push(("slices", Merge::Slices { slices: s, verify: true }));
            merges.push(("slices unverified", Merge::Slices { slices: s, verify: false }));
        }
        for (what, m) in merges {
            for n in [1, 2] {
                l.reset().expect("reset");
                let args = l.args(&|_| m).expect("args");
                let (g, b, sm) = (l.launch.grid, l.launch.block, l.launch.shared_bytes);
                let mut p = gpus.prepare(&l.kernel, g, b, sm, args, n).expect("prepare");
                let t = p.run().unwrap_or_else(|e| panic!("{} {what} on {n}: {e}", app.name()));
                let got = l.read_outputs().expect("read");
                assert_eq!(got.len(), want.len());
                for (o, (a, b)) in got.iter().zip(&want).enumerate() {
                    let first = a.iter().zip(b).position(|(x, y)| x != y);
                    assert!(
                        first.is_none(),
                        "{} {what} on {n} GPUs, output {o}: bytes differ from byte {first:?} on",
                        app.name()
                    );
                }
                assert_eq!(t.ranges.iter().map(|r| r.len()).sum::<usize>() as u64, l.launch.blocks());
                eprintln!("{} {what} on {n} GPUs: ranges {:?}, bitwise equal to native", app.name(), t.ranges);
            }
        }
    }
}

#[test]
fn kernels_whose_writes_cannot_merge_are_refused() {
    let Some(gpus) = two_gpus("kernels_whose_writes_cannot_merge_are_refused") else { return };
    for (app, index, want) in [
        (App::Histogram, 0, "atomicAdd on global memory (`hist`)"),
        (App::Reduction, 1, "stores into `out` at [ 0 ]"),
        (App::Bfs, 0, "an index read from memory"),
    ] {
        let w = suite::build(app, Scale::Check, 3);
        match SuiteLaunch::new(&gpus, w, index, Splittable::IfChecked) {
            Err(SplitError::Refused { reasons, .. }) => {
                assert!(reasons.iter().any(|r| r.reason.contains(want)), "{}: {reasons:?}", app.name())
            }
            Err(e) => panic!("{}: refused for another reason: {e}", app.name()),
            Ok(_) => panic!("{}: not refused", app.name()),
        }
    }
}

#[test]
fn a_wrong_declaration_is_caught_by_its_check() {
    let Some(gpus) = two_gpus("a_wrong_declaration_is_caught_by_its_check") else { return };
    let l =
        SuiteLaunch::new(&gpus, suite::build(App::Triad, Scale::Check, 5), 0, Splittable::IfChecked).expect("triad");
    // Half of what each block writes: every block writes past its declared slice.
    let wrong = BlockSlices { granule_blocks: 1, bytes_per_granule: 128 * 4, offset: 0 };
    let args = l.args(&|_| Merge::Slices { slices: wrong, verify: true }).expect("args");
    let (g, b, sm) = (l.launch.grid, l.launch.block, l.launch.shared_bytes);
    let mut p = gpus.prepare(&l.kernel, g, b, sm, args, 2).expect("prepare");
    match p.run() {
        Err(SplitError::WrongDeclaration { arg: 0, words, .. }) => assert!(words > 0),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a wrong declaration passed its check"),
    }
}

#[test]
fn opening_is_an_error_not_a_panic_without_enough_gpus() {
    assert!(SplitGpus::open(&[]).err().is_some_and(|e| e.to_string().contains("no GPU")));
    assert!(SplitGpus::open(&[0, 0]).err().is_some_and(|e| e.to_string().contains("GPU 0 named twice")));
    let seen = gpumux_cuda::runtime::gpu_count();
    let beyond = seen.max(0);
    match SplitGpus::open(&[0, beyond]) {
        Err(e) => assert!(!e.to_string().is_empty()),
        Ok(_) => panic!("GPU {beyond} opened, but the driver sees {seen}"),
    }
}

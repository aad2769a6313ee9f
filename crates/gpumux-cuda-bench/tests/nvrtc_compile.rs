//! When libnvrtc is present, the bench's own kernels (outside the suite)
//! compile for the H100 both as written and as transformed; without it the
//! test says it skipped and why.

use gpumux_cuda::{nvrtc, transform};
use gpumux_cuda_bench::{FMA_SOURCE, STENCIL_SMEM_SOURCE, WAVEFRONT_SOURCE};

#[test]
fn bench_kernels_compile_native_and_transformed() {
    if !nvrtc::nvrtc_present() {
        eprintln!(
            "SKIPPED bench_kernels_compile_native_and_transformed: libnvrtc not found \
             (source .ci/install-nvrtc.sh to install it and set LD_LIBRARY_PATH)"
        );
        return;
    }
    for (name, src) in [("nw_diag", WAVEFRONT_SOURCE), ("stencil_smem", STENCIL_SMEM_SOURCE), ("fma_loop", FMA_SOURCE)]
    {
        nvrtc::compile(name, src, 90, &[]).unwrap_or_else(|e| panic!("native {name}: {e}"));
        let t = transform::transform(src).unwrap_or_else(|e| panic!("transform {name}: {e}"));
        let c = nvrtc::compile(&format!("{name}_gmx"), &t.source, 90, &[])
            .unwrap_or_else(|e| panic!("transformed {name}: {e}"));
        assert!(c.cubin.len() > 64, "{name}: empty cubin");
        for k in &t.kernels {
            // The worker keeps the kernel's exported name.
            let needle = k.name.as_bytes();
            assert!(c.cubin.windows(needle.len()).any(|w| w == needle), "{name}: `{}` missing from the cubin", k.name);
        }
    }
}

#[test]
fn the_split_checks_fma_kernel_passes_the_split_analysis() {
    let a = gpumux_cuda::split::analyse(FMA_SOURCE, "fma_loop").expect("fma_loop found");
    assert!(a.splittable(), "{:?}", a.refusals);
    assert_eq!(a.params.iter().filter(|p| p.written).map(|p| p.name.as_str()).collect::<Vec<_>>(), ["out"]);
}

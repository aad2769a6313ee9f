//! `gpumux bench daemon`'s kernels (src/bench_daemon/kernels.cu) compile with
//! NVRTC for the H100 both as written (what its native rows run) and as
//! gpumuxd's preemptible workers (what its daemon rows run), when libnvrtc is
//! present (`.ci/install-nvrtc.sh`); without it the test says it skipped and
//! why. A GPU would find a kernel that does not compile only after minutes of
//! baselines; the simulated device transforms the source but compiles nothing.

use gpumux_cuda::{nvrtc, transform};

const SOURCE: &str = include_str!("../src/bench_daemon/kernels.cu");

/// Every kernel of the programs experiment, which no other test compiles.
const PROGRAM_KERNELS: [&str; 5] = ["init_hash", "wave_init", "wave_tile", "jacobi_tile", "add_one"];

#[test]
fn the_bench_kernels_compile_native_and_as_workers() {
    let t =
        transform::transform(SOURCE).unwrap_or_else(|e| panic!("the daemon's transformation refuses kernels.cu: {e}"));
    for k in PROGRAM_KERNELS {
        assert!(
            t.kernel(k).is_some_and(|k| k.defined && k.extern_c),
            "`{k}` is not an extern \"C\" kernel of kernels.cu"
        );
    }
    if !nvrtc::nvrtc_present() {
        eprintln!(
            "SKIPPED the_bench_kernels_compile_native_and_as_workers: libnvrtc not found \
             (source .ci/install-nvrtc.sh to install it and set LD_LIBRARY_PATH)"
        );
        return;
    }
    let native = nvrtc::compile("gpumux_bench", SOURCE, 90, &[]).unwrap_or_else(|e| panic!("native: {e}"));
    let workers = nvrtc::compile("gpumux_bench_gmx", &t.source, 90, &[]).unwrap_or_else(|e| panic!("as workers: {e}"));
    for (what, c) in [("native", &native), ("as workers", &workers)] {
        for k in &t.kernels {
            let name = k.name.as_bytes();
            assert!(c.cubin.windows(name.len()).any(|w| w == name), "{what}: `{}` missing from the cubin", k.name);
        }
    }
}

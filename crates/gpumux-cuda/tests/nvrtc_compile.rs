//! When libnvrtc is present, every suite kernel compiles for the H100 both as
//! written and as transformed; without it the test says it skipped and why.

use gpumux_cuda::{nvrtc, suite, transform};

fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc::nvrtc_present() {
        return true;
    }
    eprintln!("SKIPPED {test}: libnvrtc not found (source .ci/install-nvrtc.sh to install it and set LD_LIBRARY_PATH)");
    false
}

#[test]
fn every_suite_kernel_compiles_native_and_transformed() {
    if !nvrtc_or_skip("every_suite_kernel_compiles_native_and_transformed") {
        return;
    }
    let (major, minor) = nvrtc::version().expect("nvrtc version");
    eprintln!("NVRTC {major}.{minor}");
    for (name, src) in suite::all_sources() {
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
fn cache_returns_the_same_module_for_the_same_source() {
    if !nvrtc_or_skip("cache_returns_the_same_module_for_the_same_source") {
        return;
    }
    let src = "extern \"C\" __global__ void k(int* p) { p[blockIdx.x] = 1; }";
    let a = nvrtc::compile("a", src, 90, &[]).expect("compile");
    let b = nvrtc::compile("b", src, 90, &[]).expect("compile");
    assert!(std::sync::Arc::ptr_eq(&a, &b));
    let c = nvrtc::compile("c", src, 80, &[]).expect("compile");
    assert_ne!(a.key, c.key);
}

#[test]
fn tricky_sources_compile_after_transformation() {
    if !nvrtc_or_skip("tricky_sources_compile_after_transformation") {
        return;
    }
    let tricky = [
        // helpers, macros, comments and strings naming blockIdx
        r#"#define BX (blockIdx.x /* blockIdx */)
__device__ unsigned int gx() { return blockIdx.x * blockDim.x + threadIdx.x; }
__device__ const char* s = "gridDim blockIdx";
extern "C" __global__ void k(unsigned int* o) { // blockIdx.y
    o[gx()] = BX + gridDim.x * (s[0] != 0);
}"#,
        // template kernel + extern "C" wrapper through a template device function
        r#"template <typename T, int N> __device__ void put(T* p, T v) { p[blockIdx.x * N + threadIdx.x % N] = v; }
template <typename T> __global__ void tk(T* p, T v) { put<T, 4>(p, v); }
template __global__ void tk<float>(float*, float);
extern "C" __global__ void __launch_bounds__(128, 2) wrap(float* p, float v) { put<float, 4>(p, v); }"#,
        // 3-D grid, dynamic + static shared memory, early return, unnamed parameter
        r#"extern "C" __global__ void k3(float* o, int, unsigned int n) {
    extern __shared__ float dyn[];
    __shared__ float st[32];
    unsigned int i = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    if (i >= n) return;
    dyn[threadIdx.x] = st[threadIdx.x % 32] = (float)i;
    __syncthreads();
    o[i] = dyn[0] + st[0];
}"#,
    ];
    for (i, src) in tricky.iter().enumerate() {
        let t = transform::transform(src).unwrap_or_else(|e| panic!("tricky {i}: {e}"));
        nvrtc::compile(&format!("tricky{i}"), &t.source, 90, &["tk<float>"])
            .or_else(|_| nvrtc::compile(&format!("tricky{i}"), &t.source, 90, &[]))
            .unwrap_or_else(|e| panic!("tricky {i}: {e}\n{}", t.source));
    }
}

#[test]
fn split_merge_kernels_compile() {
    if !nvrtc_or_skip("split_merge_kernels_compile") {
        return;
    }
    use gpumux_cuda::split::merge::{COUNT_OUTSIDE, MERGE_SOURCE, SHADOW_MERGE};
    let c = nvrtc::compile("gmx_split_merge", MERGE_SOURCE, 90, &[]).unwrap_or_else(|e| panic!("merge kernels: {e}"));
    for name in [SHADOW_MERGE, COUNT_OUTSIDE] {
        let needle = name.as_bytes();
        assert!(c.cubin.windows(needle.len()).any(|w| w == needle), "`{name}` missing from the cubin");
    }
}

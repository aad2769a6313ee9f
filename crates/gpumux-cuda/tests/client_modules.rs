//! Clients' modules through the daemon's module path (transform, options,
//! NVRTC, cache) for the example client kernels of `examples/clients/kernels`.
//! Needs libnvrtc (no GPU); without it the tests say they skipped and why.

mod examples;
use examples::example;
use gpumux_cuda::client::module::{add_native, compile, ModuleError};
use gpumux_cuda::nvrtc;

const H100: u32 = 90;

fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc::nvrtc_present() {
        return true;
    }
    eprintln!("SKIPPED {test}: libnvrtc not found (source .ci/install-nvrtc.sh to install it and set LD_LIBRARY_PATH)");
    false
}

#[test]
fn the_example_kernels_become_workers_with_their_parameters() {
    if !nvrtc_or_skip("the_example_kernels_become_workers_with_their_parameters") {
        return;
    }
    for (file, kernel, params) in [
        ("vector_add", "vector_add", 4),
        ("matmul", "matmul", 4),
        ("histogram", "histogram", 3),
        ("stencil", "stencil", 4),
        ("fault", "fault", 1),
    ] {
        let m = compile(file, &example(file), &[], H100).unwrap_or_else(|e| panic!("{file}: {e}"));
        let names: Vec<(&str, &str, usize)> =
            m.kernels.iter().map(|(k, exported, n)| (k.as_str(), exported.as_str(), *n)).collect();
        // extern "C": exported under its own name; the worker keeps it.
        assert_eq!(names, vec![(kernel, kernel, params)], "{file}");
        assert!(m.compiled.cubin.len() > 64, "{file}: empty cubin");
    }
}

#[test]
fn a_module_compiled_natively_too_names_each_kernel_in_both_builds() {
    if !nvrtc_or_skip("a_module_compiled_natively_too_names_each_kernel_in_both_builds") {
        return;
    }
    // One extern "C" kernel and one C++ kernel (a mangled name in each build).
    let src = "extern \"C\" __global__ void add(float* y, const float* x, int n) {\n\
               int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += x[i];\n}\n\
               __global__ void scale(float* y, float a) { y[blockIdx.x] *= a; }\n";
    let mut m = compile("two", src, &[], H100).expect("workers");
    assert!(m.native.is_none(), "natively only when asked");
    add_native(&mut m, "two", src, &[], H100).expect("native");
    let (code, names) = m.native.as_ref().expect("native build");
    assert!(code.cubin.len() > 64 && !std::sync::Arc::ptr_eq(code, &m.compiled));
    assert_eq!(names.len(), m.kernels.len());
    for ((k, worker, _), native) in m.kernels.iter().zip(names) {
        if k == "add" {
            assert_eq!((worker.as_str(), native.as_str()), ("add", "add"), "extern \"C\": the same name in both");
        } else {
            // The worker's signature is longer, so its mangled name differs.
            assert!(native.contains("scale") && worker.contains("scale") && native != worker, "{native} / {worker}");
        }
    }
    // The native build must compile as the client wrote it: a kernel the
    // workers accept but the source alone does not is an error, not a guess.
    let mut broken = compile("two", src, &[], H100).expect("workers");
    assert!(add_native(&mut broken, "two", "this is not CUDA", &[], H100).is_err());
    assert!(broken.native.is_none());
}

#[test]
fn a_second_load_of_the_same_module_is_not_compiled_again() {
    if !nvrtc_or_skip("a_second_load_of_the_same_module_is_not_compiled_again") {
        return;
    }
    let src = example("vector_add");
    let opts = vec!["-DGPUMUX_CACHE_TEST=1".to_string()];
    let first = compile("vector_add", &src, &opts, H100).expect("first compile");
    let again = compile("vector_add", &src, &opts, H100).expect("second compile");
    assert!(!first.cached && again.cached);
    assert!(std::sync::Arc::ptr_eq(&first.compiled, &again.compiled));
    let other = compile("vector_add", &src, &["-DGPUMUX_CACHE_TEST=2".to_string()], H100).expect("other options");
    assert!(!other.cached, "other options are another module");
}

#[test]
fn a_kernel_the_transformation_refuses_names_its_line() {
    // No NVRTC needed: the transformation refuses before compiling.
    let src = "#include <cooperative_groups.h>\nnamespace cg = cooperative_groups;\n\n\
               extern \"C\" __global__ void k(int* p) {\n    p[0] = 1;\n    cg::this_grid().sync();\n}\n";
    match compile("grid_sync", src, &[], H100) {
        Err(ModuleError::Transform(e)) => {
            assert_eq!(e.line(), 6, "{e}");
            assert!(e.to_string().starts_with("line 6: `this_grid` cannot be preempted"), "{e}");
        }
        other => panic!("expected a transformation error, got {other:?}"),
    }
}

#[test]
fn compile_errors_carry_nvrtcs_log_with_the_clients_lines() {
    if !nvrtc_or_skip("compile_errors_carry_nvrtcs_log_with_the_clients_lines") {
        return;
    }
    let src = "extern \"C\" __global__ void k(int* p) {\n    p[0] = undeclared;\n}\n";
    match compile("broken", src, &[], H100) {
        Err(ModuleError::Compile { log }) => {
            assert!(log.contains("broken.cu(2)") && log.contains("undeclared"), "{log}");
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

#[test]
fn options_that_change_the_architecture_are_refused_before_compiling() {
    let e = compile("vector_add", &example("vector_add"), &["--gpu-architecture=sm_80".to_string()], H100);
    assert!(matches!(e, Err(ModuleError::Option { .. })), "{e:?}");
}

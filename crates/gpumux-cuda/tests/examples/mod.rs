//! The example clients' kernels (examples/clients/kernels), shared by the
//! client-module and client-GPU tests.

/// An example client kernel's source (compiled in, so the test binary runs anywhere).
pub fn example(name: &str) -> String {
    let src = match name {
        "vector_add" => include_str!("../../../../examples/clients/kernels/vector_add.cu"),
        "matmul" => include_str!("../../../../examples/clients/kernels/matmul.cu"),
        "histogram" => include_str!("../../../../examples/clients/kernels/histogram.cu"),
        "stencil" => include_str!("../../../../examples/clients/kernels/stencil.cu"),
        "fault" => include_str!("../../../../examples/clients/kernels/fault.cu"),
        other => panic!("no example kernel {other}"),
    };
    src.to_string()
}

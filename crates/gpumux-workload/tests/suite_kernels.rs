//! `suite = { name, kernel, params }`: kernels of multi-kernel CUDA suite apps
//! (kmeans `assign`/`update`, reduction `partial`/`final`, stencil `step`).

use gpumux_engine::model::Op;
use gpumux_workload::{parse_str, to_toml};

const KMEANS: &str = r#"
[kernels.assign]
suite = { name = "kmeans", kernel = "assign", params = { n = 65536, k = 16 } }
grid = 256
block = 256
regs_per_thread = 32
block_time_us = 5.0

[kernels.update]
suite = { name = "kmeans", kernel = "update", params = { n = 65536, k = 16 } }
grid = 16
block = 256
regs_per_thread = 32
block_time_us = 50.0

[[process]]
name = "km"
[[process.op]]
kind = "loop"
times = 3
op = [{ kind = "kernel", kernel = "assign" }, { kind = "kernel", kernel = "update" }]
"#;

fn suite_names(text: &str) -> Vec<String> {
    let w = parse_str(text, "w.toml").unwrap_or_else(|e| panic!("{e}"));
    w.processes[0]
        .ops
        .iter()
        .filter_map(|o| match o {
            Op::Kernel(k) => k.suite.as_ref().map(|s| s.to_string()),
            _ => None,
        })
        .collect()
}

fn err(text: &str) -> String {
    match parse_str(text, "w.toml") {
        Ok(w) => panic!("expected an error, got {w:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn kernel_field_names_the_apps_kernel() {
    let names = suite_names(KMEANS);
    assert_eq!(names.len(), 6);
    assert_eq!(names[0], "kmeans.assign");
    assert_eq!(names[1], "kmeans.update");
    // Read once into its parts: the app and the kernel.
    let w = parse_str(KMEANS, "w.toml").unwrap_or_else(|e| panic!("{e}"));
    let parts: Vec<(&str, Option<&str>)> = w.processes[0]
        .ops
        .iter()
        .filter_map(|o| match o {
            Op::Kernel(k) => k.suite.as_ref().map(|s| (s.app.as_str(), s.kernel.as_deref())),
            _ => None,
        })
        .collect();
    assert_eq!(parts[..2], [("kmeans", Some("assign")), ("kmeans", Some("update"))]);
    // The dotted name means the same.
    let dotted = KMEANS
        .replace(r#"name = "kmeans", kernel = "assign""#, r#"name = "kmeans.assign""#)
        .replace(r#"name = "kmeans", kernel = "update""#, r#"name = "kmeans.update""#);
    assert_eq!(parse_str(&dotted, "w.toml").ok(), parse_str(KMEANS, "w.toml").ok());
}

#[test]
fn kernel_form_roundtrips() {
    let w = parse_str(KMEANS, "w.toml").unwrap_or_else(|e| panic!("{e}"));
    let back = parse_str(&to_toml(&w), "w.toml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, w);
}

#[test]
fn one_instance_per_process_needs_the_same_params() {
    let bad = KMEANS.replacen(
        r#"kernel = "update", params = { n = 65536, k = 16 }"#,
        r#"kernel = "update", params = { n = 4096, k = 16 }"#,
        1,
    );
    let m = err(&bad);
    for part in [
        "w.toml: process \"km\"",
        "suite.params",
        "kernel \"update\" (kmeans.update) has { k = 16, n = 4096 }",
        "kernel \"assign\" (kmeans.assign) has { k = 16, n = 65536 }",
        "share one instance",
    ] {
        assert!(m.contains(part), "{m:?} lacks {part:?}");
    }
    // Two processes are two instances: their params may differ.
    let two = format!(
        "{KMEANS}\n[[process]]\nname = \"other\"\n[[process.op]]\nkind = \"kernel\"\nkernel = \"assign\"\n\
         suite = {{ name = \"kmeans\", kernel = \"assign\", params = {{ n = 1024 }} }}\n"
    );
    assert!(parse_str(&two, "w.toml").is_ok());
    // Apps named without a kernel (single-kernel apps) are not instances.
    let single = r#"
[[process]]
name = "p"
[[process.op]]
kind = "kernel"
name = "a"
grid = 1
block = 1
regs_per_thread = 1
block_time_us = 1
suite = { name = "triad", params = { n = 1 } }
[[process.op]]
kind = "kernel"
name = "b"
grid = 1
block = 1
regs_per_thread = 1
block_time_us = 1
suite = { name = "triad", params = { n = 2 } }
"#;
    assert!(parse_str(single, "w.toml").is_ok());
}

#[test]
fn malformed_kernel_names() {
    let with = |suite: &str| {
        KMEANS.replacen(r#"suite = { name = "kmeans", kernel = "assign", params = { n = 65536, k = 16 } }"#, suite, 1)
    };
    let m = err(&with(r#"suite = { name = "kmeans.assign", kernel = "assign", params = { n = 65536, k = 16 } }"#));
    assert!(m.contains("suite.kernel is given twice"), "{m}");
    let m = err(&with(r#"suite = { name = "kmeans", kernel = "a.b", params = { n = 65536, k = 16 } }"#));
    assert!(m.contains("suite.kernel must not contain '.'"), "{m}");
    let m = err(&with(r#"suite = { name = "kmeans", kernel = "", params = { n = 65536, k = 16 } }"#));
    assert!(m.contains("suite.kernel must not be empty"), "{m}");
    for bad in ["kmeans.", ".assign", "a.b.c"] {
        let m = err(&with(&format!(r#"suite = {{ name = "{bad}", params = {{ n = 65536, k = 16 }} }}"#)));
        assert!(m.contains("suite.name must be APP or APP.KERNEL"), "{bad}: {m}");
    }
    let m = err(&with(r#"suite = { name = "kmeans", kernal = "assign", params = { n = 65536, k = 16 } }"#));
    assert!(m.contains("unknown field") && m.contains("kernal"), "{m}");
}

#[test]
fn the_device_script_workload_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cuda-small.toml");
    let w = gpumux_workload::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = w
        .processes
        .iter()
        .flat_map(|p| p.ops.iter())
        .filter_map(|o| match o {
            Op::Kernel(k) => k.suite.as_ref().map(|s| s.to_string()),
            _ => None,
        })
        .collect();
    for want in ["kmeans.assign", "kmeans.update", "stencil.step", "reduction.partial", "reduction.final"] {
        assert!(names.iter().any(|n| n == want), "{want}");
    }
}

//! Every example workload in the repository's examples/ loads.

use std::path::Path;

#[test]
fn all_examples_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let w = gpumux_workload::load_file(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!w.processes.is_empty());
            n += 1;
        }
    }
    assert!(n >= 4, "found {n} examples");
}

#[test]
fn suite_example_names_suite_kernels() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/suite-h100.toml");
    let w = gpumux_workload::load_file(&dir).unwrap();
    let suites: Vec<String> = w
        .processes
        .iter()
        .flat_map(|p| p.ops.iter())
        .filter_map(|o| match o {
            gpumux_engine::model::Op::Kernel(k) => k.suite.as_ref().map(|s| s.to_string()),
            _ => None,
        })
        .collect();
    for want in ["triad", "sgemm", "histogram"] {
        assert!(suites.iter().any(|s| s == want), "{want}");
    }
}

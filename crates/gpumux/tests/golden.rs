//! Same seed, same bytes: `gpumux run --json` for the README's main job and
//! every `examples/*.toml` must stay byte-identical to the outputs checked in
//! under `tests/golden/` (made before issue 11's changes; see the README
//! there). The quick cases run with every `cargo test`; the slow ones (about
//! three minutes on two cores) are ignored by default and run by `.ci/run`.

mod common;

use common::repo_root;
use std::path::PathBuf;
use std::process::Command;

fn golden(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Runs `gpumux run <workload> --device <device> --json -q` and compares.
fn assert_same_bytes(workload: &str, device: &str, golden_file: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_gpumux"))
        .args(["run", workload, "--device", device, "--json", "-q"])
        .current_dir(repo_root())
        .output()
        .expect("the gpumux binary runs");
    assert!(o.status.success(), "{workload}: {}", String::from_utf8_lossy(&o.stderr));
    let want = golden(golden_file);
    if o.stdout != want {
        let first = o.stdout.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(o.stdout.len().min(want.len()));
        panic!(
            "{workload} on {device}: --json differs from tests/golden/{golden_file} at byte {first} \
             (got {} bytes, want {}); if the change is meant to change results, regenerate (tests/golden/README.md)",
            o.stdout.len(),
            want.len()
        );
    }
}

#[test]
fn quick_examples_are_byte_identical() {
    assert_same_bytes("examples/two-procs.toml", "sim:h100", "two-procs.json");
    assert_same_bytes("examples/async-pipeline.toml", "sim:h100", "async-pipeline.json");
    assert_same_bytes("examples/stream-pipeline.toml", "sim:h100", "stream-pipeline.json");
}

#[test]
#[ignore = "slow (about 40 s on two cores); .ci/run runs it"]
fn slow_examples_are_byte_identical() {
    assert_same_bytes("examples/memory-vs-compute.toml", "sim:h100", "memory-vs-compute.json");
    assert_same_bytes("examples/suite-h100.toml", "sim:h100", "suite-h100.json");
}

#[test]
#[ignore = "slow (about 2.5 min on two cores); .ci/run runs it"]
fn readme_main_job_is_byte_identical() {
    assert_same_bytes("parboil-k20c:mix=8,seed=1,hp=0", "sim:k20c", "main-job.json");
}

#[test]
fn every_example_has_a_golden_file() {
    let mut missing = Vec::new();
    for e in std::fs::read_dir(repo_root().join("examples")).expect("examples/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "toml") {
            let name = format!("{}.json", p.file_stem().and_then(|s| s.to_str()).unwrap_or("?"));
            if !PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(&name).exists() {
                missing.push(name);
            }
        }
    }
    assert!(missing.is_empty(), "examples without a golden --json: {missing:?} (tests/golden/README.md)");
}

//! Helpers shared by the `gpumux` command's integration tests. Each test file
//! is its own crate and takes what it needs with `mod common;`.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// The repository's root: tests run the binary from there, as the README does.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `gpumux ARGS` from the repository's root and waits for it.
pub fn gpumux(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gpumux"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .expect("the gpumux binary runs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Writes `text` to a file `name` in a temporary directory of this test
/// binary (`tag`) and process, and returns its path.
pub fn temp_file(tag: &str, name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumux-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write temp file");
    p
}

//! Helpers shared by the `gpumux` command's integration tests. Each test file
//! is its own crate and takes what it needs with `mod common;`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
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

/// A new temporary directory named for the test binary (`tag`). It is
/// removed when dropped, so a test leaves nothing behind, pass or fail.
pub fn temp_dir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("gpumux-{tag}-")).tempdir().expect("a temporary directory")
}

/// A file in a temporary directory of its own, removed with it on drop: keep
/// this alive for as long as the file is used.
pub struct TempFile {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TempFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path as a command-line argument.
    pub fn as_str(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temporary path")
    }
}

/// Writes `text` to a file `name` in a new temporary directory (see [`temp_dir`]).
pub fn temp_file(tag: &str, name: &str, text: &str) -> TempFile {
    let dir = temp_dir(tag);
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("write temp file");
    TempFile { path, _dir: dir }
}

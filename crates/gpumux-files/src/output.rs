//! Output paths checked before the work: a run that takes minutes must not
//! fail at its end because `--plot` names a file or `--trace` an unwritable
//! folder.
//!
//! The checks leave nothing behind that the command would not have written
//! anyway: a folder is created (the command would create it), a probe file in
//! it is removed, and a file that did not exist is removed again. What they
//! cannot rule out is a change between the check and the write (a full disk,
//! a permission changed meanwhile); the write reports those.

use std::fs::OpenOptions;
use std::path::Path;

/// Checks that `path` can be written as a file: not a folder, its folder
/// exists, and it opens for writing. An existing file is opened for appending
/// and not changed. The error is the reason only; the caller names the flag.
pub fn check_file(path: &Path) -> Result<(), String> {
    if path.as_os_str().is_empty() {
        return Err("is an empty path".into());
    }
    if path.is_dir() {
        return Err("is a folder, not a file".into());
    }
    let existed = path.exists();
    OpenOptions::new().append(true).create(true).open(path).map_err(|e| format!("cannot be written: {e}"))?;
    if !existed {
        std::fs::remove_file(path).map_err(|e| format!("cannot be written: {e}"))?;
    }
    Ok(())
}

/// Creates the folder `dir` (with its parents) and checks that files can be
/// created in it.
pub fn check_dir(dir: &Path) -> Result<(), String> {
    if dir.as_os_str().is_empty() {
        return Err("is an empty path".into());
    }
    if dir.exists() && !dir.is_dir() {
        return Err("is a file, not a folder".into());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot be created: {e}"))?;
    let probe = dir.join(format!(".gpumux-write-check-{}", std::process::id()));
    OpenOptions::new().write(true).create_new(true).open(&probe).map_err(|e| format!("is not writable: {e}"))?;
    std::fs::remove_file(&probe).map_err(|e| format!("is not writable: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new empty temporary directory, removed when the test drops it, pass or fail.
    fn temp_dir() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("gpumux-files-out-").tempdir().expect("a temporary directory")
    }

    #[test]
    fn a_new_folder_is_created_and_left_empty() {
        let dir = temp_dir();
        let d = dir.path().join("a/b");
        assert_eq!(check_dir(&d), Ok(()));
        assert!(d.is_dir());
        assert_eq!(std::fs::read_dir(&d).map(|r| r.count()).ok(), Some(0));
    }

    #[test]
    fn a_file_is_not_a_folder_and_a_folder_is_not_a_file() {
        let dir = temp_dir();
        let d = dir.path();
        let f = d.join("f.txt");
        std::fs::write(&f, "keep").expect("file");
        assert_eq!(check_dir(&f), Err("is a file, not a folder".to_string()));
        assert_eq!(check_file(d), Err("is a folder, not a file".to_string()));
        // An existing file is checked without being changed.
        assert_eq!(check_file(&f), Ok(()));
        assert_eq!(std::fs::read_to_string(&f).ok().as_deref(), Some("keep"));
        // A new file is not left behind.
        let g = d.join("g.json");
        assert_eq!(check_file(&g), Ok(()));
        assert!(!g.exists());
        // A file in a folder that does not exist cannot be written.
        let e = check_file(&d.join("missing/h.json")).expect_err("no folder");
        assert!(e.starts_with("cannot be written"), "{e}");
    }
}

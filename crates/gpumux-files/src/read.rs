//! Reading a user's file with a size limit that holds for every kind of file.

use std::fs::File;
use std::io::Read;
use std::path::Path;

/// Largest input file gpumux reads (a guard against pointing at a disk image
/// or a device): far above any real workload or task set.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Reads `path` as UTF-8 text of at most `limit` bytes. `what` names the kind
/// of file in the reason ("a workload file"). The error is the reason only;
/// the caller names the path.
///
/// A regular file's size is known, so a large one is refused before reading.
/// Devices, pipes and `/proc` files report no true size: they are read through
/// `Read::take(limit + 1)`, so at most one byte past the limit is ever held.
/// A FIFO waits for its writer, as it does for any Unix program.
pub fn read_text(path: &Path, limit: u64, what: &str) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if meta.is_dir() {
        return Err("is a directory".into());
    }
    if meta.is_file() && meta.len() > limit {
        return Err(format!("is {} bytes, more than the {limit} {what} may have", meta.len()));
    }
    let file = File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    if bytes.len() as u64 > limit {
        return Err(format!("has more than the {limit} bytes {what} may have (read stopped there)"));
    }
    String::from_utf8(bytes)
        .map_err(|e| format!("is not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file `name` holding `bytes` in a new temporary directory, and the
    /// directory: it is removed when the test drops it, pass or fail.
    fn temp(name: &str, bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::Builder::new().prefix("gpumux-files-").tempdir().expect("a temporary directory");
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        (dir, p)
    }

    #[test]
    fn reads_text_within_the_limit() {
        let (_dir, p) = temp("ok.txt", b"hello");
        assert_eq!(read_text(&p, 5, "a file").as_deref(), Ok("hello"));
    }

    #[test]
    fn a_regular_file_over_the_limit_is_refused_with_its_size() {
        let (_dir, p) = temp("big.txt", b"123456");
        let e = read_text(&p, 5, "a test file").expect_err("too big");
        assert!(e.contains("is 6 bytes, more than the 5 a test file may have"), "{e}");
    }

    #[test]
    fn an_endless_device_stops_at_the_limit() {
        let e = read_text(Path::new("/dev/zero"), 1000, "a test file").expect_err("endless");
        assert!(e.contains("more than the 1000 bytes"), "{e}");
    }

    #[test]
    fn non_utf8_names_the_offset_and_a_directory_is_named() {
        let (dir, p) = temp("latin1.txt", b"abc\xe9def");
        let e = read_text(&p, 100, "a file").expect_err("not UTF-8");
        assert!(e.contains("offset 3"), "{e}");
        let e = read_text(dir.path(), 100, "a file").expect_err("a directory");
        assert_eq!(e, "is a directory");
    }
}

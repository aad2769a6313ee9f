//! Workloads for gpumux: TOML workload files and built-in workloads (the
//! Parboil applications of Tanasic et al., ISCA 2014), validated into the
//! engine's [`Workload`]. The format and the built-ins are described in
//! `docs/workloads.md`.
//!
//! ```
//! let w = gpumux_workload::parse_str(r#"
//!     [[process]]
//!     name = "p"
//!     [[process.op]]
//!     kind = "kernel"
//!     name = "k"
//!     grid = [64, 2]
//!     block = 256
//!     regs_per_thread = 32
//!     block_time_us = 10
//! "#, "inline.toml").unwrap();
//! assert_eq!(w.processes[0].ops.len(), 1);
//! ```

#![warn(missing_docs)]

mod builtin;
mod error;
mod parboil;
mod parse;
mod raw;
mod write;

pub use builtin::{builtin, is_builtin, parboil_mix, parboil_mix_apps, GRAMMAR, MAX_MIX, PARBOIL, PARBOIL_REPLAY};
pub use error::WorkloadError;
pub use gpumux_engine::model::Workload;
pub use parboil::{
    cpu_after_us, cpu_before_us, k20c_occupancy, parboil_app, parboil_class1, parboil_class2, parboil_kernels,
    AppClass, BlockTime, TableRow, APPS as PARBOIL_APPS, BLOCK_TIME_SPREAD, TABLE1,
};
pub use parse::{
    parse_str, MAX_BLOCKS, MAX_BLOCK_US, MAX_COPY_BYTES, MAX_COUNT, MAX_EXPANDED_OPS, MAX_LOOP_DEPTH,
    MAX_REGS_PER_THREAD, MAX_SMEM_PER_BLOCK, MAX_THREADS_PER_BLOCK, MAX_US,
};
pub use write::to_toml;

use std::path::Path;

/// Largest workload file we read (a guard against pointing at a disk image
/// or a device; the same limit as task-set files).
pub const MAX_FILE_BYTES: u64 = gpumux_files::MAX_FILE_BYTES;

/// Reads, parses and validates a workload file. Any kind of file is read
/// through a bounded reader: `/dev/zero` or an endless pipe fails at
/// [`MAX_FILE_BYTES`] instead of exhausting memory.
pub fn load_file(path: &Path) -> Result<Workload, WorkloadError> {
    let shown = path.display().to_string();
    let text = gpumux_files::read_text(path, MAX_FILE_BYTES, "a workload file")
        .map_err(|reason| WorkloadError::Io { path: shown.clone(), reason })?;
    parse_str(&text, &shown)
}

/// A workload from a spec: a built-in (`parboil-k20c[:...]`, see [`GRAMMAR`])
/// or the path of a workload file.
pub fn resolve(spec: &str) -> Result<Workload, WorkloadError> {
    if is_builtin(spec) {
        return builtin(spec);
    }
    let path = Path::new(spec);
    if !path.exists() {
        let hint = if spec.starts_with("parboil") {
            format!("no such file, and not a built-in workload (built-ins: {GRAMMAR})")
        } else {
            format!("no such file (built-in workloads: {GRAMMAR})")
        };
        return Err(WorkloadError::Io { path: spec.to_string(), reason: hint });
    }
    load_file(path)
}

//! The CUDA device behind the daemon.
//!
//! PLACEHOLDER in branch i13-d only: another helper writes the real backend
//! (branch i13-c); the lead replaces this file at merge. Until then
//! `--device cuda:N` fails with the error below rather than pretending.

use super::Backend;

/// Opens GPU `ordinal` as a daemon backend.
pub fn open(ordinal: i32) -> Result<Box<dyn Backend>, anyhow::Error> {
    anyhow::bail!("the CUDA backend is not built yet in this branch (cuda:{ordinal}); use --device sim:h100")
}

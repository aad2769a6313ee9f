//! The daemon's heap gives memory back after a burst (issue 36's soak).
//!
//! A flood of connections or of half-sent frames makes the reader threads
//! allocate frame buffers (up to a frame's 8 MiB limit) in glibc's
//! per-thread arenas. Freed, those stay with the process: in the soak the
//! daemon went 9 MiB → 212 MiB under the abusers → 56 MiB after them, with
//! 190 KB of it in use. Two settings give it back:
//!
//! * [`tune`]: allocations from [`MMAP_THRESHOLD`] up come from their own
//!   mapping and go back to the kernel when freed. Setting the threshold also
//!   stops glibc raising it as large blocks are freed (its dynamic threshold,
//!   which is what kept the frame buffers in the arenas);
//! * [`tune`] also keeps glibc to [`ARENAS`] arenas: by default it makes one
//!   per thread that meets a locked one, up to 8 per core (128 on a 16-core
//!   host), and each keeps its own free pages and fragments; a flood's 2,000
//!   short-lived reader threads spread its buffers over all of them;
//! * [`Trimmer`]: after connections have closed, at most once per
//!   [`TRIM_EVERY`], `malloc_trim(0)` returns the arenas' free pages (what
//!   smaller buffers of many threads leave behind).
//!
//! Both are glibc's; with another C library they do nothing.

use std::time::{Duration, Instant};

/// Allocations of at least this many bytes are mapped on their own (glibc's
/// default before its dynamic threshold moves it).
pub const MMAP_THRESHOLD: usize = 128 << 10;
/// Malloc arenas at most: the core, the readers and writers of busy clients
/// and the device link rarely allocate at once.
pub const ARENAS: usize = 4;
/// The least time between two trims.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);

/// Sets [`MMAP_THRESHOLD`] and [`ARENAS`]; call once at start, before threads allocate.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets malloc's parameters; any value is valid to pass.
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) };
        if ok != 1 {
            tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused; freed frame buffers stay in the heap");
        }
        // SAFETY: as above.
        if unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENAS as libc::c_int) } != 1 {
            tracing::debug!("mallopt(M_ARENA_MAX) refused");
        }
    }
}

/// Trims the heap when connections have closed since the last trim.
#[derive(Debug)]
pub struct Trimmer {
    closed_at_last: u64,
    last: Instant,
}

impl Default for Trimmer {
    fn default() -> Self {
        Self { closed_at_last: 0, last: Instant::now() }
    }
}

impl Trimmer {
    /// `closed`: connections closed since the daemon started. Trims if that
    /// moved and [`TRIM_EVERY`] has passed; says whether it trimmed.
    pub fn tick(&mut self, closed: u64) -> bool {
        if closed == self.closed_at_last || self.last.elapsed() < TRIM_EVERY {
            return false;
        }
        self.closed_at_last = closed;
        self.last = Instant::now();
        trim();
        true
    }
}

/// Gives the heap's free pages back to the kernel.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim walks malloc's own lists under its locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_only_after_closes_and_not_more_often_than_the_period() {
        let mut t = Trimmer { closed_at_last: 0, last: Instant::now() - TRIM_EVERY };
        assert!(!t.tick(0), "nothing closed: no trim");
        assert!(t.tick(3), "closes and the period passed: a trim");
        assert!(!t.tick(5), "closes, but within the period: none");
        t.last = Instant::now() - TRIM_EVERY;
        assert!(!t.tick(3), "no close since the last trim: none");
        assert!(t.tick(4));
    }
}

//! Virtual and wall time, both as nanoseconds since the start of a run.
//!
//! The engine never reads a clock: every event carries the time at which the
//! device observed it, so the same code runs on the simulator's virtual clock
//! and on the CUDA backend's monotonic clock.

/// Nanoseconds since the start of a run.
pub type Nanos = u64;

pub const NS_PER_US: Nanos = 1_000;
pub const NS_PER_MS: Nanos = 1_000_000;
pub const NS_PER_S: Nanos = 1_000_000_000;

/// Converts microseconds given as a float (workload files use them) to whole
/// nanoseconds, rounding to nearest. Negative or non-finite inputs are the
/// caller's bug: workload validation rejects them before they get here.
pub fn us_to_ns(us: f64) -> Nanos {
    (us * 1_000.0).round().max(0.0) as Nanos
}

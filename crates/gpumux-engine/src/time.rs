//! Virtual and wall time, both as nanoseconds since the start of a run.
//!
//! The engine never reads a clock: every event carries the time at which the
//! device observed it, so the same code runs on the simulator's virtual clock
//! and on the CUDA backend's monotonic clock.
//!
//! A `u64` of nanoseconds holds about 584 years. A workload can ask for more
//! (a host op of 10^12 µs repeated 20000 times), so every "now + duration"
//! of a run goes through [`later`]: a time that does not fit is an error
//! ([`TimeOverflow`]), never a wrapped or clamped number that would make a
//! wrong makespan look like a result.

/// Nanoseconds since the start of a run.
pub type Nanos = u64;

/// Nanoseconds in a microsecond.
pub const NS_PER_US: Nanos = 1_000;
/// Nanoseconds in a millisecond.
pub const NS_PER_MS: Nanos = 1_000_000;
/// Nanoseconds in a second.
pub const NS_PER_S: Nanos = 1_000_000_000;

/// A point in a run's time beyond what [`Nanos`] can hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "simulated time overflows: {what} at {at} ns lasting {plus} ns would end past {max} ns (about 584 years), \
     the longest run gpumux can represent; shorten the workload (fewer repetitions or runs, shorter ops)",
    max = Nanos::MAX
)]
pub struct TimeOverflow {
    /// What was being timed, e.g. "a host (cpu) operation of process `p`".
    pub what: String,
    /// When it started.
    pub at: Nanos,
    /// How long it lasts.
    pub plus: Nanos,
}

/// `at + plus`, or the overflow that says what `what` asked for.
#[inline]
pub fn later(at: Nanos, plus: Nanos, what: impl FnOnce() -> String) -> Result<Nanos, TimeOverflow> {
    at.checked_add(plus).ok_or_else(|| TimeOverflow { what: what(), at, plus })
}

/// Whole nanoseconds from a float number of them, truncated as `as` does
/// (callers that want rounding up call `ceil` first), or `None` when it is
/// not a finite number that fits in [`Nanos`]: `f64 as u64` would saturate
/// silently. Negative inputs give 0, as with `as`.
#[inline]
pub fn ns_from_f64(ns: f64) -> Option<Nanos> {
    // 2^64 as f64 is exact; every finite f64 below it converts without saturating.
    const LIMIT: f64 = 18_446_744_073_709_551_616.0;
    (ns.is_finite() && ns < LIMIT).then_some(ns as Nanos)
}

/// Converts microseconds given as a float (workload files use them) to whole
/// nanoseconds, rounding to nearest. Negative or non-finite inputs are the
/// caller's bug: workload validation rejects them before they get here, and
/// bounds them (at most 10^12 µs, `gpumux_workload::parse::MAX_US`) far below
/// where the conversion would saturate.
pub fn us_to_ns(us: f64) -> Nanos {
    (us * 1_000.0).round().max(0.0) as Nanos
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_adds_or_says_what_overflowed() {
        assert_eq!(later(5, 7, || unreachable!()), Ok(12));
        assert_eq!(later(Nanos::MAX - 1, 1, || unreachable!()), Ok(Nanos::MAX));
        let e = later(Nanos::MAX - 1, 2, || "a copy".into()).expect_err("overflows");
        assert_eq!((e.at, e.plus, e.what.as_str()), (Nanos::MAX - 1, 2, "a copy"));
        assert!(e.to_string().contains("a copy at 18446744073709551614 ns lasting 2 ns"), "{e}");
    }

    #[test]
    fn float_nanoseconds_refuse_what_does_not_fit() {
        assert_eq!(ns_from_f64(2.7), Some(2));
        assert_eq!(ns_from_f64(-3.0), Some(0));
        assert_eq!(ns_from_f64(1.8e19), Some(18_000_000_000_000_000_000));
        assert_eq!(ns_from_f64(1.9e19), None);
        assert_eq!(ns_from_f64(f64::INFINITY), None);
        assert_eq!(ns_from_f64(f64::NAN), None);
    }
}

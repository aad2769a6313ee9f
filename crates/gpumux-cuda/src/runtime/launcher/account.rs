//! What the launcher thread did with its life, for one log line when it
//! ends: is it the bottleneck of a run of short launches (busy most of the
//! time, a backlog of jobs), or idle between them?
//!
//! Counted by the thread alone, in plain fields it returns when it ends:
//! nothing shared, no atomic and no clock read per job beyond the calls'
//! own timing (`run`). A time is kept to 100 ns in a histogram, for its p50
//! and p90.

use std::fmt;
use std::time::{Duration, Instant};

/// Buckets of [`Times`]: 100 ns each, the last for 25.5 µs and longer.
const BUCKETS: usize = 256;
/// A bucket's width, ns.
const BUCKET_NS: u64 = 100;

/// One driver call's times: how many, their sum, and their spread.
#[derive(Clone)]
pub(super) struct Times {
    count: u64,
    sum_ns: u64,
    buckets: [u64; BUCKETS],
}

impl Default for Times {
    fn default() -> Times {
        Times { count: 0, sum_ns: 0, buckets: [0; BUCKETS] }
    }
}

impl Times {
    fn add(&mut self, ns: u64) {
        self.count += 1;
        self.sum_ns += ns;
        self.buckets[((ns / BUCKET_NS) as usize).min(BUCKETS - 1)] += 1;
    }

    /// Mean, µs (0 with none).
    fn mean_us(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sum_ns as f64 / self.count as f64 / 1e3
    }

    /// The upper edge (µs) of the bucket that holds the `q`-quantile, or
    /// `None` with no times or when it lies in the last, open bucket.
    fn quantile_us(&self, q: f64) -> Option<f64> {
        // The rank of the quantile, 1-based: the smallest time with at least
        // q of the times at or below it.
        let rank = ((self.count as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return (i < BUCKETS - 1).then(|| ((i as u64 + 1) * BUCKET_NS) as f64 / 1e3);
            }
        }
        None
    }
}

impl fmt::Display for Times {
    /// `N: mean M µs, p50 under A, p90 under B`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let q = |q| match self.quantile_us(q) {
            Some(us) => format!("under {us:.1}"),
            None => format!("{:.1} or more", ((BUCKETS - 1) as u64 * BUCKET_NS) as f64 / 1e3),
        };
        write!(f, "{}: mean {:.2} µs, p50 {}, p90 {}", self.count, self.mean_us(), q(0.5), q(0.9))
    }
}

/// The thread's account, from its start to its end.
#[derive(Clone, Default)]
pub(super) struct Account {
    /// When the thread started ([`Account::starting`]).
    started: Option<Instant>,
    /// From the thread's start to its end (set by [`Account::ended`]): the
    /// span its sleeps are counted over, so that its life less its sleeps is
    /// its time awake (from its first job instead, the sleep that waited for
    /// that job counted against a life that did not hold it: "140 % of its
    /// time awake" on the H200).
    life: Duration,
    /// Jobs whose calls failed.
    failed: u64,
    /// `cuLaunchKernel`, of every job made.
    launch: Times,
    /// The calls after it (the published end's `cuStreamWriteValue32`, the
    /// end event's `cuEventRecord`), timed together, of the jobs that made any.
    end_calls: Times,
    /// Times it went to sleep for want of a job, and how long those took.
    sleeps: u64,
    slept: Duration,
    /// Jobs in the ring at a take, the one taken included, as of the
    /// taker's last read of the tail (a floor: it reads the tail only when
    /// it found the ring empty): the largest, and their sum.
    most_queued: usize,
    queued_sum: u64,
}

impl Account {
    /// The account of a thread starting now.
    pub(super) fn starting() -> Account {
        Account { started: Some(Instant::now()), ..Account::default() }
    }

    /// A job taken with `queued` jobs in the ring (itself included).
    #[inline]
    pub(super) fn took(&mut self, queued: usize) {
        self.most_queued = self.most_queued.max(queued);
        self.queued_sum += queued as u64;
    }

    /// A job's calls made: the launch's ns, and its end calls' if it made any.
    #[inline]
    pub(super) fn made(&mut self, launch_ns: u64, end_ns: Option<u64>) {
        self.launch.add(launch_ns);
        if let Some(ns) = end_ns {
            self.end_calls.add(ns);
        }
    }

    /// A job whose calls failed.
    pub(super) fn failed(&mut self) {
        self.failed += 1;
    }

    /// The thread ends, having slept `sleeps` times for `slept` in all.
    pub(super) fn ended(&mut self, sleeps: u64, slept: Duration) {
        self.life = self.started.map_or(Duration::ZERO, |t| t.elapsed());
        (self.sleeps, self.slept) = (sleeps, slept);
    }

    /// Jobs taken.
    fn jobs(&self) -> u64 {
        self.launch.count + self.failed
    }

    /// Its driver calls' share of `of` (0 of nothing).
    fn busy(&self, of: Duration) -> f64 {
        let calls_ns = (self.launch.sum_ns + self.end_calls.sum_ns) as f64;
        if of.is_zero() {
            return 0.0;
        }
        calls_ns / of.as_nanos() as f64
    }

    /// Its life less its sleeps: what it spent in calls, spinning or working
    /// around them. The calls' share of this says how near the thread is to
    /// being the bottleneck (of its life, it would count the idle times
    /// between a daemon's runs).
    fn awake(&self) -> Duration {
        self.life.saturating_sub(self.slept)
    }

    /// Its life less its calls and its sleeps: spinning for jobs, and its
    /// own work around each (taking it, stamps, setting its outcome).
    fn awake_between(&self) -> Duration {
        let calls = Duration::from_nanos(self.launch.sum_ns + self.end_calls.sum_ns);
        self.awake().saturating_sub(calls)
    }

    /// The log line, or `None` if it took no job.
    pub(super) fn summary(&self) -> Option<String> {
        (self.jobs() > 0).then(|| self.to_string())
    }
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        write!(
            f,
            "{} jobs ({} failed) in a life of {:.1} ms; its driver calls {:.0}% of its {:.1} ms awake \
             (cuLaunchKernel {}; end write or record {}); awake between calls {:.1} ms (spinning for \
             jobs, taking and answering them), asleep {:.1} ms in {} sleeps; jobs in the ring at a take \
             (itself included, as of its last read of the tail): at most {}, mean {:.1}",
            self.jobs(),
            self.failed,
            ms(self.life),
            self.busy(self.awake()) * 100.0,
            ms(self.awake()),
            self.launch,
            self.end_calls,
            ms(self.awake_between()),
            ms(self.slept),
            self.sleeps,
            self.most_queued,
            self.queued_sum as f64 / self.jobs().max(1) as f64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_give_their_mean_and_the_bucket_edges_of_p50_and_p90() {
        let mut t = Times::default();
        assert_eq!((t.mean_us(), t.quantile_us(0.5)), (0.0, None), "no times");
        // 10 launches: 4,000..4,900 ns, one in each bucket from 4.0 to 4.9 µs.
        (0..10).for_each(|i| t.add(4_000 + i * 100));
        assert!((t.mean_us() - 4.45).abs() < 1e-9, "{}", t.mean_us());
        // The 5th smallest (4,400 ns) is in [4.4, 4.5): p50 under 4.5; the 9th, under 4.9.
        assert_eq!(t.quantile_us(0.5), Some(4.5));
        assert_eq!(t.quantile_us(0.9), Some(4.9));
        t.add(1_000_000);
        assert_eq!(t.quantile_us(1.0), None, "in the open bucket");
        assert!(t.to_string().starts_with("11: mean "), "{t}");
        assert!(t.to_string().ends_with("p90 under 5.0"), "{t}");
    }

    #[test]
    fn the_account_adds_its_jobs_calls_sleeps_and_backlog() {
        let mut a = Account::starting();
        assert_eq!(a.summary(), None, "no job, no line");
        // Three jobs made (one with an end write) and one failed, taken with
        // 3, 2, 1 and 1 jobs in the ring.
        for (queued, launch, end) in [(3, 4_000, None), (2, 5_000, Some(1_000)), (1, 6_000, None)] {
            a.took(queued);
            a.made(launch, end);
        }
        a.took(1);
        a.failed();
        a.ended(2, Duration::from_micros(60));
        a.life = Duration::from_micros(100);
        assert_eq!(a.jobs(), 4);
        assert_eq!((a.launch.count, a.launch.sum_ns), (3, 15_000));
        assert_eq!((a.end_calls.count, a.end_calls.sum_ns), (1, 1_000));
        assert!((a.busy(a.life) - 0.16).abs() < 1e-9, "16 µs of calls in 100: {}", a.busy(a.life));
        assert!((a.busy(a.awake()) - 0.4).abs() < 1e-9, "16 µs in 40 awake: {}", a.busy(a.awake()));
        assert_eq!(a.awake_between(), Duration::from_micros(100 - 16 - 60));
        assert_eq!((a.most_queued, a.queued_sum), (3, 7));
        let s = a.summary().expect("jobs taken");
        for part in [
            "4 jobs (1 failed) in a life of 0.1 ms",
            "its driver calls 40% of its 0.0 ms awake",
            "cuLaunchKernel 3: mean 5.00 µs, p50 under 5.1, p90 under 6.1",
            "end write or record 1: mean 1.00 µs",
            "awake between calls 0.0 ms",
            "asleep 0.1 ms in 2 sleeps",
            "at most 3, mean 1.8",
        ] {
            assert!(s.contains(part), "{part:?} in {s}");
        }
    }

    #[test]
    fn a_life_shorter_than_its_calls_counts_no_time_awake_between_them() {
        // Clock granularity: the calls' sum may pass the life measured around them.
        let mut a = Account::default();
        a.took(1);
        a.made(10_000, None);
        a.ended(0, Duration::ZERO);
        a.life = Duration::from_micros(5);
        assert_eq!(a.awake_between(), Duration::ZERO);
    }
}

//! When each job of a periodic task is released, and what its response time is.
//!
//! Releases are absolute (`start + k·T`), never "previous release + T" measured after the
//! fact, so the schedule does not drift however late a job ran. A task is one thread: a job
//! starts at its release or when the previous job ends, whichever is later, and its response
//! time is counted from its *release*, so a backlog shows in the next jobs' responses.

use std::time::Duration;

/// The release times of one task over a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Releases {
    /// `T`, seconds.
    pub period_s: f64,
    /// How long releases go on, seconds from the run's start (a job released before it
    /// is run to its end; none is released at or after it).
    pub duration_s: f64,
}

impl Releases {
    /// The release of job `k` (from 0), from the run's start, or `None` past the run.
    pub fn release(&self, k: u64) -> Option<Duration> {
        let at = self.period_s * k as f64;
        (at < self.duration_s && at.is_finite()).then(|| Duration::from_secs_f64(at))
    }

    /// How many jobs the run releases: `⌈duration / T⌉`.
    pub fn jobs(&self) -> u64 {
        if self.period_s <= 0.0 || !self.duration_s.is_finite() || self.duration_s <= 0.0 {
            return 0;
        }
        (self.duration_s / self.period_s).ceil() as u64
    }
}

/// When a job may start: at its release, or when the previous job ended if that was later.
pub fn start_of(release: Duration, previous_end: Option<Duration>) -> Duration {
    previous_end.map_or(release, |end| end.max(release))
}

/// A job's response time: from its release to the end of its last subtask.
pub fn response(release: Duration, end: Duration) -> Duration {
    end.saturating_sub(release)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn releases_are_absolute_multiples_of_the_period() {
        let r = Releases { period_s: 0.02, duration_s: 0.1 };
        let all: Vec<Duration> = (0..10).map_while(|k| r.release(k)).collect();
        assert_eq!(all.len(), 5, "{all:?}");
        assert_eq!(r.jobs(), 5);
        // Job 4 is at 4·T exactly, however the earlier ones ran: no accumulated drift.
        assert_eq!(all[4], secs(0.02 * 4.0));
        assert!(all.windows(2).all(|w| ((w[1] - w[0]).as_secs_f64() - 0.02).abs() < 1e-9));
        assert_eq!(r.release(5), None, "nothing is released at the run's end");
    }

    #[test]
    fn a_period_that_does_not_divide_the_run_releases_the_last_partial_job() {
        let r = Releases { period_s: 0.3, duration_s: 1.0 };
        assert_eq!(r.jobs(), 4);
        assert!(r.release(3).is_some() && r.release(4).is_none());
        assert_eq!(Releases { period_s: 0.3, duration_s: 0.0 }.jobs(), 0);
    }

    #[test]
    fn a_late_job_starts_when_the_previous_one_ends_and_counts_from_its_release() {
        let ms = Duration::from_millis;
        let release = ms(1000);
        assert_eq!(start_of(release, None), release);
        assert_eq!(start_of(release, Some(ms(500))), release, "an early end waits for the release");
        let start = start_of(release, Some(ms(1250)));
        assert_eq!(start, ms(1250), "a backlog delays the start");
        // Its response includes the wait for the previous job.
        assert_eq!(response(release, start + ms(100)), ms(350));
        assert_eq!(response(release, ms(900)), Duration::ZERO);
    }
}

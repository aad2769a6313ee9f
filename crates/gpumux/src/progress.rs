//! Progress of `gpumux run` on stderr, measured against the work estimate
//! (`work.rs`) so it can give an ETA. Never on stdout: `--json` and the
//! table stay byte-identical with or without it.
//!
//! * On a terminal: one bar with percent and ETA, redrawn in place.
//! * Off a terminal (a log, CI, `2>file`): nothing for short runs; from
//!   [`FIRST_LINE`] on, one plain line every [`LINE_EVERY`], so a long run is
//!   never silent.
//! * `--quiet`: nothing.

use crate::work::{self, Estimate};
use gpumux_engine::driver::{self, DriverHooks};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Off a terminal, runs shorter than this print nothing.
pub const FIRST_LINE: Duration = Duration::from_secs(5);
/// Off a terminal, the interval between lines.
pub const LINE_EVERY: Duration = Duration::from_secs(10);
/// Overrides both (milliseconds): lets tests see lines without a long run,
/// and a log that wants denser lines get them.
pub const EVERY_ENV: &str = "GPUMUX_PROGRESS_EVERY_MS";
/// How often the reporter wakes to redraw or check for the end.
const TICK: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Off,
    /// A bar redrawn in place (stderr is a terminal).
    Bar,
    /// Plain lines (stderr is a file or pipe).
    Lines,
}

impl Mode {
    /// What suits stderr now, unless `quiet`.
    pub fn for_stderr(quiet: bool) -> Mode {
        match (quiet, std::io::stderr().is_terminal()) {
            (true, _) => Mode::Off,
            (false, true) => Mode::Bar,
            (false, false) => Mode::Lines,
        }
    }
}

/// Work done by the runs of one `gpumux run`, shared by its worker threads.
pub struct Progress {
    /// Estimated work of everything (`Estimate::total`), in blocks.
    total: f64,
    /// Work done, in blocks (`work::OP_COST` per operation).
    done: AtomicU64,
    runs: usize,
    runs_done: AtomicUsize,
    finished: AtomicBool,
}

impl Progress {
    pub fn new(estimate: &Estimate, runs: usize) -> Self {
        Progress {
            total: estimate.total,
            done: AtomicU64::new(0),
            runs,
            runs_done: AtomicUsize::new(0),
            finished: AtomicBool::new(false),
        }
    }

    /// Adds work done (a run's counters moved by this much).
    pub fn add(&self, work: f64) {
        self.done.fetch_add(work.max(0.0) as u64, Ordering::Relaxed);
    }

    pub fn run_done(&self) {
        self.runs_done.fetch_add(1, Ordering::Relaxed);
    }

    /// A driver hook that adds one run's progress to this.
    pub fn of_run(&self) -> RunProgress<'_> {
        RunProgress { shared: self, reported: 0.0 }
    }

    /// Stops the reporter when the guard is dropped: after the last run, or
    /// when a panic unwinds past the runs (else the reporter's thread would
    /// keep its scope waiting forever).
    pub fn finish_on_drop(&self) -> FinishOnDrop<'_> {
        FinishOnDrop(self)
    }

    /// Reports on stderr in `mode` until finished ([`Progress::finish_on_drop`]);
    /// run it on its own thread.
    pub fn report(&self, mode: Mode) {
        let start = Instant::now();
        let bar = (mode == Mode::Bar).then(|| {
            let bar = ProgressBar::with_draw_target(Some(self.total.max(1.0) as u64), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {percent:>3}% [{elapsed} elapsed, about {eta} left] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar
        });
        let every = std::env::var(EVERY_ENV).ok().and_then(|v| v.parse::<u64>().ok()).map(Duration::from_millis);
        let mut next_line = every.unwrap_or(FIRST_LINE);
        while !self.finished.load(Ordering::Relaxed) {
            std::thread::sleep(TICK);
            let done = self.done.load(Ordering::Relaxed) as f64;
            let runs_done = self.runs_done.load(Ordering::Relaxed);
            if let Some(bar) = &bar {
                // Never show 100% before the end: the estimate can be short.
                bar.set_position((done.min(self.total * 0.99)) as u64);
                bar.set_message(format!("{runs_done}/{} runs", self.runs));
            } else if mode == Mode::Lines && start.elapsed() >= next_line {
                eprintln!("gpumux run: {}", self.line(done, runs_done, start.elapsed()));
                next_line += every.unwrap_or(LINE_EVERY);
            }
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
    }

    /// "37% of the estimated work after 1 min, about 2 min left (3/10 runs done)".
    fn line(&self, done: f64, runs_done: usize, elapsed: Duration) -> String {
        let secs = elapsed.as_secs_f64();
        let runs = format!("{runs_done}/{} runs done", self.runs);
        if done >= self.total {
            return format!("more work than estimated after {}, no ETA ({runs})", work::duration(secs));
        }
        let fraction = done / self.total.max(1.0);
        let left = if done > 0.0 { work::duration(secs * (self.total - done) / done) } else { "unknown".into() };
        format!(
            "{:.0}% of the estimated work after {}, about {left} left ({runs})",
            (fraction * 100.0).floor(),
            work::duration(secs)
        )
    }
}

/// See [`Progress::finish_on_drop`].
pub struct FinishOnDrop<'a>(&'a Progress);

impl Drop for FinishOnDrop<'_> {
    fn drop(&mut self) {
        self.0.finished.store(true, Ordering::Relaxed);
    }
}

/// Adds a run's work, as the driver reports it, to the shared [`Progress`].
pub struct RunProgress<'a> {
    shared: &'a Progress,
    /// Work of this run already added, in the estimate's units.
    reported: f64,
}

impl DriverHooks for RunProgress<'_> {
    fn on_progress(&mut self, p: driver::Progress) {
        let done = p.blocks_completed as f64 + work::OP_COST * p.ops_issued as f64;
        self.shared.add(done - self.reported);
        self.reported = done;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(total: f64) -> Progress {
        Progress::new(&Estimate { blocks: total, ops: 0.0, total, largest_run: total, runs: 10 }, 10)
    }

    #[test]
    fn lines_give_fraction_and_eta_from_the_rate_so_far() {
        let p = progress(1000.0);
        assert_eq!(
            p.line(250.0, 3, Duration::from_secs(60)),
            "25% of the estimated work after 60 s, about 3 min left (3/10 runs done)"
        );
    }

    #[test]
    fn past_the_estimate_there_is_no_eta() {
        let p = progress(1000.0);
        assert_eq!(
            p.line(1500.0, 9, Duration::from_secs(30)),
            "more work than estimated after 30 s, no ETA (9/10 runs done)"
        );
    }
}

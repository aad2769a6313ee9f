//! The measured-versus-bound table: per task its mode, jobs, worst and p99 response time,
//! the analysis's bound `R`, the deadline, and a verdict.
//!
//! A task the analysis says meets its deadline (`R ≤ D`) is checked: every job must have
//! run and its worst response must be at most `R`. Anything else is a VIOLATION, a bug in
//! the analysis or in this runtime, and the run exits non-zero. A task whose bound exceeds
//! its deadline (or that has none) is not checked: the analysis assumes a job ends before
//! the next is released, which such a task need not do, so misses are expected.

use gpumux_rt::analysis::{Status, TaskReport};
use serde::Serialize;
use std::fmt::Write as _;

use super::calibrate::Fits;
use super::tasks::Outcome;

/// The `q` quantile (nearest rank) of `v`, or `None` for none.
pub fn quantile(v: &[f64], q: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((q.clamp(0.0, 1.0) * s.len() as f64).ceil() as usize).clamp(1, s.len());
    Some(s[rank - 1])
}

/// A task's verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", content = "why", rename_all = "snake_case")]
pub enum Verdict {
    /// Checked: every job ran, the worst response is at most `R`.
    WithinBound,
    /// Checked and failed although no subtask held its resource longer than its stated time:
    /// the analysis or the runtime's dispatch is wrong (why).
    Violation(String),
    /// Checked and failed, and some subtask held its resource longer than its stated time
    /// (the host or the device was slower than calibrated, so the analysis's premise, a
    /// worst-case time per subtask, did not hold): still a failure of the run, but not
    /// evidence against the analysis (why).
    Overrun(String),
    /// Not checked (why).
    NotChecked(String),
}

/// One row of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The task.
    pub name: String,
    /// 1 = highest.
    pub priority: usize,
    /// The priority its clients asked gpumuxd for.
    pub gpumuxd_priority: i32,
    /// `single` or `multi`.
    pub mode: String,
    /// Jobs released.
    pub jobs: u64,
    /// Jobs that ran to their end.
    pub completed: u64,
    /// Jobs past their deadline.
    pub misses: u64,
    /// Jobs never started (the backlog at the end).
    pub not_run: u64,
    /// Worst response, ms.
    pub worst_ms: Option<f64>,
    /// 99th percentile response, ms.
    pub p99_ms: Option<f64>,
    /// Mean response, ms.
    pub mean_ms: Option<f64>,
    /// The analysis's bound `R`, ms.
    pub bound_ms: Option<f64>,
    /// `D`, ms.
    pub deadline_ms: f64,
    /// The analysis's verdict for the task.
    pub analysis: Status,
    /// The longest any subtask held its resource over its stated time (above 1: the runtime
    /// overran a WCET, which the analysis does not allow for).
    pub held_over_stated: f64,
    /// The same per subtask, in pipeline order.
    pub held_over_stated_by_subtask: Vec<f64>,
    /// The job (from 0) with the worst response.
    pub worst_job: Option<usize>,
    /// Blocks whose output was wrong (a real GPU; 0 on a simulated one).
    pub wrong_blocks: u64,
    /// The verdict.
    pub verdict: Verdict,
}

/// Builds a task's row from its analysis and what its run measured.
pub fn row(a: &TaskReport, o: &Outcome, gpumuxd_priority: i32, wrong_blocks: u64) -> Row {
    let ms = |v: Option<f64>| v.map(|x| x * 1e3);
    let n = o.responses_s.len();
    let worst = ms(quantile(&o.responses_s, 1.0));
    let held = o.held_over_stated.iter().copied().fold(0.0, f64::max);
    let verdict = match (a.status, a.response) {
        (Status::Meets, Some(r)) => {
            let mut why = Vec::new();
            if o.not_run > 0 || (n as u64) < o.jobs_expected() {
                why.push(format!("{} of {} jobs did not run", o.jobs_expected() - n as u64, o.jobs_expected()));
            }
            if let Some(w) = worst.filter(|w| *w > r) {
                why.push(format!("worst {w:.3} ms > R {r:.3} ms"));
            }
            if wrong_blocks > 0 {
                why.push(format!("{wrong_blocks} blocks wrote wrong output"));
            }
            let overran = held > 1.0;
            if overran {
                let j = o.held_over_stated.iter().position(|h| *h == held).unwrap_or(0);
                let kind = a.subtasks.get(j).map_or("?", |s| s.resource.name());
                why.push(format!(
                    "subtask {} ({kind}) held its resource {:.0}% of its stated time",
                    j + 1,
                    held * 100.0
                ));
            }
            match (why.len() - usize::from(overran), overran) {
                (0, _) => Verdict::WithinBound,
                _ if wrong_blocks > 0 => Verdict::Violation(why.join("; ")),
                (_, true) => Verdict::Overrun(why.join("; ")),
                (_, false) => Verdict::Violation(why.join("; ")),
            }
        }
        (Status::Meets, None) => Verdict::NotChecked("no bound".into()),
        (Status::Misses | Status::NotConverged, _) => Verdict::NotChecked("R > D: misses expected".into()),
        (Status::Diverges, _) => Verdict::NotChecked("no finite bound: misses expected".into()),
        (Status::NotAnalysed, _) => Verdict::NotChecked("not analysed: misses expected".into()),
    };
    Row {
        name: a.name.clone(),
        priority: a.priority,
        gpumuxd_priority,
        mode: a.mode.name().to_string(),
        jobs: o.released,
        completed: n as u64,
        misses: o.misses + o.not_run,
        not_run: o.not_run,
        worst_ms: worst,
        p99_ms: ms(quantile(&o.responses_s, 0.99)),
        mean_ms: (n > 0).then(|| o.responses_s.iter().sum::<f64>() / n as f64 * 1e3),
        bound_ms: a.response,
        deadline_ms: a.deadline,
        analysis: a.status,
        held_over_stated: held,
        held_over_stated_by_subtask: o.held_over_stated.clone(),
        worst_job: o.responses_s.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(k, _)| k),
        wrong_blocks,
        verdict,
    }
}

impl Outcome {
    /// Jobs that should have run: every one released.
    pub fn jobs_expected(&self) -> u64 {
        self.released
    }
}

/// The whole run, as `--json` writes it.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// The task-set file.
    pub file: String,
    /// The mode-assignment method.
    pub method: String,
    /// Whether the analysis finds every task meeting its deadline under these modes.
    pub schedulable_by_analysis: bool,
    /// The device, in gpumuxd's words.
    pub device: String,
    /// GPUs used.
    pub gpus: usize,
    /// `global` or `partitioned`.
    pub dispatch: String,
    /// Seconds of releases.
    pub seconds: f64,
    /// The share of each stated time a subtask aims at.
    pub fill: f64,
    /// The calibration (slowest GPU).
    pub fits: Fits,
    /// One per task, in priority order.
    pub tasks: Vec<Row>,
    /// Tasks with a violation (not counting overruns).
    pub violations: usize,
    /// Tasks over their bound after a subtask overran its stated time.
    pub overruns: usize,
    /// Jobs past their deadline, all tasks.
    pub misses: u64,
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.2}"))
}

/// The table and the verdict lines.
pub fn render(r: &RunReport) -> String {
    let mut out = String::new();
    let f = &r.fits;
    let _ = writeln!(
        out,
        "{}: {} tasks, method {}, {} on {} GPU(s) ({} dispatch), {} s, fill {}",
        r.file,
        r.tasks.len(),
        r.method,
        r.device,
        r.gpus,
        r.dispatch,
        r.seconds,
        r.fill
    );
    let _ = writeln!(
        out,
        "calibration (slowest GPU): copy up {:.0} us + {:.2} GB/s, down {:.0} us + {:.2} GB/s; kernel {:.0} us + {:.2} ns/iteration, half of it {:.0} us + {:.2} ns/iteration",
        f.upload.fixed_s * 1e6,
        1e-9 / f.upload.per_unit_s,
        f.download.fixed_s * 1e6,
        1e-9 / f.download.per_unit_s,
        f.whole.fixed_s * 1e6,
        f.whole.per_unit_s * 1e9,
        f.half.fixed_s * 1e6,
        f.half.per_unit_s * 1e9
    );
    let _ = writeln!(
        out,
        "analysis: {}",
        if r.schedulable_by_analysis {
            "schedulable (every R <= D)"
        } else {
            "not schedulable by analysis; misses expected"
        }
    );
    let _ = writeln!(
        out,
        "{:>4}  {:<20} {:<6} {:>6} {:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>7}  verdict",
        "prio", "task", "mode", "jobs", "done", "miss", "worst ms", "p99 ms", "R ms", "D ms", "held/C"
    );
    for t in &r.tasks {
        let verdict = match &t.verdict {
            Verdict::WithinBound => "ok (worst <= R)".to_string(),
            Verdict::Violation(why) => format!("VIOLATION: {why}"),
            Verdict::Overrun(why) => format!("VIOLATION (WCET overrun): {why}"),
            Verdict::NotChecked(why) => format!("not checked ({why})"),
        };
        let _ = writeln!(
            out,
            "{:>4}  {:<20} {:<6} {:>6} {:>6} {:>5} {:>10} {:>10} {:>10} {:>10.2} {:>7.2}  {}",
            t.priority,
            t.name,
            t.mode,
            t.jobs,
            t.completed,
            t.misses,
            opt(t.worst_ms),
            opt(t.p99_ms),
            opt(t.bound_ms),
            t.deadline_ms,
            t.held_over_stated,
            verdict
        );
    }
    let _ = writeln!(out, "deadline misses: {} (all tasks)", r.misses);
    if r.violations > 0 {
        let _ = writeln!(
            out,
            "VIOLATION: {} task(s) the analysis bounds went over their bound or lost jobs with every subtask within its \
             stated time: a bug in the analysis or the runtime",
            r.violations
        );
    }
    if r.overruns > 0 {
        let _ = writeln!(
            out,
            "VIOLATION (WCET overrun): {} task(s) went over their bound after a subtask held its resource longer than \
             its stated time: the host or the device ran slower than calibrated (a busy host?), so the analysis's \
             premise did not hold",
            r.overruns
        );
    }
    if r.violations == 0 && r.overruns == 0 {
        let _ = writeln!(out, "every task the analysis bounds stayed within its bound");
    }
    out.push_str(
        "legend: R = the analysis's bound on the response time under these modes; worst, p99 = measured \
         (release to the end of the last subtask); held/C = the longest a subtask held its resource over its \
         stated time\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_rt::Mode;

    fn analysed(status: Status, response: Option<f64>) -> TaskReport {
        TaskReport {
            name: "t".into(),
            priority: 1,
            mode: Mode::Single,
            period: 100.0,
            deadline: 100.0,
            response,
            slack: response.map(|r| 100.0 - r),
            status,
            note: None,
            subtasks: Vec::new(),
        }
    }

    fn outcome(responses_ms: &[f64]) -> Outcome {
        Outcome {
            released: responses_ms.len() as u64,
            responses_s: responses_ms.iter().map(|r| r / 1e3).collect(),
            misses: responses_ms.iter().filter(|r| **r > 100.0).count() as u64,
            not_run: 0,
            held_over_stated: vec![0.9, 0.95],
        }
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.99), Some(198.0));
        assert_eq!(quantile(&v, 1.0), Some(200.0));
        assert_eq!(quantile(&[5.0], 0.99), Some(5.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn a_bounded_task_within_its_bound_passes_and_over_it_is_a_violation() {
        let ok = row(&analysed(Status::Meets, Some(50.0)), &outcome(&[20.0, 49.9, 30.0]), 10, 0);
        assert_eq!(ok.verdict, Verdict::WithinBound);
        assert!((ok.worst_ms.unwrap() - 49.9).abs() < 1e-9);
        assert_eq!((ok.jobs, ok.completed, ok.misses), (3, 3, 0));
        let over = row(&analysed(Status::Meets, Some(50.0)), &outcome(&[20.0, 50.5]), 10, 0);
        match over.verdict {
            Verdict::Violation(why) => assert!(why.contains("50.500 ms > R 50.000"), "{why}"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn lost_jobs_and_wrong_output_are_violations_and_unbounded_tasks_are_not_checked() {
        let mut o = outcome(&[10.0]);
        o.released = 3;
        o.not_run = 2;
        match row(&analysed(Status::Meets, Some(50.0)), &o, 1, 0).verdict {
            Verdict::Violation(why) => assert!(why.contains("2 of 3 jobs did not run"), "{why}"),
            v => panic!("{v:?}"),
        }
        match row(&analysed(Status::Meets, Some(50.0)), &outcome(&[10.0]), 1, 7).verdict {
            Verdict::Violation(why) => assert!(why.contains("7 blocks"), "{why}"),
            v => panic!("{v:?}"),
        }
        let mut slow = outcome(&[20.0, 60.0]);
        slow.held_over_stated = vec![0.9, 1.7];
        match row(&analysed(Status::Meets, Some(50.0)), &slow, 1, 0).verdict {
            Verdict::Overrun(why) => assert!(why.contains("subtask 2") && why.contains("170%"), "{why}"),
            v => panic!("{v:?}"),
        }
        let late = row(&analysed(Status::Misses, Some(150.0)), &outcome(&[120.0, 160.0]), 1, 0);
        assert!(matches!(late.verdict, Verdict::NotChecked(ref why) if why.contains("misses expected")));
        assert_eq!(late.misses, 2);
    }
}

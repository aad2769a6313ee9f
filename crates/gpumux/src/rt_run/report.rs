//! The measured-versus-bound table: per task its mode, jobs, worst and p99 response time,
//! the analysis's bound `R`, the deadline, and a verdict.
//!
//! A task the analysis says meets its deadline (`R ≤ D`) is checked: every job must have
//! run and its worst response must be at most `R`. Anything else is a VIOLATION, and the run
//! exits non-zero. The analysis takes each subtask's stated time as a worst case; when the
//! runtime's subtasks held their resources longer than that (a busy host, a slow device),
//! the premise failed: a task whose jobs that started at their release went over its bound
//! by no more than the overruns that could fall into such a job ([`allowance`]) is reported
//! as a VIOLATION (WCET overrun), one over it by more as a plain VIOLATION, a bug in the
//! analysis or in this runtime's dispatch. (Jobs
//! that started late, after their own previous job, are the tail of an earlier job's excess,
//! which this judges.) A task whose bound exceeds
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

/// One subtask of a row: the analysis's bound on its response beside the measured one.
#[derive(Clone, Debug, Serialize)]
pub struct SubtaskRow {
    /// `cpu`, `pci` or `gpu`.
    pub resource: String,
    /// `C` in the task's mode, ms.
    pub stated_ms: f64,
    /// The analysis's `w_ij` (its response from the previous subtask's end), ms.
    pub w_ms: f64,
    /// The longest measured response of the subtask (previous subtask's end to its end), ms.
    pub worst_ms: f64,
    /// The longest it held its resource, over `C`.
    pub held_over_stated: f64,
}

/// A task's verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "verdict", content = "why", rename_all = "snake_case")]
pub enum Verdict {
    /// Checked: every job ran, the worst response is at most `R`.
    WithinBound,
    /// Checked and failed beyond what the subtasks' overruns explain: the analysis or the
    /// runtime's dispatch is wrong (why).
    Violation(String),
    /// Checked and failed within the allowance of the subtasks' overruns (module doc): the
    /// host or the device was slower than calibrated, so the analysis's premise, a worst-case
    /// time per subtask, did not hold. Still a failure of the run (why).
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
    /// The most one job's subtasks held their resources beyond their stated times, ms.
    pub overrun_ms: f64,
    /// Blocks whose output was wrong (a real GPU; 0 on a simulated one).
    pub wrong_blocks: u64,
    /// Kernels launched on each GPU (a multi-mode kernel counts on both).
    pub launches_per_gpu: Vec<u64>,
    /// Per subtask, the analysis's `w` beside the measured worst.
    pub subtasks: Vec<SubtaskRow>,
    /// The verdict.
    pub verdict: Verdict,
}

/// How much the subtasks' overruns could have added to task `i`'s worst job that started at
/// its release, seconds: its own job's overrun, and for every other task `k` the overrun of
/// one of its jobs times the jobs of `k` that can fall into that window,
/// `⌈w / T_k⌉ + 1` (`w` the job's response). An estimate, not a bound: it only sorts a
/// failure into overrun or violation, and it is 0 when nothing overran.
pub fn allowance(i: usize, outcomes: &[Outcome], periods_s: &[f64]) -> f64 {
    let Some(own) = outcomes.get(i) else { return 0.0 };
    let w = own.worst_fresh_s;
    own.overrun_s
        + outcomes
            .iter()
            .zip(periods_s)
            .enumerate()
            .filter(|(k, _)| *k != i)
            .map(|(_, (o, t))| if *t > 0.0 { ((w / t).ceil() + 1.0) * o.overrun_s } else { 0.0 })
            .sum::<f64>()
}

/// Builds a task's row from its analysis and what its run measured (and the kernels it
/// launched on each GPU). Times of the analysis are in the file's unit, `unit_ms`
/// milliseconds each; `allowance_ms` is the task's [`allowance`], in ms (module doc).
pub fn row(
    a: &TaskReport,
    o: &Outcome,
    gpumuxd_priority: i32,
    wrong_blocks: u64,
    unit_ms: f64,
    allowance_ms: f64,
    launches_per_gpu: Vec<u64>,
) -> Row {
    let ms = |v: Option<f64>| v.map(|x| x * 1e3);
    let n = o.responses_s.len();
    let worst = ms(quantile(&o.responses_s, 1.0));
    let held = o.held_over_stated.iter().copied().fold(0.0, f64::max);
    let bound = a.response.map(|r| r * unit_ms);
    let subtasks: Vec<SubtaskRow> = a
        .subtasks
        .iter()
        .enumerate()
        .map(|(j, s)| SubtaskRow {
            resource: s.resource.name().to_string(),
            stated_ms: s.cost * unit_ms,
            w_ms: s.w * unit_ms,
            worst_ms: o.subtask_worst_s.get(j).copied().unwrap_or(0.0) * 1e3,
            held_over_stated: o.held_over_stated.get(j).copied().unwrap_or(0.0),
        })
        .collect();
    // Where a failure shows first: the first subtask whose measured response passed its `w`.
    let first_over_w = subtasks.iter().enumerate().find(|(_, s)| s.worst_ms > s.w_ms).map(|(j, s)| {
        format!(
            "first over its w: subtask {} ({}) {:.3} ms > w {:.3} ms (held {:.0}% of C)",
            j + 1,
            s.resource,
            s.worst_ms,
            s.w_ms,
            s.held_over_stated * 100.0
        )
    });
    let verdict = match (a.status, bound) {
        (Status::Meets, Some(r)) => {
            let mut why = Vec::new();
            let lost = o.released.saturating_sub(n as u64);
            if lost > 0 {
                why.push(format!("{lost} of {} jobs did not run", o.released));
            }
            let over = worst.map_or(0.0, |w| w - r);
            if over > 0.0 {
                why.push(format!("worst {:.3} ms > R {r:.3} ms", r + over));
            }
            if wrong_blocks > 0 {
                why.push(format!("{wrong_blocks} blocks wrote wrong output"));
            }
            if !why.is_empty() {
                why.extend(first_over_w);
            }
            if why.is_empty() {
                Verdict::WithinBound
            } else if wrong_blocks == 0 && allowance_ms > 0.0 && o.worst_fresh_s * 1e3 - r <= allowance_ms {
                why.push(format!(
                    "subtasks overran their stated times by up to {allowance_ms:.3} ms a job (all tasks together)"
                ));
                Verdict::Overrun(why.join("; "))
            } else {
                if allowance_ms > 0.0 {
                    why.push(format!("more than the subtasks' overruns ({allowance_ms:.3} ms) explain"));
                }
                Verdict::Violation(why.join("; "))
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
        bound_ms: bound,
        deadline_ms: a.deadline * unit_ms,
        analysis: a.status,
        held_over_stated: held,
        held_over_stated_by_subtask: o.held_over_stated.clone(),
        overrun_ms: o.overrun_s * 1e3,
        worst_job: o.responses_s.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).map(|(k, _)| k),
        wrong_blocks,
        launches_per_gpu,
        subtasks,
        verdict,
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
    /// Milliseconds per time unit of the file.
    pub unit_ms: f64,
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
        "{}: {} tasks (1 unit = {} ms), method {}, {} on {} GPU(s) ({} dispatch), {} s, fill {}",
        r.file,
        r.tasks.len(),
        r.unit_ms,
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
        "prio", "task", "mode", "jobs", "done", "miss", "worst ms", "p99 ms", "R ms", "D ms", "over ms"
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
            t.overrun_ms,
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
            "VIOLATION (WCET overrun): {} task(s) went over their bound by no more than their subtasks overran their \
             stated times: the host or the device ran slower than calibrated (a busy host?), so the analysis's \
             premise did not hold",
            r.overruns
        );
    }
    if r.violations == 0 && r.overruns == 0 {
        let _ = writeln!(out, "every task the analysis bounds stayed within its bound");
    }
    out.push_str(
        "legend: R = the analysis's bound on the response time under these modes; worst, p99 = measured \
         (release to the end of the last subtask); over = the most one job's subtasks held their resources beyond \
         their stated times\n",
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
            overrun_s: 0.0,
            subtask_worst_s: Vec::new(),
            worst_fresh_s: responses_ms.iter().copied().fold(0.0, f64::max) / 1e3,
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
        let ok = row(&analysed(Status::Meets, Some(50.0)), &outcome(&[20.0, 49.9, 30.0]), 10, 0, 1.0, 0.0, Vec::new());
        assert_eq!(ok.verdict, Verdict::WithinBound);
        assert!((ok.worst_ms.unwrap() - 49.9).abs() < 1e-9);
        assert_eq!((ok.jobs, ok.completed, ok.misses), (3, 3, 0));
        let over = row(&analysed(Status::Meets, Some(50.0)), &outcome(&[20.0, 50.5]), 10, 0, 1.0, 0.0, Vec::new());
        match over.verdict {
            Verdict::Violation(why) => assert!(why.contains("50.500 ms > R 50.000"), "{why}"),
            v => panic!("{v:?}"),
        }
        // The file's unit scales R and D: 50 units of 0.1 ms are 5 ms.
        let fast = row(&analysed(Status::Meets, Some(50.0)), &outcome(&[4.0, 5.5]), 10, 0, 0.1, 0.0, Vec::new());
        assert_eq!((fast.bound_ms, fast.deadline_ms), (Some(5.0), 10.0));
        assert!(matches!(fast.verdict, Verdict::Violation(_)), "{:?}", fast.verdict);
    }

    #[test]
    fn overruns_explain_an_excess_up_to_their_allowance_and_no_further() {
        // 0.5 ms over R: explained by an allowance of 0.8 ms, not by one of 0.3 ms.
        let slow = outcome(&[20.0, 50.5]);
        match row(&analysed(Status::Meets, Some(50.0)), &slow, 1, 0, 1.0, 0.8, Vec::new()).verdict {
            Verdict::Overrun(why) => assert!(why.contains("0.800 ms a job"), "{why}"),
            v => panic!("{v:?}"),
        }
        match row(&analysed(Status::Meets, Some(50.0)), &slow, 1, 0, 1.0, 0.3, Vec::new()).verdict {
            Verdict::Violation(why) => assert!(why.contains("more than the subtasks' overruns"), "{why}"),
            v => panic!("{v:?}"),
        }
        // Jobs late after their own previous job (a backlog) are judged by the first of them.
        let mut backlog = outcome(&[20.0, 50.5, 300.0]);
        backlog.worst_fresh_s = 0.0505;
        assert!(matches!(
            row(&analysed(Status::Meets, Some(50.0)), &backlog, 1, 0, 1.0, 0.8, Vec::new()).verdict,
            Verdict::Overrun(_)
        ));
        // Within R an overrun changes nothing.
        let ok = row(&analysed(Status::Meets, Some(50.0)), &outcome(&[20.0]), 1, 0, 1.0, 5.0, Vec::new());
        assert_eq!(ok.verdict, Verdict::WithinBound);
    }

    #[test]
    fn the_allowance_counts_every_job_of_another_task_that_can_fall_into_the_window() {
        let mut a = outcome(&[30.0]);
        a.overrun_s = 0.002;
        let mut b = outcome(&[95.0]);
        b.overrun_s = 0.001;
        // Task 1 (b): its own 1 ms, and a's 2 ms for ⌈95 / 40⌉ + 1 = 4 jobs of a.
        let got = allowance(1, &[a.clone(), b.clone()], &[0.04, 0.1]);
        assert!((got - (0.001 + 4.0 * 0.002)).abs() < 1e-12, "{got}");
        // Task 0 (a): its own 2 ms, and b's 1 ms for ⌈30 / 100⌉ + 1 = 2 jobs.
        assert!((allowance(0, &[a, b], &[0.04, 0.1]) - 0.004).abs() < 1e-12);
        assert_eq!(allowance(0, &[outcome(&[10.0])], &[0.04]), 0.0, "nothing overran");
    }

    #[test]
    fn a_violation_names_the_first_subtask_over_its_w() {
        use gpumux_rt::analysis::SubtaskReport;
        use gpumux_rt::Resource;
        let mut a = analysed(Status::Meets, Some(12.0));
        let sub = |resource, cost, w| SubtaskReport { resource, cost, blocking: 0.0, jitter: 0.0, w };
        a.subtasks = vec![sub(Resource::Pci, 1.0, 2.0), sub(Resource::Gpu, 8.0, 10.0)];
        let mut o = outcome(&[13.5]);
        o.subtask_worst_s = vec![0.0015, 0.012];
        let r = row(&a, &o, 1, 0, 1.0, 0.0, Vec::new());
        assert_eq!(r.subtasks.len(), 2);
        assert_eq!((r.subtasks[1].w_ms, r.subtasks[1].stated_ms), (10.0, 8.0));
        match r.verdict {
            Verdict::Violation(why) => assert!(why.contains("subtask 2 (gpu) 12.000 ms > w 10.000 ms"), "{why}"),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn lost_jobs_and_wrong_output_are_violations_and_unbounded_tasks_are_not_checked() {
        let mut o = outcome(&[10.0]);
        o.released = 3;
        o.not_run = 2;
        match row(&analysed(Status::Meets, Some(50.0)), &o, 1, 0, 1.0, 0.0, Vec::new()).verdict {
            Verdict::Violation(why) => assert!(why.contains("2 of 3 jobs did not run"), "{why}"),
            v => panic!("{v:?}"),
        }
        match row(&analysed(Status::Meets, Some(50.0)), &outcome(&[10.0]), 1, 7, 1.0, 9.0, Vec::new()).verdict {
            Verdict::Violation(why) => assert!(why.contains("7 blocks"), "{why}"),
            v => panic!("{v:?}"),
        }
        let late = row(&analysed(Status::Misses, Some(150.0)), &outcome(&[120.0, 160.0]), 1, 0, 1.0, 0.0, Vec::new());
        assert!(matches!(late.verdict, Verdict::NotChecked(ref why) if why.contains("misses expected")));
        assert_eq!(late.misses, 2);
    }
}

//! End-to-end response-time analysis (seed 004, Section IV-B: holistic analysis for
//! fixed-priority pipelines, after Tindell & Clark).
//!
//! For task `τ_i` (tasks in priority order) and each subtask `j`:
//!
//! ```text
//! w_ij^(a+1) = C_ij^{M_i} + B_ij
//!            + ⌈ Σ_{k ∈ hp(i)} Σ_{p : H_kp = H_ij} ⌈(J_kp + w_ij^(a)) / T_k⌉ · α_kp  /  m_{H_ij} ⌉
//! α_kp = C_kp^S if H_ij = GPU, else C_kp^{M_k}
//! J_ij = Σ_{k<j} w_ik − Σ_{k<j} C_ik^{M_i}     (J_i1 = 0)
//! R_i  = Σ_j w_ij
//! B_ij = max_{k ∈ lp(i), p : H_kp = H_ij} C_kp^{M_k}   for H_ij ∈ {GPU, PCI}, 0 for CPU
//!        (C replaced by the chunk length when a subtask declares `chunk`, our extension)
//! ```
//!
//! The jitters `J_kp` of a higher-priority task depend only on tasks of even higher priority
//! (and on blocking, which is known up front), so one pass in priority order computes every
//! `w` — no outer fixed point over the whole set is needed.
//!
//! **Termination.** The right-hand side is monotone in `w`, and because of the outer ceiling
//! every new iterate differs from `C + B` by a whole number: an iterate that changes grows by
//! at least one time unit. The iteration is stopped as soon as the task's running sum
//! `Σ w` exceeds a cap (its deadline when only schedulability matters, `horizon · D_i` in
//! reports), so it performs at most `cap` steps. An iteration-count guard backs this up.
//!
//! We start at `w = C + B` instead of the paper's `w = 0`: both are below the least fixed
//! point of a monotone map, so both converge to it; the former saves one or two steps.

use serde::Serialize;

use crate::model::{Mode, Resource, Subtask, TaskSet};

/// A higher-priority subtask that interferes on some resource: `(J_kp, α_kp, T_k)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Interferer {
    pub jitter: f64,
    pub alpha: f64,
    pub period: f64,
}

/// Safety net on the number of fixed-point steps of one `w` (the cap bounds it anyway).
pub const MAX_ITERATIONS: u32 = 1_000_000;

/// `α_kp` of the paper: single-mode time on the GPU (a kernel split over two GPUs still uses
/// about its single-mode GPU time in total), the mode's own time elsewhere.
#[inline]
pub(crate) fn alpha(s: &Subtask, mode: Mode) -> f64 {
    if s.resource == Resource::Gpu {
        s.single
    } else {
        s.cost(mode)
    }
}

/// Computes the `w_ij` of one task given the interferers of higher priority on each resource.
///
/// On success returns `R_i` and leaves `w` and `J` per subtask in `w_out`/`j_out`. When the
/// running sum of `w` exceeds `cap`, returns `Err(value reached)` (a lower bound on `R_i`).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn task_response(
    subtasks: &[Subtask],
    mode: Mode,
    blocking: &[f64; 3],
    interf: &[Vec<Interferer>; 3],
    units: &[f64; 3],
    cap: f64,
    w_out: &mut Vec<f64>,
    j_out: &mut Vec<f64>,
) -> Result<f64, f64> {
    w_out.clear();
    j_out.clear();
    let mut prefix_w = 0.0;
    let mut prefix_c = 0.0;
    for s in subtasks {
        let r = s.resource.index();
        let c = s.cost(mode);
        let base = c + blocking[r];
        let jitter = prefix_w - prefix_c;
        let list = &interf[r];
        let m = units[r];
        let mut w = base;
        if prefix_w + w > cap {
            return Err(prefix_w + w);
        }
        if !list.is_empty() {
            let mut steps = 0u32;
            loop {
                let mut sum = 0.0;
                for it in list {
                    sum += ((it.jitter + w) / it.period).ceil() * it.alpha;
                }
                let next = base + (sum / m).ceil();
                if next <= w {
                    break;
                }
                w = next;
                if prefix_w + w > cap {
                    return Err(prefix_w + w);
                }
                steps += 1;
                if steps >= MAX_ITERATIONS {
                    return Err(prefix_w + w);
                }
            }
        }
        w_out.push(w);
        j_out.push(jitter);
        prefix_w += w;
        prefix_c += c;
    }
    Ok(prefix_w)
}

/// Per-task blocking `B_i[r] = max_{k > i, p: H_kp = r} C_kp^{M_k}` (or the chunk length) for the non-preemptive
/// resources (GPU, PCI); CPU entries stay 0.
pub(crate) fn blocking_into(set: &TaskSet, modes: &[Mode], out: &mut Vec<[f64; 3]>) {
    out.clear();
    out.resize(set.tasks.len(), [0.0; 3]);
    let mut suffix = [0.0f64; 3];
    for i in (0..set.tasks.len()).rev() {
        out[i] = suffix;
        for s in &set.tasks[i].subtasks {
            if s.resource.is_non_preemptive() {
                let r = s.resource.index();
                suffix[r] = suffix[r].max(s.np_len(modes[i]));
            }
        }
    }
}

pub(crate) fn units_of(set: &TaskSet) -> [f64; 3] {
    let p = set.platform;
    [p.units(Resource::Cpu) as f64, p.units(Resource::Pci) as f64, p.units(Resource::Gpu) as f64]
}

/// Reusable buffers so that the thousands of analyses an assignment method runs per task set
/// do not allocate.
#[derive(Default, Debug)]
pub struct Analyzer {
    interf: [Vec<Interferer>; 3],
    blocking: Vec<[f64; 3]>,
    w: Vec<f64>,
    j: Vec<f64>,
    /// Number of task-set analyses run (for statistics and benchmarks).
    pub calls: u64,
}

impl Analyzer {
    /// New analyzer with empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// `max_i R_i / D_i` if every task has `R_i <= bound · D_i`, else `f64::INFINITY`
    /// (stops at the first task that passes the bound). `bound = 1` is the schedulability
    /// test; GEMA passes its best value so far to prune candidates early.
    pub fn max_ratio(&mut self, set: &TaskSet, modes: &[Mode], bound: f64) -> f64 {
        debug_assert_eq!(set.tasks.len(), modes.len());
        self.calls += 1;
        blocking_into(set, modes, &mut self.blocking);
        let units = units_of(set);
        for l in &mut self.interf {
            l.clear();
        }
        let mut worst = 0.0f64;
        for (i, t) in set.tasks.iter().enumerate() {
            let cap = bound * t.deadline;
            match task_response(
                &t.subtasks,
                modes[i],
                &self.blocking[i],
                &self.interf,
                &units,
                cap,
                &mut self.w,
                &mut self.j,
            ) {
                Ok(r) => worst = worst.max(r / t.deadline),
                Err(_) => return f64::INFINITY,
            }
            push_interferers(&mut self.interf, &t.subtasks, modes[i], t.period, &self.j);
        }
        worst
    }

    /// True when every task meets its deadline (`R_i <= D_i`).
    pub fn schedulable(&mut self, set: &TaskSet, modes: &[Mode]) -> bool {
        self.max_ratio(set, modes, 1.0) <= 1.0
    }

    /// Full per-task, per-subtask report. Responses are computed up to `horizon · D_i`; a task
    /// past that is reported as unbounded and tasks below it are not analysed (their
    /// interference would depend on its unknown jitters).
    pub fn analyze(&mut self, set: &TaskSet, modes: &[Mode], horizon: f64) -> Analysis {
        self.calls += 1;
        blocking_into(set, modes, &mut self.blocking);
        let units = units_of(set);
        for l in &mut self.interf {
            l.clear();
        }
        let mut tasks = Vec::with_capacity(set.tasks.len());
        let mut broken: Option<String> = None;
        for (i, t) in set.tasks.iter().enumerate() {
            let mode = modes[i];
            let mut rep = TaskReport {
                name: t.name.clone(),
                priority: i + 1,
                mode,
                period: t.period,
                deadline: t.deadline,
                response: None,
                slack: None,
                status: Status::NotAnalysed,
                note: None,
                subtasks: Vec::new(),
            };
            if let Some(by) = &broken {
                rep.note = Some(format!("higher-priority task `{by}` has no bounded response"));
                tasks.push(rep);
                continue;
            }
            match task_response(
                &t.subtasks,
                mode,
                &self.blocking[i],
                &self.interf,
                &units,
                horizon * t.deadline,
                &mut self.w,
                &mut self.j,
            ) {
                Ok(r) => {
                    rep.response = Some(r);
                    rep.slack = Some(t.deadline - r);
                    rep.status = if r <= t.deadline { Status::Meets } else { Status::Misses };
                    rep.subtasks = t
                        .subtasks
                        .iter()
                        .enumerate()
                        .map(|(j, s)| SubtaskReport {
                            resource: s.resource,
                            cost: s.cost(mode),
                            blocking: self.blocking[i][s.resource.index()],
                            jitter: self.j[j],
                            w: self.w[j],
                        })
                        .collect();
                    push_interferers(&mut self.interf, &t.subtasks, mode, t.period, &self.j);
                }
                Err(reached) => {
                    rep.status = Status::Unbounded;
                    rep.note = Some(format!("response exceeds {horizon} x deadline (reached {reached:.1})"));
                    broken = Some(t.name.clone());
                }
            }
            tasks.push(rep);
        }
        let schedulable = tasks.iter().all(|t| t.status == Status::Meets);
        Analysis { schedulable, tasks }
    }
}

/// After `τ_i` is analysed, its subtasks become interferers of every lower-priority task.
pub(crate) fn push_interferers(
    interf: &mut [Vec<Interferer>; 3],
    subtasks: &[Subtask],
    mode: Mode,
    period: f64,
    jitters: &[f64],
) {
    for (s, &jitter) in subtasks.iter().zip(jitters) {
        interf[s.resource.index()].push(Interferer { jitter, alpha: alpha(s, mode), period });
    }
}

/// Verdict for one task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// `R_i <= D_i`.
    Meets,
    /// Bounded but `R_i > D_i`.
    Misses,
    /// The iteration passed the horizon: unschedulable, `R_i` unknown.
    Unbounded,
    /// A higher-priority task is unbounded, so this one cannot be analysed.
    NotAnalysed,
}

/// Per-subtask detail of the analysis.
#[derive(Clone, Debug, Serialize)]
pub struct SubtaskReport {
    /// `H_ij`.
    pub resource: Resource,
    /// `C_ij^{M_i}`.
    pub cost: f64,
    /// `B_ij`.
    pub blocking: f64,
    /// `J_ij`.
    pub jitter: f64,
    /// `w_ij`.
    pub w: f64,
}

/// Per-task result.
#[derive(Clone, Debug, Serialize)]
pub struct TaskReport {
    /// Task name.
    pub name: String,
    /// 1 = highest.
    pub priority: usize,
    /// `M_i` analysed.
    pub mode: Mode,
    /// `T_i`.
    pub period: f64,
    /// `D_i`.
    pub deadline: f64,
    /// `R_i` when bounded.
    pub response: Option<f64>,
    /// `D_i − R_i` when bounded.
    pub slack: Option<f64>,
    /// Verdict.
    pub status: Status,
    /// Explanation for unbounded / not analysed tasks.
    pub note: Option<String>,
    /// Per-subtask `w`, `J`, `B`.
    pub subtasks: Vec<SubtaskReport>,
}

/// Result of analysing a whole set under one mode assignment.
#[derive(Clone, Debug, Serialize)]
pub struct Analysis {
    /// True when every task meets its deadline.
    pub schedulable: bool,
    /// Per task, in priority order.
    pub tasks: Vec<TaskReport>,
}

/// Convenience: schedulability of `set` under `modes`.
pub fn is_schedulable(set: &TaskSet, modes: &[Mode]) -> bool {
    Analyzer::new().schedulable(set, modes)
}

/// Convenience: full report with the default horizon of 10 deadlines.
pub fn analyze(set: &TaskSet, modes: &[Mode]) -> Analysis {
    Analyzer::new().analyze(set, modes, DEFAULT_HORIZON)
}

/// Default horizon (in deadlines) up to which reports compute responses past the deadline.
pub const DEFAULT_HORIZON: f64 = 10.0;

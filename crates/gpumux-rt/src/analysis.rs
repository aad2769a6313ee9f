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
//! at least one time unit. Before iterating, the interferers' utilisation per unit
//! `U = Σ α / (T · m)` decides: `U >= 1` diverges (every step adds at least `C + B > 0`);
//! `U < 1` has a finite least fixed point, below the closed form `A / (1 − U)`
//! (`closed_form_bound`). Yes/no tests stop as soon as the task's running sum `Σ w` exceeds
//! a cap (its deadline); reports have no cap (there used to be a horizon of 10 deadlines,
//! which called finite responses past it unbounded) and fall back to the closed form after
//! an iteration limit, reported as `not_converged` when that bound exceeds the deadline.
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

/// Default limit on the fixed-point steps of one `w_ij` in reports (`rt analyze
/// --max-iterations`). Past it the closed-form bound below is used instead of the least fixed
/// point, so a report never needs a horizon: a response is either computed, bounded in closed
/// form, or proven to diverge.
pub const MAX_ITERATIONS: u32 = 1_000_000;

/// How the iteration of one task ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Outcome {
    /// Every `w_ij` reached its least fixed point: `R_i` is the analysis's bound.
    Converged(f64),
    /// Some `w_ij` had not reached its fixed point after the iteration limit; its closed-form
    /// bound `A / (1 − U)` was used instead (sound, looser). `R_i` is still an upper bound.
    ClosedForm {
        /// The response bound.
        response: f64,
        /// The subtask (0-based) that did not converge first.
        subtask: usize,
    },
    /// The running `Σ w` passed the caller's cap (yes/no tests only): `R_i > cap`.
    Capped(f64),
    /// Higher-priority work on the subtask's resource has utilisation `U >= 1`: `w_ij` grows
    /// without bound (`w^(a+1) >= C + B + U·w^(a) > w^(a)` for every `a`).
    Diverges {
        /// The subtask (0-based).
        subtask: usize,
        /// Its resource.
        resource: Resource,
        /// `Σ α_kp / (T_k · m)` of its interferers.
        utilisation: f64,
    },
}

impl Outcome {
    /// `R_i` when the task was bounded within the cap (exactly or in closed form).
    pub(crate) fn response(self) -> Option<f64> {
        match self {
            Outcome::Converged(r) | Outcome::ClosedForm { response: r, .. } => Some(r),
            Outcome::Capped(_) | Outcome::Diverges { .. } => None,
        }
    }
}

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

/// Utilisation of a resource by the interferers, per unit: `U = Σ α / (T · m)`.
fn interference_utilisation(list: &[Interferer], m: f64) -> f64 {
    list.iter().map(|it| it.alpha / it.period).sum::<f64>() / m
}

/// A closed-form upper bound on the least fixed point of one `w` (needs `U < 1`).
///
/// `⌈x⌉ ≤ x + 1` twice gives `f(w) ≤ A + U·w` with
/// `A = base + 1 + Σ (J_k / T_k + 1) · α_k / m`, so `W = A / (1 − U)` satisfies `f(W) ≤ W`.
/// `f` is monotone and the iteration starts below `W`, so every iterate, and the least fixed
/// point, stays at or below `W`; and any `W` with `f(W) ≤ W` bounds the busy window (the
/// standard response-time argument), so `W` is a sound, if looser, `w`.
fn closed_form_bound(base: f64, list: &[Interferer], m: f64, u: f64) -> f64 {
    let a = base + 1.0 + list.iter().map(|it| (it.jitter / it.period + 1.0) * it.alpha).sum::<f64>() / m;
    a / (1.0 - u)
}

/// Computes the `w_ij` of one task given the interferers of higher priority on each resource.
///
/// Leaves `w` and `J` per subtask in `w_out`/`j_out` (complete for `Converged` and
/// `ClosedForm`). `cap`: stop as soon as the running sum of `w` exceeds it (`f64::INFINITY`
/// in reports, which never stop early). `max_iterations`: fixed-point steps per `w` before
/// the closed-form bound is used.
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn task_response(
    subtasks: &[Subtask],
    mode: Mode,
    blocking: &[f64; 3],
    interf: &[Vec<Interferer>; 3],
    units: &[f64; 3],
    cap: f64,
    max_iterations: u32,
    w_out: &mut Vec<f64>,
    j_out: &mut Vec<f64>,
) -> Outcome {
    w_out.clear();
    j_out.clear();
    let mut prefix_w = 0.0;
    let mut prefix_c = 0.0;
    let mut closed_form: Option<usize> = None;
    for (idx, s) in subtasks.iter().enumerate() {
        let r = s.resource.index();
        let c = s.cost(mode);
        let base = c + blocking[r];
        let jitter = prefix_w - prefix_c;
        let list = &interf[r];
        let m = units[r];
        let mut w = base;
        if prefix_w + w > cap {
            return Outcome::Capped(prefix_w + w);
        }
        if !list.is_empty() {
            // Decided before iterating: with U >= 1 no cap or iteration count is needed to
            // know the answer, and with U < 1 the answer is finite whatever the cap.
            let u = interference_utilisation(list, m);
            if u >= 1.0 {
                return Outcome::Diverges { subtask: idx, resource: s.resource, utilisation: u };
            }
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
                    return Outcome::Capped(prefix_w + w);
                }
                steps += 1;
                if steps >= max_iterations {
                    w = w.max(closed_form_bound(base, list, m, u));
                    closed_form.get_or_insert(idx);
                    if prefix_w + w > cap {
                        return Outcome::Capped(prefix_w + w);
                    }
                    break;
                }
            }
        }
        w_out.push(w);
        j_out.push(jitter);
        prefix_w += w;
        prefix_c += c;
    }
    match closed_form {
        None => Outcome::Converged(prefix_w),
        Some(subtask) => Outcome::ClosedForm { response: prefix_w, subtask },
    }
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
                MAX_ITERATIONS,
                &mut self.w,
                &mut self.j,
            )
            .response()
            {
                Some(r) => worst = worst.max(r / t.deadline),
                None => return f64::INFINITY,
            }
            push_interferers(&mut self.interf, &t.subtasks, modes[i], t.period, &self.j);
        }
        worst
    }

    /// True when every task meets its deadline (`R_i <= D_i`).
    pub fn schedulable(&mut self, set: &TaskSet, modes: &[Mode]) -> bool {
        self.max_ratio(set, modes, 1.0) <= 1.0
    }

    /// Full per-task, per-subtask report, with no horizon: every task's response is computed
    /// (its least fixed point, or after `max_iterations` steps of one `w` the closed-form bound),
    /// or proven to diverge (`U >= 1` on a resource). Tasks below a diverging one are not
    /// analysed: their interference would come from its unbounded jitters.
    pub fn analyze(&mut self, set: &TaskSet, modes: &[Mode], max_iterations: u32) -> Analysis {
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
                rep.note = Some(format!("higher-priority task `{by}` diverges"));
                tasks.push(rep);
                continue;
            }
            let outcome = task_response(
                &t.subtasks,
                mode,
                &self.blocking[i],
                &self.interf,
                &units,
                f64::INFINITY,
                max_iterations.max(1),
                &mut self.w,
                &mut self.j,
            );
            match outcome {
                Outcome::Converged(r) | Outcome::ClosedForm { response: r, .. } => {
                    rep.response = Some(r);
                    rep.slack = Some(t.deadline - r);
                    rep.status = match outcome {
                        // A closed-form bound within the deadline still proves the deadline met.
                        _ if r <= t.deadline => Status::Meets,
                        Outcome::ClosedForm { .. } => Status::NotConverged,
                        _ => Status::Misses,
                    };
                    if let Outcome::ClosedForm { subtask, .. } = outcome {
                        rep.note = Some(format!(
                            "subtask {} did not converge within {max_iterations} iterations; R is its closed-form bound",
                            subtask + 1
                        ));
                    }
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
                Outcome::Diverges { subtask, resource, utilisation } => {
                    rep.status = Status::Diverges;
                    rep.note = Some(format!(
                        "subtask {} ({}): higher-priority utilisation {utilisation:.4} >= 1 per unit",
                        subtask + 1,
                        resource.name()
                    ));
                    broken = Some(t.name.clone());
                }
                // The cap is infinite here; kept total so a change of cap cannot panic.
                Outcome::Capped(reached) => {
                    rep.status = Status::NotConverged;
                    rep.note = Some(format!("stopped at {reached:.1}"));
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
    /// The least fixed point `R_i` is computed and `R_i > D_i`.
    Misses,
    /// A `w_ij` did not reach its fixed point within the iteration limit; `R_i` is the
    /// closed-form bound (finite) and exceeds `D_i`, so the verdict is unknown: the exact bound
    /// may or may not meet the deadline.
    NotConverged,
    /// Proven unbounded: higher-priority utilisation of a subtask's resource is `>= 1`.
    Diverges,
    /// A higher-priority task diverges, so this one cannot be analysed.
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
    /// Explanation for diverging, not converged and not analysed tasks.
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

/// Convenience: full report with the default iteration limit.
pub fn analyze(set: &TaskSet, modes: &[Mode]) -> Analysis {
    Analyzer::new().analyze(set, modes, MAX_ITERATIONS)
}

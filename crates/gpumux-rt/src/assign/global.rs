//! GLOBAL: exact search over all `2^n` mode assignments (seed 004, IV-D), made practical for
//! `n = 20` by branch-and-bound.
//!
//! Tasks are fixed in priority order (depth `i` fixes `M_i`). The response time of every
//! task is monotone non-decreasing in each input of the analysis: its own costs, the
//! interferers' `α` and jitters, and the blocking term. That gives sound lower bounds:
//!
//! * **Node bound.** With `M_1..M_i` fixed, `R_i` is at least the analysis of `τ_i` with the
//!   higher-priority jitters computed the same way (lower bounds themselves) and blocking
//!   `B_i ≥ max_{k>i} min_{mode} max_{p: H_kp=r} C_kp^{mode}` (lower-priority modes unknown).
//!   If that bound exceeds `D_i`, no completion of the prefix is schedulable: prune.
//! * **Look-ahead.** For each not-yet-fixed `τ_j`, a bound over both of its modes with the
//!   unfixed tasks between `i` and `j` contributing `J = 0` and their smaller `α`. If some
//!   `τ_j` cannot make its deadline in either mode, prune. At the root this alone rejects
//!   most overloaded sets without search.
//! * **Dominance.** A task whose multi-mode times are all `<=` its single-mode times never
//!   needs single mode (its own response, its interference — `α` on the GPU is `C^S` in both
//!   modes — and its blocking all shrink), and symmetrically; only the dominant mode is tried.
//!
//! Leaves are checked with the exact analysis. Values are tried in LOCAL's preferred order
//! first, so the first leaf is LOCAL's assignment whenever it survives pruning.

use super::local::local_mode;
use super::Assignment;
use crate::analysis::{alpha, push_interferers, task_response, units_of, Analyzer, Interferer, MAX_ITERATIONS};
use crate::model::{Mode, TaskSet};

/// Search statistics.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlobalStats {
    /// DFS nodes visited.
    pub nodes: u64,
    /// Leaves checked with the exact analysis.
    pub leaves: u64,
}

/// Options (for tests and ablation).
#[derive(Clone, Copy, Debug)]
pub struct GlobalOptions {
    /// Use the look-ahead bound.
    pub lookahead: bool,
    /// Use mode dominance.
    pub dominance: bool,
    /// Use the node bound (off = plain enumeration of all leaves).
    pub prune: bool,
}

impl Default for GlobalOptions {
    fn default() -> Self {
        GlobalOptions { lookahead: true, dominance: true, prune: true }
    }
}

struct Search<'a> {
    set: &'a TaskSet,
    opts: GlobalOptions,
    units: [f64; 3],
    /// Candidate modes per task, preferred first.
    choices: Vec<Vec<Mode>>,
    /// `minblock[i][r]`: lower bound of the blocking suffered by a task above `i` from tasks `>= i`.
    minblock: Vec<[f64; 3]>,
    /// Per task, lower-bound interferers (J = 0, smaller α over its candidate modes).
    static_lb: Vec<Vec<(usize, Interferer)>>,
    interf: [Vec<Interferer>; 3],
    modes: Vec<Mode>,
    w: Vec<f64>,
    j: Vec<f64>,
    stats: GlobalStats,
}

impl Search<'_> {
    fn lookahead_ok(&mut self, from: usize) -> bool {
        let n = self.set.len();
        let saved = [self.interf[0].len(), self.interf[1].len(), self.interf[2].len()];
        let mut ok = true;
        for jt in from..n {
            let set = self.set;
            let t = &set.tasks[jt];
            let mut feasible = false;
            for &m in &self.choices[jt] {
                if task_response(
                    &t.subtasks,
                    m,
                    &self.minblock[jt + 1],
                    &self.interf,
                    &self.units,
                    t.deadline,
                    MAX_ITERATIONS,
                    &mut self.w,
                    &mut self.j,
                )
                .response()
                .is_some()
                {
                    feasible = true;
                    break;
                }
            }
            if !feasible {
                ok = false;
                break;
            }
            for &(r, it) in &self.static_lb[jt] {
                self.interf[r].push(it);
            }
        }
        for (l, len) in self.interf.iter_mut().zip(saved) {
            l.truncate(len);
        }
        ok
    }

    fn dfs(&mut self, i: usize, an: &mut Analyzer) -> bool {
        self.stats.nodes += 1;
        let n = self.set.len();
        if i == n {
            self.stats.leaves += 1;
            return an.schedulable(self.set, &self.modes);
        }
        let set = self.set;
        let t = &set.tasks[i];
        for c in 0..self.choices[i].len() {
            let m = self.choices[i][c];
            self.modes[i] = m;
            let saved = [self.interf[0].len(), self.interf[1].len(), self.interf[2].len()];
            if self.opts.prune {
                let r = task_response(
                    &t.subtasks,
                    m,
                    &self.minblock[i + 1],
                    &self.interf,
                    &self.units,
                    t.deadline,
                    MAX_ITERATIONS,
                    &mut self.w,
                    &mut self.j,
                );
                if r.response().is_none() {
                    continue;
                }
                let jit = std::mem::take(&mut self.j);
                push_interferers(&mut self.interf, &t.subtasks, m, t.period, &jit);
                self.j = jit;
                if self.opts.lookahead && i + 1 < n && !self.lookahead_ok(i + 1) {
                    for (l, len) in self.interf.iter_mut().zip(saved) {
                        l.truncate(len);
                    }
                    continue;
                }
            }
            let found = self.dfs(i + 1, an);
            for (l, len) in self.interf.iter_mut().zip(saved) {
                l.truncate(len);
            }
            if found {
                return true;
            }
        }
        false
    }
}

/// GLOBAL with default options.
pub fn global(set: &TaskSet, an: &mut Analyzer) -> Assignment {
    global_with(set, an, GlobalOptions::default()).0
}

/// True when the look-ahead bound proves that no mode assignment can make `set`
/// schedulable (a cheap necessary-condition test; `false` proves nothing).
pub fn provably_infeasible(set: &TaskSet) -> bool {
    !new_search(set, GlobalOptions::default()).lookahead_ok(0)
}

/// GLOBAL with explicit options; also returns search statistics.
pub fn global_with(set: &TaskSet, an: &mut Analyzer, opts: GlobalOptions) -> (Assignment, GlobalStats) {
    let n = set.len();
    let mut s = new_search(set, opts);
    let root_ok = !opts.prune || !opts.lookahead || s.lookahead_ok(0);
    let found = root_ok && s.dfs(0, an);
    let modes = if found { s.modes.clone() } else { vec![Mode::Single; n] };
    (Assignment { modes, schedulable: found }, s.stats)
}

fn new_search(set: &TaskSet, opts: GlobalOptions) -> Search<'_> {
    let n = set.len();
    let mut choices = Vec::with_capacity(n);
    for t in &set.tasks {
        let preferred = local_mode(t);
        let other = match preferred {
            Mode::Single => Mode::Multi,
            Mode::Multi => Mode::Single,
        };
        let multi_dom = t.subtasks.iter().all(|s| s.multi <= s.single);
        let single_dom = t.subtasks.iter().all(|s| s.single <= s.multi);
        let c = if opts.dominance && single_dom {
            vec![Mode::Single]
        } else if opts.dominance && multi_dom {
            vec![Mode::Multi]
        } else {
            vec![preferred, other]
        };
        choices.push(c);
    }
    // Lower bounds of blocking from tasks >= i.
    let mut minblock = vec![[0.0f64; 3]; n + 1];
    for i in (0..n).rev() {
        let mut own = [f64::INFINITY; 3];
        for &m in &choices[i] {
            let mut mx = [0.0f64; 3];
            for s in &set.tasks[i].subtasks {
                if s.resource.is_non_preemptive() {
                    let r = s.resource.index();
                    mx[r] = mx[r].max(s.np_len(m));
                }
            }
            for r in 0..3 {
                own[r] = own[r].min(mx[r]);
            }
        }
        for r in 0..3 {
            minblock[i][r] = minblock[i + 1][r].max(own[r]);
        }
    }
    let static_lb = set
        .tasks
        .iter()
        .zip(&choices)
        .map(|(t, ch)| {
            t.subtasks
                .iter()
                .map(|s| {
                    let a = ch.iter().map(|&m| alpha(s, m)).fold(f64::INFINITY, f64::min);
                    (s.resource.index(), Interferer { jitter: 0.0, alpha: a, period: t.period })
                })
                .collect()
        })
        .collect();
    let modes: Vec<Mode> = choices.iter().map(|c| c[0]).collect();
    Search {
        set,
        opts,
        units: units_of(set),
        choices,
        minblock,
        static_lb,
        interf: Default::default(),
        modes,
        w: Vec::new(),
        j: Vec::new(),
        stats: GlobalStats::default(),
    }
}

//! GEMA-LS: our heuristic that closes most of GEMA's gap to GLOBAL.
//!
//! GEMA (Algorithm 1) is greedy and monotone: a task moved to multi-GPU mode never comes
//! back, and one step considers one task only. Two situations defeat it:
//!
//! 1. an early move that looked best (smallest `max R/D`) later blocks success, because its
//!    doubled PCI copies hurt a lower-priority, PCI-heavy task that only matters once other
//!    tasks have moved — GEMA cannot undo it;
//! 2. two tasks must move *together* (e.g. each one alone just shifts the worst ratio to the
//!    other), so no single move lowers the bottleneck objective and the greedy choice is
//!    arbitrary.
//!
//! GEMA-LS therefore runs GEMA and, if that fails, starts from the best assignment GEMA saw
//! (smallest `max R/D`, not its final all-multi one) and does steepest descent on
//! `max R/D` over the neighbourhood of all single flips *and* all pairs of flips (which undo
//! moves and move two tasks at once). It stops as soon as the set is schedulable, when no
//! neighbour improves, or after [`MAX_STEPS`] steps. It then does the same from LOCAL's
//! assignment, which is sometimes in another basin. The search is skipped when GLOBAL's
//! look-ahead lower bound proves that no assignment can succeed. Each step costs `O(n²)` analyses, each
//! cut short by the bound, so it stays polynomial; measured gap and speed are in docs/rt.md.

use super::gema::{gema_trace, HORIZON};
use super::global::provably_infeasible;
use super::local::local_mode;
use super::Assignment;
use crate::analysis::Analyzer;
use crate::model::{Mode, TaskSet};

/// Upper bound on descent steps per start point.
pub const MAX_STEPS: usize = 64;

fn flip(m: &mut Mode) {
    *m = match m {
        Mode::Single => Mode::Multi,
        Mode::Multi => Mode::Single,
    };
}

/// Steepest descent on `max R/D` from `modes` (1- and 2-flip neighbourhood).
/// Returns the final modes and score.
pub fn descend(set: &TaskSet, an: &mut Analyzer, mut modes: Vec<Mode>, mut z: f64) -> (Vec<Mode>, f64) {
    let n = modes.len();
    for _ in 0..MAX_STEPS {
        if z <= 1.0 {
            break;
        }
        let mut best: Option<(usize, Option<usize>)> = None;
        let mut best_z = z;
        for a in 0..n {
            flip(&mut modes[a]);
            let bound = if best_z.is_finite() { best_z } else { HORIZON };
            let za = an.max_ratio(set, &modes, bound);
            if za < best_z {
                best_z = za;
                best = Some((a, None));
            }
            for b in a + 1..n {
                flip(&mut modes[b]);
                let bound = if best_z.is_finite() { best_z } else { HORIZON };
                let zb = an.max_ratio(set, &modes, bound);
                if zb < best_z {
                    best_z = zb;
                    best = Some((a, Some(b)));
                }
                flip(&mut modes[b]);
            }
            flip(&mut modes[a]);
            if best_z <= 1.0 {
                break;
            }
        }
        match best {
            None => break,
            Some((a, b)) => {
                flip(&mut modes[a]);
                if let Some(b) = b {
                    flip(&mut modes[b]);
                }
                z = best_z;
            }
        }
    }
    (modes, z)
}

/// GEMA followed by local search.
pub fn gema_ls(set: &TaskSet, an: &mut Analyzer) -> Assignment {
    let (g, start, z0) = gema_trace(set, an);
    if g.schedulable || provably_infeasible(set) {
        // Nothing to gain: either done, or no assignment at all can succeed.
        return g;
    }
    let (modes, z) = descend(set, an, start, z0);
    if z <= 1.0 {
        return Assignment { modes, schedulable: true };
    }
    let lm: Vec<Mode> = set.tasks.iter().map(local_mode).collect();
    let zl = an.max_ratio(set, &lm, HORIZON);
    let (modes2, z2) = descend(set, an, lm, zl);
    if z2 <= 1.0 {
        return Assignment { modes: modes2, schedulable: true };
    }
    // Unschedulable: report the best assignment found.
    let modes = if z2 < z { modes2 } else { modes };
    Assignment { modes, schedulable: false }
}

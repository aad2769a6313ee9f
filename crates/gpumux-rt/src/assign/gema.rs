//! GEMA, Algorithm 1 of seed 004 (Section IV-C).
//!
//! Start with every task in single-GPU mode (set `S`). While the set is not schedulable and
//! `S` is not empty, try moving each `τ_i ∈ S` to multi-GPU mode, score the trial by
//! `Z_i = max_j R_j / D_j`, and move the task with the smallest `Z_i` for good.
//!
//! Choices the paper leaves open (see docs/rt.md):
//! * ties on `Z_i` go to the highest-priority candidate (first in priority order);
//! * a trial whose response passes `horizon · D_j` for some task scores `+∞`; if every trial
//!   scores `+∞`, the highest-priority candidate moves;
//! * when `S` empties without success the all-multi assignment is returned, unschedulable.
//!
//! Scoring uses [`Analyzer::max_ratio`] with the best `Z` so far as its bound, so a trial is
//! abandoned at the first task whose ratio already reaches it; this gives the same choice as
//! computing every `Z_i` in full, several times faster.

use super::Assignment;
use crate::analysis::Analyzer;
use crate::model::{Mode, TaskSet};

/// Horizon (in deadlines) within which GEMA compares trials.
pub const HORIZON: f64 = 10.0;

/// One GEMA run; also returns the assignment with the smallest `max R/D` seen on the way,
/// which `gema-ls` uses as its starting point.
pub fn gema_trace(set: &TaskSet, an: &mut Analyzer) -> (Assignment, Vec<Mode>, f64) {
    let n = set.len();
    let mut modes = vec![Mode::Single; n];
    let mut in_s = vec![true; n];
    let mut best_seen = modes.clone();
    let mut best_seen_z = an.max_ratio(set, &modes, HORIZON);
    loop {
        // Line 5: schedulable? (The score of the previous step already tells.)
        let z_now = an.max_ratio(set, &modes, HORIZON);
        if z_now < best_seen_z {
            best_seen_z = z_now;
            best_seen.clone_from(&modes);
        }
        if z_now <= 1.0 {
            return (Assignment { modes: modes.clone(), schedulable: true }, modes, z_now);
        }
        if !in_s.iter().any(|&b| b) {
            let a = Assignment { modes, schedulable: false };
            return (a, best_seen, best_seen_z);
        }
        // Lines 8-17: the candidate whose move minimises max R/D.
        let mut best_z = f64::INFINITY;
        let mut best_i = None;
        for i in 0..n {
            if !in_s[i] {
                continue;
            }
            modes[i] = Mode::Multi;
            let bound = if best_z.is_finite() { best_z } else { HORIZON };
            let z = an.max_ratio(set, &modes, bound);
            modes[i] = Mode::Single;
            if z < best_z {
                best_z = z;
                best_i = Some(i);
            }
        }
        // Lines 18-20 (ties and all-infinite: first candidate in priority order).
        let chosen = best_i.unwrap_or_else(|| in_s.iter().position(|&b| b).unwrap_or(0));
        modes[chosen] = Mode::Multi;
        in_s[chosen] = false;
    }
}

/// GEMA assignment.
pub fn gema(set: &TaskSet, an: &mut Analyzer) -> Assignment {
    gema_trace(set, an).0
}

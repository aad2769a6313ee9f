//! Single-GPU: the baseline in which no kernel is ever split (seed 004, IV-D).

use super::Assignment;
use crate::analysis::Analyzer;
use crate::model::{Mode, TaskSet};

/// All tasks in single-GPU mode.
pub fn single(set: &TaskSet, an: &mut Analyzer) -> Assignment {
    let modes = vec![Mode::Single; set.len()];
    let schedulable = an.schedulable(set, &modes);
    Assignment { modes, schedulable }
}

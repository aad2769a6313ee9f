//! LOCAL (seed 004, IV-D): each task decides alone, choosing multi-GPU mode when that makes
//! its own WCET (`Σ_j C_ij`) smaller. It ignores that doubled copies load the shared PCI bus
//! and split kernels occupy more GPUs, which is why it can lose to Single-GPU (Fig. 8).

use super::Assignment;
use crate::analysis::Analyzer;
use crate::model::{Mode, Task, TaskSet};

/// The mode a task prefers on its own.
pub fn local_mode(t: &Task) -> Mode {
    if t.total(Mode::Multi) < t.total(Mode::Single) {
        Mode::Multi
    } else {
        Mode::Single
    }
}

/// LOCAL assignment.
pub fn local(set: &TaskSet, an: &mut Analyzer) -> Assignment {
    let modes: Vec<Mode> = set.tasks.iter().map(local_mode).collect();
    let schedulable = an.schedulable(set, &modes);
    Assignment { modes, schedulable }
}

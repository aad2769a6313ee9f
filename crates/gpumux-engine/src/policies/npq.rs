//! Non-preemptive priority queues (Tanasic 4.2, NPQ): free SMs go to the
//! highest-priority kernel that wants them; a running kernel is never stopped.

use super::order::{by_priority, fill_idle_in_order};
use crate::policy::{Decision, Policy, SchedView};

/// Non-preemptive priority queues (see the module doc).
#[derive(Debug, Default)]
pub struct Npq;

impl Policy for Npq {
    fn name(&self) -> String {
        "npq".into()
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        fill_idle_in_order(view, by_priority(view).into_iter(), out);
    }
}

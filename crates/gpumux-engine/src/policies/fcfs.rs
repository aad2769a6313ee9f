//! First come, first served, as today's hardware does it: kernels take SMs in
//! arrival order and run to completion; when a kernel has issued its last
//! blocks, the next one starts on the SMs it leaves (back-to-back, leftover).

use super::order::fill_idle_in_order;
use crate::policy::{Decision, Policy, SchedView};

#[derive(Debug, Default)]
pub struct Fcfs;

impl Policy for Fcfs {
    fn name(&self) -> String {
        "fcfs".into()
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        fill_idle_in_order(view, view.kernels.iter(), out);
    }
}

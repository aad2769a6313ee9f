//! First come, first served, as today's hardware does it: kernels take SMs in
//! arrival order and run to completion; when a kernel has issued its last
//! blocks, the next one starts on the SMs it leaves (back-to-back, leftover).
//! With submission order (`ArrivalOrder::Submission`) no kernel passes one
//! issued before it that still waits on its stream.

use super::order::fill_idle_in_order;
use crate::policy::{ActiveKernel, Decision, Policy, SchedView};

/// First come, first served (see the module doc).
#[derive(Debug, Default)]
pub struct Fcfs;

impl Policy for Fcfs {
    fn name(&self) -> String {
        "fcfs".into()
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        // No passing a kernel that is ahead in the queue (submission order only).
        let ahead = |k: &ActiveKernel| view.in_order_barrier.is_none_or(|b| k.arrival() <= b);
        fill_idle_in_order(view, view.kernels().take_while(ahead), out);
    }
}

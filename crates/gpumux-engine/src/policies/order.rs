//! Shared helper of the non-preemptive policies: hand idle SMs out in a given
//! kernel order, each kernel taking as many as it can keep busy.

use crate::policy::{ActiveKernel, Decision, SchedView};

/// Gives idle SMs to kernels in `order`; a kernel gets at most as many SMs as
/// it has work for, the rest go to the next one (back-to-back execution).
pub fn fill_idle_in_order<'k>(
    view: &SchedView<'_>,
    order: impl Iterator<Item = ActiveKernel<'k>>,
    out: &mut Vec<Decision>,
) {
    let mut idle = view.idle_sms().peekable();
    for k in order {
        if idle.peek().is_none() {
            return;
        }
        let mut want = k.useful_sms().saturating_sub(k.sms_committed());
        while want > 0 {
            let Some(sm) = idle.next() else { return };
            out.push(Decision::Assign { sm, kernel: k.id(), slice: None });
            want -= 1;
        }
    }
}

/// Kernels by priority (highest first), then arrival: the order of priority
/// queues. Handles, not ids: looking each id up again cost O(kernels).
pub fn by_priority<'v>(view: &SchedView<'v>) -> Vec<ActiveKernel<'v>> {
    let mut ks: Vec<ActiveKernel> = view.kernels().collect();
    // `kernels` is in arrival order and the sort is stable, so ties keep it.
    ks.sort_by_key(|k| std::cmp::Reverse(k.priority()));
    ks
}

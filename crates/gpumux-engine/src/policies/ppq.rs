//! Preemptive priority queues (Tanasic 4.2-4.3, PPQ). A kernel that wants SMs
//! takes idle ones first, then preempts SMs of lower-priority kernels (lowest
//! priority, then youngest, first).
//!
//! * `exclusive`: while a kernel of the top priority level is active, lower
//!   levels get no SMs at all, not even ones the top level cannot use
//!   (Fig. 6a).
//! * shared: lower levels may use SMs the higher ones leave idle, and get
//!   preempted again when the higher ones want them (Fig. 6b).

use super::order::by_priority;
use crate::device::Mechanism;
use crate::ids::SmId;
use crate::policy::{Decision, Policy, SchedView, SmState};

/// Preemptive priority queues (see the module doc).
#[derive(Debug)]
pub struct Ppq {
    /// How SMs are taken from lower priorities.
    pub mechanism: Mechanism,
    /// Lower priorities get no SM while the top level is active.
    pub exclusive: bool,
}

impl Policy for Ppq {
    fn name(&self) -> String {
        format!("ppq-{}-{}", if self.exclusive { "excl" } else { "shared" }, self.mechanism.short())
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        let order = by_priority(view);
        let top = view.kernels().map(|k| k.priority()).max();
        let mut idle: Vec<SmId> = view.idle_sms().collect();
        idle.reverse(); // pop() hands out SM 0 first
                        // Running SMs that may be preempted, with their kernel's priority.
        let mut victims: Vec<(i32, u64, SmId)> = view
            .sms
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                SmState::Running { kernel, .. } => {
                    let k = view.kernel(*kernel)?;
                    Some((k.priority(), k.arrival(), SmId(i as u16)))
                }
                _ => None,
            })
            .collect();
        // Lowest priority first, then most recently arrived (least work lost), then highest SM.
        victims.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
        let mut next_victim = 0;
        for k in order {
            let id = k.id();
            if self.exclusive && Some(k.priority()) != top {
                break;
            }
            let mut want = k.useful_sms().saturating_sub(k.sms_committed());
            while want > 0 {
                if let Some(sm) = idle.pop() {
                    out.push(Decision::Assign { sm, kernel: id, slice: None });
                    want -= 1;
                    continue;
                }
                match victims.get(next_victim) {
                    Some(&(prio, _, sm)) if prio < k.priority() => {
                        out.push(Decision::Preempt { sm, mechanism: self.mechanism, next: Some(id) });
                        next_victim += 1;
                        want -= 1;
                    }
                    _ => break,
                }
            }
        }
    }
}

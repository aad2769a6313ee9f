//! Cooperative multitasking as Adriaens defines it (thesis 2.3, ch. 5): the
//! GPU belongs to one kernel at a time, which keeps every SM it can use until
//! it completes; processes yield only at kernel boundaries, and the next
//! kernel comes from the next process with work, round-robin. Unlike FCFS,
//! SMs a small kernel cannot use stay idle, and the next kernel starts only
//! once the last block of the previous one has finished (his GPGPU-Sim ran
//! one kernel at a time): no back-to-back tail filling.

use crate::ids::{KernelId, Slot};
use crate::policy::{ActiveKernel, Decision, Policy, SchedView};

/// Cooperative multitasking (see the module doc).
#[derive(Debug, Default)]
pub struct Coop {
    /// The kernel that owns the GPU.
    current: Option<KernelId>,
    /// The process it came from.
    last_process: Option<Slot>,
}

impl Policy for Coop {
    fn name(&self) -> String {
        "coop".into()
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        // The owner yields only when its kernel has completed.
        let k: ActiveKernel = match self.current.and_then(|id| view.kernel(id)) {
            Some(k) => k,
            None => {
                // Blocks of a kernel that is still finishing elsewhere keep the GPU too.
                if view.sms.iter().any(|s| s.holder().is_some()) {
                    return;
                }
                let after = self.last_process.map_or(0, |p| p.index().wrapping_add(1));
                let Some(k) = view
                    .kernels()
                    .filter(|k| k.issuable_blocks() > 0 && k.running().is_empty() && k.incoming() == 0)
                    .min_by_key(|k| (k.process().index().wrapping_sub(after), k.arrival(), k.id()))
                else {
                    self.current = None;
                    return;
                };
                self.current = Some(k.id());
                self.last_process = Some(k.process());
                k
            }
        };
        let want = k.useful_sms().saturating_sub(k.sms_committed());
        for sm in view.idle_sms().take(want as usize) {
            out.push(Decision::Assign { sm, kernel: k.id(), slice: None });
        }
    }
}

//! Dynamic Spatial Sharing (Tanasic 3.4, Algorithm 1). Each active kernel has
//! a token budget (its weight's share of the SMs; equal by default); holding
//! an SM costs a token. Idle SMs go to the kernel with the most tokens left
//! (it may go into debt, so no SM idles while someone has work); otherwise an
//! SM is taken from the kernel with the fewest tokens left and reserved for
//! the richest, until the counts differ by at most one.

use crate::device::Mechanism;
use crate::ids::SmId;
use crate::policy::{Decision, Policy, SchedView, SmState};

/// Dynamic spatial sharing (see the module doc).
#[derive(Debug)]
pub struct Dss {
    /// How SMs are taken from the poorest kernel.
    pub mechanism: Mechanism,
}

impl Policy for Dss {
    fn name(&self) -> String {
        format!("dss-{}", self.mechanism.short())
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        if view.kernel_count() == 0 {
            return;
        }
        let total_weight: f64 = view.kernels().map(|k| k.weight().max(0.0)).sum();
        let n = view.device.num_sms as f64;
        // Tokens left per kernel; a committed SM (running or on its way) costs one.
        let mut count: Vec<f64> = view
            .kernels()
            .map(|k| {
                let share = if total_weight > 0.0 {
                    k.weight().max(0.0) / total_weight
                } else {
                    1.0 / view.kernel_count() as f64
                };
                n * share - k.sms_committed() as f64
            })
            .collect();
        let mut want: Vec<u32> = view.kernels().map(|k| k.useful_sms().saturating_sub(k.sms_committed())).collect();
        // Each kernel's running SMs in SM order, from one pass over the SMs
        // (asking `running_sms` per kernel cost O(kernels × SMs) a round).
        let mut running: Vec<Vec<SmId>> = vec![Vec::new(); view.kernel_count()];
        for (i, s) in view.sms.iter().enumerate() {
            if let SmState::Running { kernel, .. } = s {
                if let Some(k) = view.position(*kernel) {
                    running[k].push(SmId(i as u16));
                }
            }
        }
        let mut idle: Vec<SmId> = view.idle_sms().collect();
        idle.reverse();
        loop {
            // Richest kernel that still wants SMs (earliest arrival on ties).
            let Some(kmax) =
                (0..count.len()).filter(|&i| want[i] > 0).fold(None, |best: Option<usize>, i| match best {
                    Some(b) if count[b] >= count[i] => Some(b),
                    _ => Some(i),
                })
            else {
                return;
            };
            if let Some(sm) = idle.pop() {
                out.push(Decision::Assign { sm, kernel: view.kernel_at(kmax).id(), slice: None });
                count[kmax] -= 1.0;
                want[kmax] -= 1;
                continue;
            }
            // Poorest kernel that has an SM to give back.
            let Some(kmin) = (0..count.len()).filter(|&i| i != kmax && !running[i].is_empty()).fold(
                None,
                |best: Option<usize>, i| match best {
                    Some(b) if count[b] <= count[i] => Some(b),
                    _ => Some(i),
                },
            ) else {
                return;
            };
            // Token shares are fractional; without the epsilon, rounding can make
            // two kernels each look richer than the other and trade an SM forever.
            if count[kmax] <= count[kmin] + 1.0 + 1e-9 {
                return;
            }
            let Some(sm) = running[kmin].pop() else { return };
            debug_assert!(matches!(view.sms[sm.0 as usize], SmState::Running { .. }));
            out.push(Decision::Preempt { sm, mechanism: self.mechanism, next: Some(view.kernel_at(kmax).id()) });
            count[kmin] += 1.0;
            count[kmax] -= 1.0;
            want[kmax] -= 1;
        }
    }
}

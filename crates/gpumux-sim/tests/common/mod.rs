//! What the simulator's property tests share: a policy of random legal decisions.

use gpumux_engine::device::Mechanism;
use gpumux_engine::ids::KernelId;
use gpumux_engine::policy::{Decision, Policy, SchedView, SmState};

/// A policy that makes random legal decisions: assigns random idle SMs to
/// random kernels with random slices, and preempts random running SMs with
/// random mechanisms, sometimes for another kernel.
pub struct Chaos {
    pub state: u64,
}

impl Chaos {
    fn next(&mut self) -> u64 {
        self.state = gpumux_sim::timing::mix64(self.state);
        self.state
    }
}

impl Policy for Chaos {
    fn name(&self) -> String {
        "chaos".into()
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        let wanting: Vec<KernelId> = view.kernels().filter(|k| k.issuable_blocks() > 0).map(|k| k.id()).collect();
        // Preempt some running SMs.
        for (i, s) in view.sms.iter().enumerate() {
            if let SmState::Running { .. } = s {
                if self.next().is_multiple_of(7) {
                    let mechanism = match self.next() % 3 {
                        0 => Mechanism::ContextSwitch,
                        1 => Mechanism::Drain,
                        _ => Mechanism::Flush,
                    };
                    let next = if !wanting.is_empty() && self.next().is_multiple_of(2) {
                        Some(wanting[(self.next() % wanting.len() as u64) as usize])
                    } else {
                        None
                    };
                    out.push(Decision::Preempt { sm: gpumux_engine::ids::SmId(i as u16), mechanism, next });
                }
            }
        }
        // Hand out idle SMs; always at least one while someone waits, so the run progresses.
        for sm in view.idle_sms() {
            if wanting.is_empty() {
                break;
            }
            if self.next().is_multiple_of(4) && out.iter().any(|d| matches!(d, Decision::Assign { .. })) {
                continue;
            }
            let k = wanting[(self.next() % wanting.len() as u64) as usize];
            let slice = if self.next().is_multiple_of(3) { Some(1 + self.next() % 40) } else { None };
            out.push(Decision::Assign { sm, kernel: k, slice });
        }
    }
}

//! Round-robin time slices per process (Share-a-GPU, Garg et al. Algorithms
//! 1-2). The GPU belongs to one process at a time; its kernel runs a slice of
//! blocks sized to last about one quantum (a micro-kernel) and then yields at
//! the block boundary, and the next process with work takes the GPU. No
//! preemption is needed: slices end by themselves.

use crate::ids::Slot;
use crate::kernel::KernelDesc;
use crate::policy::{ActiveKernel, Decision, Policy, SchedView};
use crate::time::Nanos;

/// Round-robin time slices (see the module doc).
#[derive(Debug)]
pub struct RoundRobin {
    /// How long a slice should last.
    pub quantum_ns: Nanos,
    /// The process served last.
    last: Option<Slot>,
}

impl RoundRobin {
    /// Slices of about `quantum_ns` (at least 1 ns).
    pub fn new(quantum_ns: Nanos) -> Self {
        RoundRobin { quantum_ns: quantum_ns.max(1), last: None }
    }

    /// Blocks that fill the whole GPU for about one quantum: full waves of
    /// resident blocks, as many waves as fit in the quantum (at least one).
    pub fn slice_blocks(&self, k: &ActiveKernel, num_sms: u16) -> u64 {
        let waves = self.waves(k.desc());
        // A block count, used as "at most this many": saturating means "all of them".
        waves.saturating_mul(k.blocks_per_sm() as u64).saturating_mul(num_sms as u64)
    }
}

impl RoundRobin {
    /// Waves of `k`'s blocks that fit in one quantum, at least one. A kernel
    /// with no block-time estimate ([`SimTiming`](crate::kernel::SimTiming))
    /// gets one wave: the shortest slice that still fills the GPU.
    fn waves(&self, k: &KernelDesc) -> u64 {
        k.sim_timing.map_or(1, |t| (self.quantum_ns / t.block_time_ns.max(1)).max(1))
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> String {
        format!("rr-{}us", self.quantum_ns / 1000)
    }

    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>) {
        // A slice is in progress while any kernel still runs on an SM it was granted.
        if view.kernels().any(|k| !k.running().is_empty() || k.incoming() > 0) {
            return;
        }
        // Next process after the last one served, in process order, wrapping.
        let after = self.last.map_or(0, |p| p.index() + 1);
        let Some(k) = view
            .kernels()
            .filter(|k| k.issuable_blocks() > 0 && k.live_launch().is_none())
            .min_by_key(|k| (k.process().index().wrapping_sub(after), k.arrival()))
        else {
            return;
        };
        let slice = self.slice_blocks(&k, view.device.num_sms);
        let useful = slice.min(k.issuable_blocks()).div_ceil(k.blocks_per_sm().max(1) as u64);
        for sm in view.idle_sms().take(useful as usize) {
            out.push(Decision::Assign { sm, kernel: k.id(), slice: Some(slice) });
        }
        self.last = Some(k.process());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{KernelShape, SimTiming};

    #[test]
    fn a_slice_is_as_many_waves_as_fit_in_the_quantum_and_one_without_a_block_time() {
        let rr = RoundRobin::new(100_000);
        let shape = KernelShape::new(1_000, 128, 32);
        let timed = |ns| KernelDesc::new("k", shape.clone()).with_sim_timing(SimTiming::new(ns));
        assert_eq!(rr.waves(&timed(30_000)), 3);
        // Blocks longer than the quantum still get a whole wave.
        assert_eq!(rr.waves(&timed(250_000)), 1);
        // A zero block time counts as 1 ns, not a division by zero.
        assert_eq!(rr.waves(&timed(0)), 100_000);
        assert_eq!(rr.waves(&KernelDesc::new("k", shape)), 1);
    }
}

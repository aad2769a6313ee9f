//! The interface between the engine and a scheduling policy.
//!
//! A policy says who gets which SMs and when (Tanasic's scheduling framework:
//! the SM status table and the kernel status registers are `SchedView`; a
//! policy assigns idle SMs and reserves running ones). How an SM is taken away
//! is a `Mechanism` the policy is configured with, never something it needs to
//! know the details of.

use crate::device::Mechanism;
use crate::ids::{KernelId, Slot, SmId};
use crate::time::Nanos;

pub use crate::view::{ActiveKernel, SchedView, SmState};

/// One scheduling decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    /// Give an idle SM to a kernel. `slice`: when the kernel has no live
    /// launch, launch at most this many blocks (a time slice of blocks).
    Assign {
        /// The SM, which must be idle.
        sm: SmId,
        /// The kernel, which must be active.
        kernel: KernelId,
        /// At most this many blocks for a new launch (a time slice).
        slice: Option<u64>,
    },
    /// Take a running SM back; it goes to `next` once free (if `next` still
    /// wants SMs then), otherwise it becomes idle.
    Preempt {
        /// The SM, which must be running a kernel.
        sm: SmId,
        /// How the device frees it.
        mechanism: Mechanism,
        /// The kernel it is taken back for (Tanasic's SMST `next`).
        next: Option<KernelId>,
    },
}

/// A scheduling policy.
pub trait Policy: Send {
    /// Name as shown in tables, e.g. `ppq-excl-cs`.
    fn name(&self) -> String;

    /// Called whenever something changed (a kernel arrived or finished, an SM
    /// was freed, a timer fired, a process was added, removed or given a new
    /// priority or weight). Pushes decisions for the engine to apply.
    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>);

    /// A time at which `schedule` must be called even if nothing happens
    /// (time slices); `None` if the policy is purely event driven.
    fn wake_at(&self) -> Option<Nanos> {
        None
    }

    /// The process in `slot` was removed: its kernels are gone from the view
    /// from now on. A policy that keeps per-process state drops it here.
    fn process_removed(&mut self, _slot: Slot) {}
}

//! The interface between the engine and a scheduling policy.
//!
//! A policy says who gets which SMs and when (Tanasic's scheduling framework:
//! the SM status table and the kernel status registers are `SchedView`; a
//! policy assigns idle SMs and reserves running ones). How an SM is taken away
//! is a `Mechanism` the policy is configured with, never something it needs to
//! know the details of.

use crate::device::Mechanism;
use crate::ids::{KernelId, LaunchId, ProcessId, SmId};
use crate::kernel::{DeviceInfo, KernelDesc};
use crate::smset::SmSet;
use crate::time::Nanos;
use std::sync::Arc;

/// What one SM is doing, as the engine tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmState {
    Idle,
    Running {
        kernel: KernelId,
        launch: LaunchId,
    },
    /// Being preempted; `next` gets it once the device releases it.
    Reserved {
        kernel: KernelId,
        launch: LaunchId,
        next: Option<KernelId>,
    },
}

impl SmState {
    /// The kernel holding the SM, running or being preempted.
    pub fn holder(&self) -> Option<KernelId> {
        match self {
            SmState::Idle => None,
            SmState::Running { kernel, .. } | SmState::Reserved { kernel, .. } => Some(*kernel),
        }
    }
}

/// A kernel that has arrived and not finished (an active kernel, Tanasic's KSR).
#[derive(Clone, Debug)]
pub struct ActiveKernel {
    pub id: KernelId,
    pub process: ProcessId,
    pub process_name: Arc<str>,
    pub priority: i32,
    pub weight: f64,
    /// When the kernel reached the head of its process's stream.
    pub arrival: Nanos,
    pub desc: Arc<KernelDesc>,
    /// Occupancy on this device.
    pub blocks_per_sm: u32,
    /// Blocks (and saved contexts) not handed to any live launch.
    pub pending_blocks: u64,
    pub saved_blocks: u64,
    /// SMs running this kernel's live launch.
    pub running: SmSet,
    /// SMs being taken from this kernel.
    pub leaving: SmSet,
    /// SMs being preempted from others on this kernel's behalf.
    pub incoming: u32,
    /// A launch that can still issue blocks (grows instead of a new launch).
    pub live_launch: Option<LaunchId>,
    /// Blocks of the live launch not yet known to be done (upper bound).
    pub live_launch_blocks: u64,
}

impl ActiveKernel {
    /// Blocks that could still be issued somewhere.
    pub fn issuable_blocks(&self) -> u64 {
        self.pending_blocks + self.saved_blocks + if self.live_launch.is_some() { self.live_launch_blocks } else { 0 }
    }

    /// Whether giving this kernel another SM would put it to work.
    pub fn wants_sms(&self) -> bool {
        self.issuable_blocks() > 0 && self.useful_sms() > self.running.len() + self.incoming
    }

    /// SMs it could keep busy at once: enough for all its remaining blocks.
    pub fn useful_sms(&self) -> u32 {
        let per = self.blocks_per_sm.max(1) as u64;
        self.issuable_blocks().div_ceil(per).min(u32::MAX as u64) as u32
    }

    /// SMs held, counting those being taken away and those on their way.
    pub fn sms_committed(&self) -> u32 {
        self.running.len() + self.incoming
    }
}

/// A read-only picture of the scheduler's state at `now`.
pub struct SchedView<'a> {
    pub now: Nanos,
    pub device: &'a DeviceInfo,
    pub sms: &'a [SmState],
    /// Active kernels in arrival order.
    pub kernels: &'a [ActiveKernel],
    /// With `ArrivalOrder::Submission`: the issue time of the earliest kernel
    /// that is queued but cannot start yet (its stream's previous operation
    /// is unfinished). An in-order policy gives no new SM to a kernel that
    /// arrived after it, as a single hardware queue would not let it pass.
    /// `None` otherwise.
    pub in_order_barrier: Option<Nanos>,
}

impl<'a> SchedView<'a> {
    pub fn idle_sms(&self) -> impl Iterator<Item = SmId> + '_ {
        self.sms.iter().enumerate().filter(|(_, s)| matches!(s, SmState::Idle)).map(|(i, _)| SmId(i as u16))
    }

    pub fn kernel(&self, id: KernelId) -> Option<&ActiveKernel> {
        position_of(self.kernels, id).map(|i| &self.kernels[i])
    }

    /// SMs running `id` (not being preempted).
    pub fn running_sms(&self, id: KernelId) -> impl Iterator<Item = SmId> + '_ {
        self.sms
            .iter()
            .enumerate()
            .filter(move |(_, s)| matches!(s, SmState::Running { kernel, .. } if *kernel == id))
            .map(|(i, _)| SmId(i as u16))
    }
}

/// Where kernel `id` is in `kernels` (arrival order). Kernels arrive in the
/// order their ids are given out unless processes issue ahead of their
/// streams with submission order, so a binary search by id almost always
/// finds it in O(log n); when the order is not by id, a linear scan does.
/// Either way the answer is the same (ids are unique), only faster than a
/// scan, which made every lookup O(active kernels).
pub fn position_of(kernels: &[ActiveKernel], id: KernelId) -> Option<usize> {
    match kernels.binary_search_by_key(&id, |k| k.id) {
        Ok(i) => Some(i),
        _ => kernels.iter().position(|k| k.id == id),
    }
}

/// One scheduling decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decision {
    /// Give an idle SM to a kernel. `slice`: when the kernel has no live
    /// launch, launch at most this many blocks (a time slice of blocks).
    Assign { sm: SmId, kernel: KernelId, slice: Option<u64> },
    /// Take a running SM back; it goes to `next` once free (if `next` still
    /// wants SMs then), otherwise it becomes idle.
    Preempt { sm: SmId, mechanism: Mechanism, next: Option<KernelId> },
}

/// A scheduling policy.
pub trait Policy: Send {
    /// Name as shown in tables, e.g. `ppq-excl-cs`.
    fn name(&self) -> String;

    /// Called whenever something changed (a kernel arrived or finished, an SM
    /// was freed, a timer fired). Pushes decisions for the engine to apply.
    fn schedule(&mut self, view: &SchedView<'_>, out: &mut Vec<Decision>);

    /// A time at which `schedule` must be called even if nothing happens
    /// (time slices); `None` if the policy is purely event driven.
    fn wake_at(&self) -> Option<Nanos> {
        None
    }
}

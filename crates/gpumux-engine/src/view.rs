//! The policy's picture of the engine (Tanasic's SM status table and kernel
//! status registers), derived from the engine's own state when a policy
//! runs, never stored beside it.
//!
//! The engine keeps each fact once: who holds an SM is in the SM table, what
//! is left of a kernel is in its record, a process's priority is in the
//! process table. [`SchedView`] borrows all three, and an [`ActiveKernel`]
//! computes what a policy asks from them. The one thing computed up front is
//! [`SmHoldings`], one pass over the SM table per scheduling round, so that
//! "which SMs does kernel k hold" costs a binary search over the few kernels
//! that hold any, not a scan of the SM table per kernel: a round costs what
//! the policy reads, never O(kernels × SMs) nor O(all kernels) up front.

use crate::active::KernelState;
use crate::ids::{KernelId, LaunchId, Slot, SmId};
use crate::kernel::{DeviceInfo, KernelDesc};
use crate::process::{ProcessInfo, ProcessTable};
use crate::smset::SmSet;
use crate::time::Nanos;
use std::sync::Arc;

/// What one SM is doing, as the engine tracks it (the one record of who
/// holds an SM; a kernel's running and leaving SMs are derived from it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmState {
    /// Free: a policy may assign it.
    Idle,
    /// Running a launch of `kernel`.
    Running {
        /// The kernel whose launch runs here.
        kernel: KernelId,
        /// That launch.
        launch: LaunchId,
    },
    /// Being taken back from a launch; `next` gets it once the device
    /// releases it (Tanasic's SMST `next`), if it still wants SMs then.
    Reserved {
        /// The kernel it is taken from.
        kernel: KernelId,
        /// The launch it is taken from.
        launch: LaunchId,
        /// The kernel it was taken back for, if any.
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

/// The SMs one kernel holds or is owed, as the SM table says.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct SmShare {
    /// SMs in `Running` for it.
    running: SmSet,
    /// SMs in `Reserved` from it.
    leaving: SmSet,
    /// SMs in `Reserved` for it (`next`).
    incoming: u32,
}

/// What a kernel that holds no SM and is owed none has.
static NO_SMS: SmShare = SmShare { running: SmSet::EMPTY, leaving: SmSet::EMPTY, incoming: 0 };

/// Per kernel that holds or is owed an SM, its [`SmShare`]: derived from the
/// SM table at the start of each scheduling round. The buffer is kept
/// between rounds so a round allocates nothing.
#[derive(Default)]
pub(crate) struct SmHoldings {
    /// Sorted by kernel id; at most two entries per SM.
    by_kernel: Vec<(KernelId, SmShare)>,
    /// The SMs not idle this round (the engine keeps the set).
    busy: SmSet,
}

impl SmHoldings {
    /// Recomputes the shares from `sms`, whose SMs not idle are `busy`.
    pub(crate) fn rebuild(&mut self, sms: &[SmState], busy: SmSet) {
        self.by_kernel.clear();
        self.busy = busy;
        // Neighbouring SMs mostly belong to one kernel: remember the last
        // entry touched, so the common case costs no search.
        let mut last = 0;
        let mut entry = |by: &mut Vec<(KernelId, SmShare)>, k: KernelId| -> usize {
            if by.get(last).is_none_or(|e| e.0 != k) {
                last = match by.iter().position(|e| e.0 == k) {
                    Some(i) => i,
                    None => {
                        by.push((k, SmShare::default()));
                        by.len() - 1
                    }
                };
            }
            last
        };
        // Only the SMs not idle: the rest adds nothing.
        for sm in busy {
            match sms[sm.0 as usize] {
                SmState::Idle => {}
                SmState::Running { kernel, .. } => {
                    let e = entry(&mut self.by_kernel, kernel);
                    self.by_kernel[e].1.running.insert(sm);
                }
                SmState::Reserved { kernel, next, .. } => {
                    let e = entry(&mut self.by_kernel, kernel);
                    self.by_kernel[e].1.leaving.insert(sm);
                    if let Some(n) = next {
                        let e = entry(&mut self.by_kernel, n);
                        self.by_kernel[e].1.incoming += 1;
                    }
                }
            }
        }
        self.by_kernel.sort_unstable_by_key(|e| e.0);
    }

    fn of(&self, id: KernelId) -> &SmShare {
        match self.by_kernel.binary_search_by_key(&id, |e| e.0) {
            Ok(i) => &self.by_kernel[i].1,
            Err(_) => &NO_SMS,
        }
    }
}

/// A kernel that has arrived and not finished (an active kernel, Tanasic's
/// KSR), as a policy sees it. A cheap handle: every figure is computed from
/// the engine's records when asked.
#[derive(Clone, Copy, Debug)]
pub struct ActiveKernel<'a> {
    kernel: &'a KernelState,
    process: &'a ProcessInfo,
    sms: &'a SmShare,
}

impl<'a> ActiveKernel<'a> {
    /// Its id.
    pub fn id(&self) -> KernelId {
        self.kernel.id
    }

    /// The process whose stream it came from.
    pub fn process(&self) -> Slot {
        self.kernel.slot
    }

    /// That process's name (per-process profiles and reservations are by name).
    pub fn process_name(&self) -> &'a str {
        &self.process.name
    }

    /// The process's priority now (larger is more urgent; it may change at run time).
    pub fn priority(&self) -> i32 {
        self.process.priority
    }

    /// The process's weight now (proportional shares).
    pub fn weight(&self) -> f64 {
        self.process.weight
    }

    /// When it arrived: the time that orders in-order policies (`ArrivalOrder`).
    pub fn arrival(&self) -> Nanos {
        self.kernel.arrival
    }

    /// Its shape and timing.
    pub fn desc(&self) -> &'a Arc<KernelDesc> {
        &self.kernel.desc
    }

    /// Occupancy on this device: blocks one SM holds at once.
    pub fn blocks_per_sm(&self) -> u32 {
        self.kernel.blocks_per_sm
    }

    /// Blocks not handed to any launch.
    pub fn pending_blocks(&self) -> u64 {
        self.kernel.pending.len()
    }

    /// Context-switched blocks waiting to be restored.
    pub fn saved_blocks(&self) -> u64 {
        self.kernel.saved.len() as u64
    }

    /// SMs running its launches (not being preempted).
    pub fn running(&self) -> SmSet {
        self.sms.running
    }

    /// SMs being taken from it.
    pub fn leaving(&self) -> SmSet {
        self.sms.leaving
    }

    /// SMs being preempted from others on its behalf.
    pub fn incoming(&self) -> u32 {
        self.sms.incoming
    }

    /// A launch that can still issue blocks (a new SM grows it instead of
    /// starting another launch).
    pub fn live_launch(&self) -> Option<LaunchId> {
        self.kernel.live.map(|l| l.id)
    }

    /// Blocks of the live launch not yet known to be done (an upper bound:
    /// what it was started with); 0 without one.
    pub fn live_launch_blocks(&self) -> u64 {
        self.kernel.live.map_or(0, |l| l.blocks)
    }

    /// Blocks that could still be issued somewhere.
    pub fn issuable_blocks(&self) -> u64 {
        self.pending_blocks() + self.saved_blocks() + self.live_launch_blocks()
    }

    /// Whether giving this kernel another SM would put it to work.
    pub fn wants_sms(&self) -> bool {
        self.issuable_blocks() > 0 && self.useful_sms() > self.sms_committed()
    }

    /// SMs it could keep busy at once: enough for all its remaining blocks.
    pub fn useful_sms(&self) -> u32 {
        let per = self.blocks_per_sm().max(1) as u64;
        self.issuable_blocks().div_ceil(per).min(u32::MAX as u64) as u32
    }

    /// SMs held or on their way (running plus incoming; leaving ones are not
    /// counted: they are already being given up).
    pub fn sms_committed(&self) -> u32 {
        self.sms.running.len() + self.sms.incoming
    }
}

/// A read-only picture of the scheduler's state at `now`.
pub struct SchedView<'a> {
    /// The time of the round.
    pub now: Nanos,
    /// The device the engine schedules.
    pub device: &'a DeviceInfo,
    /// What each SM is doing, indexed by SM.
    pub sms: &'a [SmState],
    /// With `ArrivalOrder::Submission`: the issue time of the earliest kernel
    /// that is queued but cannot start yet (its stream's previous operation
    /// is unfinished). An in-order policy gives no new SM to a kernel that
    /// arrived after it, as a single hardware queue would not let it pass.
    /// `None` otherwise.
    pub in_order_barrier: Option<Nanos>,
    /// Active kernels in arrival order.
    kernels: &'a [KernelState],
    processes: &'a ProcessTable,
    holdings: &'a SmHoldings,
}

impl<'a> SchedView<'a> {
    /// The view of one round; `holdings` must have been rebuilt from `sms`.
    pub(crate) fn new(
        now: Nanos,
        device: &'a DeviceInfo,
        sms: &'a [SmState],
        kernels: &'a [KernelState],
        processes: &'a ProcessTable,
        holdings: &'a SmHoldings,
        in_order_barrier: Option<Nanos>,
    ) -> Self {
        SchedView { now, device, sms, in_order_barrier, kernels, processes, holdings }
    }

    fn active(kernel: &'a KernelState, processes: &'a ProcessTable, holdings: &'a SmHoldings) -> ActiveKernel<'a> {
        let process = processes
            .info(kernel.slot)
            .expect("an active kernel's process is live: removing a process retires its kernels first");
        ActiveKernel { kernel, process, sms: holdings.of(kernel.id) }
    }

    /// Active kernels in arrival order.
    pub fn kernels(&self) -> impl DoubleEndedIterator<Item = ActiveKernel<'a>> + ExactSizeIterator + Clone + 'a {
        let (processes, holdings) = (self.processes, self.holdings);
        self.kernels.iter().map(move |k| Self::active(k, processes, holdings))
    }

    /// How many kernels are active.
    pub fn kernel_count(&self) -> usize {
        self.kernels.len()
    }

    /// The `i`-th active kernel in arrival order. Panics if `i >= kernel_count()`.
    pub fn kernel_at(&self, i: usize) -> ActiveKernel<'a> {
        Self::active(&self.kernels[i], self.processes, self.holdings)
    }

    /// Active kernel `id`, if it is active.
    pub fn kernel(&self, id: KernelId) -> Option<ActiveKernel<'a>> {
        self.position(id).map(|i| self.kernel_at(i))
    }

    /// Where kernel `id` is in the arrival order.
    pub fn position(&self, id: KernelId) -> Option<usize> {
        position_of(self.kernels, id)
    }

    /// Idle SMs in index order.
    pub fn idle_sms(&self) -> impl Iterator<Item = SmId> + '_ {
        SmSet::range(0, self.sms.len() as u16).difference(&self.holdings.busy).into_iter()
    }

    /// The SMs not idle (running or being taken back), in index order:
    /// what a scan of `sms` for holders finds, without looking at the idle ones.
    pub fn busy_sms(&self) -> SmSet {
        self.holdings.busy
    }
}

/// Where kernel `id` is in `kernels` (arrival order). Kernels arrive in the
/// order their ids are given out unless processes issue ahead of their
/// streams with submission order, so a binary search by id almost always
/// finds it in O(log n); when the order is not by id, a linear scan does.
/// Either way the answer is the same (ids are unique), only faster than a
/// scan, which made every lookup O(active kernels).
pub(crate) fn position_of(kernels: &[KernelState], id: KernelId) -> Option<usize> {
    match kernels.binary_search_by_key(&id, |k| k.id) {
        Ok(i) => Some(i),
        _ => kernels.iter().position(|k| k.id == id),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holdings_are_what_the_sm_table_says() {
        let (k1, k2, k3, l) = (KernelId(1), KernelId(2), KernelId(3), LaunchId(0));
        let sms = [
            SmState::Running { kernel: k2, launch: l },
            SmState::Idle,
            SmState::Reserved { kernel: k2, launch: l, next: Some(k1) },
            SmState::Running { kernel: k3, launch: l },
            SmState::Running { kernel: k2, launch: l },
            SmState::Reserved { kernel: k3, launch: l, next: Some(k1) },
        ];
        let mut h = SmHoldings::default();
        let busy = [0u16, 2, 3, 4, 5].iter().map(|&i| SmId(i)).collect();
        h.rebuild(&sms, busy);
        let set = |ids: &[u16]| ids.iter().map(|&i| SmId(i)).collect::<SmSet>();
        assert_eq!(*h.of(k1), SmShare { running: SmSet::EMPTY, leaving: SmSet::EMPTY, incoming: 2 });
        assert_eq!(*h.of(k2), SmShare { running: set(&[0, 4]), leaving: set(&[2]), incoming: 0 });
        assert_eq!(*h.of(k3), SmShare { running: set(&[3]), leaving: set(&[5]), incoming: 0 });
        assert_eq!(*h.of(KernelId(9)), NO_SMS);
        // A round starts afresh.
        h.rebuild(&[SmState::Idle; 6], SmSet::EMPTY);
        assert_eq!(*h.of(k2), NO_SMS);
    }
}

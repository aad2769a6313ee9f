//! Live processes as the engine holds them: who they are (name, priority,
//! weight, all changeable at run time), and their stream, the operations
//! submitted to them in order, of which only the head is on the device.

use crate::device::CopyDirection;
use crate::ids::{KernelId, OpId, ProcessId, Slot};
use crate::kernel::KernelDesc;
use crate::time::Nanos;
use std::collections::VecDeque;
use std::sync::Arc;

/// What the engine and its policies know about a process.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessInfo {
    /// The front-end's id for it, passed to the device with its launches
    /// and copies.
    pub id: ProcessId,
    /// Name, as shown and as per-process policy settings name it.
    pub name: Arc<str>,
    /// Larger is more urgent.
    pub priority: i32,
    /// Share for proportional policies (DSS tokens).
    pub weight: f64,
}

impl ProcessInfo {
    /// A process of priority 0 and weight 1.
    pub fn new(id: ProcessId, name: impl Into<Arc<str>>) -> Self {
        ProcessInfo { id, name: name.into(), priority: 0, weight: 1.0 }
    }

    /// The same with priority `priority`.
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The same with weight `weight`.
    pub fn with_weight(mut self, weight: f64) -> Self {
        self.weight = weight;
        self
    }
}

/// An operation on a process's stream. A stream runs its operations one
/// after the other, each starting when the one before it completed.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamOp {
    /// A kernel launch; the policy decides when and where its blocks run.
    Kernel {
        /// The kernel.
        desc: Arc<KernelDesc>,
        /// Seeds the simulator's per-block variation, so the same operation
        /// takes the same time under every policy and alone; [`Replay`](crate::Replay)
        /// derives it from the workload process and operation index.
        time_key: u64,
    },
    /// A host-device copy.
    Copy {
        /// Which way.
        direction: CopyDirection,
        /// How much.
        bytes: u64,
    },
    /// Completes when every operation submitted before it has: what a
    /// front-end waits for to synchronise a host with its stream.
    Sync,
    /// Completes once every operation before it on this stream has, **and**
    /// operation `op` of the process in `slot` (another stream, usually) has
    /// ended, completed or dropped: a cross-stream dependency
    /// (`cudaStreamWaitEvent`). The operations after it on this stream stay
    /// out of the schedule until then: only a stream's head is ever active,
    /// so no policy can start them early, whatever it preempts or resumes
    /// (once `op` has ended, a copy behind it may go to the device behind
    /// the copy before it: `Engine::copy_ahead`). An `op` that is not in `slot`'s stream (ended already, or a process
    /// removed) is taken as ended.
    WaitFor {
        /// The process whose operation is waited for.
        slot: Slot,
        /// The operation.
        op: OpId,
    },
    /// Completes when every operation before it has **and** the front-end
    /// has released it ([`Engine::release`](crate::Engine::release)): the
    /// stream holds still meanwhile. A host function run in stream order
    /// (`cudaLaunchHostFunc`) is a `Sync` whose end the host hears of,
    /// then a `Hold` the host releases once the function has returned.
    Hold,
}

/// The end of an operation, reported by
/// [`Engine::poll_completion`](crate::Engine::poll_completion) in the order
/// operations end (a stream's in the order they were submitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The process it was submitted to.
    pub slot: Slot,
    /// The operation.
    pub op: OpId,
    /// How it ended.
    pub outcome: OpOutcome,
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpOutcome {
    /// It ran to the end (every block of a kernel completed exactly once).
    Completed,
    /// Its process was removed first: it was never started, or it was
    /// stopped part-way (a kernel's launches retreated, a copy's result
    /// ignored).
    Dropped,
}

/// An operation waiting on, or at the head of, a stream.
pub(crate) struct Queued {
    pub id: OpId,
    /// When it was submitted (`ArrivalOrder::Submission` orders kernels by it).
    pub submitted: Nanos,
    pub work: Work,
    /// The active kernel a kernel operation became when it reached the head.
    pub kernel: Option<KernelId>,
    /// A copy whose command went to the device (at the head, or queued
    /// ahead behind the copy before it: `Engine::copy_ahead`).
    pub issued: bool,
    /// A copy queued ahead that the device reported done before it reached
    /// the head: it completes when it gets there.
    pub done_early: bool,
}

/// A [`StreamOp`] as the engine keeps it: a kernel's occupancy is worked out
/// (and refused if it cannot run) when it is submitted.
pub(crate) enum Work {
    Kernel {
        desc: Arc<KernelDesc>,
        time_key: u64,
        blocks_per_sm: u32,
    },
    Copy {
        direction: CopyDirection,
        bytes: u64,
    },
    Sync,
    WaitFor {
        slot: Slot,
        op: OpId,
    },
    /// `released`: the front-end let it go before it reached the head.
    Hold {
        released: bool,
    },
}

/// A live process: its info and its stream.
pub(crate) struct Process {
    pub info: ProcessInfo,
    pub stream: VecDeque<Queued>,
}

/// Live processes by slot. A removed process's index is reused by a later
/// one with the next generation, so the table stays as large as the most
/// processes live at once, and a stale slot is told apart from the new one.
#[derive(Default)]
pub(crate) struct ProcessTable {
    entries: Vec<Entry>,
    /// Indices of removed processes, to reuse.
    free: Vec<u32>,
}

struct Entry {
    generation: u32,
    process: Option<Process>,
}

impl ProcessTable {
    /// Adds a process and returns its slot.
    pub fn insert(&mut self, info: ProcessInfo) -> Slot {
        let process = Some(Process { info, stream: VecDeque::new() });
        if let Some(index) = self.free.pop() {
            let e = &mut self.entries[index as usize];
            e.process = process;
            return Slot::new(index, e.generation);
        }
        let index = u32::try_from(self.entries.len()).expect("fewer than 2^32 processes live at once");
        self.entries.push(Entry { generation: 0, process });
        Slot::new(index, 0)
    }

    /// Removes the process in `slot`, if it is live.
    pub fn remove(&mut self, slot: Slot) -> Option<Process> {
        let e = self.entries.get_mut(slot.index() as usize).filter(|e| e.generation == slot.generation())?;
        let p = e.process.take()?;
        e.generation = e.generation.wrapping_add(1);
        self.free.push(slot.index());
        Some(p)
    }

    pub fn get(&self, slot: Slot) -> Option<&Process> {
        let e = self.entries.get(slot.index() as usize)?;
        e.process.as_ref().filter(|_| e.generation == slot.generation())
    }

    pub fn get_mut(&mut self, slot: Slot) -> Option<&mut Process> {
        let e = self.entries.get_mut(slot.index() as usize)?;
        e.process.as_mut().filter(|_| e.generation == slot.generation())
    }

    pub fn info(&self, slot: Slot) -> Option<&ProcessInfo> {
        self.get(slot).map(|p| &p.info)
    }

    /// Live processes in slot order.
    pub fn iter(&self) -> impl Iterator<Item = &Process> {
        self.entries.iter().filter_map(|e| e.process.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_slot_is_refused_and_its_index_reused_with_the_next_generation() {
        let mut t = ProcessTable::default();
        let a = t.insert(ProcessInfo::new(ProcessId(7), "a"));
        let b = t.insert(ProcessInfo::new(ProcessId(8), "b"));
        assert_eq!((a.index(), b.index()), (0, 1));
        assert_eq!(t.remove(a).map(|p| p.info.id), Some(ProcessId(7)));
        assert!(t.get(a).is_none() && t.remove(a).is_none());
        let c = t.insert(ProcessInfo::new(ProcessId(9), "c"));
        assert_eq!((c.index(), c.generation()), (0, 1));
        assert!(t.get(a).is_none(), "the stale slot must not reach the newcomer");
        assert_eq!(t.info(c).map(|i| i.id), Some(ProcessId(9)));
        assert_eq!(t.iter().map(|p| p.info.id.0).collect::<Vec<_>>(), vec![9, 8]);
    }
}

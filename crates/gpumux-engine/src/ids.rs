//! Small typed identifiers, so a kernel id is never passed where an SM id is expected.

use serde::{Deserialize, Serialize};

macro_rules! id_type {
    ($(#[$m:meta])* $name:ident($inner:ty)) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub $inner);
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// A front-end's own name for a process: its index in the workload for
    /// [`Replay`](crate::Replay), a client's id for a daemon. The engine
    /// does not interpret it; it passes it to the device with each launch and
    /// copy (trace lanes, per-process device state) and into run records.
    /// The engine's handle on a live process is a [`Slot`].
    ProcessId(u32)
);
id_type!(
    /// One kernel invocation (a kernel operation of one repetition of one process).
    KernelId(u64)
);
id_type!(
    /// One device launch: a set of block ranges of one kernel on an SM set. A kernel
    /// that is preempted and resumed, or split, has several launches over its life.
    LaunchId(u64)
);
id_type!(
    /// One host-device copy.
    CopyId(u64)
);
id_type!(
    /// Index of a streaming multiprocessor on one device.
    SmId(u16)
);
id_type!(
    /// One operation submitted to a process's stream, unique over an
    /// engine's life; its [`Completion`](crate::Completion) names it.
    OpId(u64)
);

/// The engine's handle on a live process, given by
/// [`Engine::add_process`](crate::Engine::add_process).
///
/// A removed process's index is given to a later one with the next
/// generation, so a slot kept after its process was removed is refused
/// (`EngineError::UnknownSlot`) rather than taken for the newcomer.
/// Policies order processes by [`Slot::index`] (round robin, cooperative).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot {
    index: u32,
    generation: u32,
}

impl Slot {
    pub(crate) fn new(index: u32, generation: u32) -> Self {
        Slot { index, generation }
    }

    /// Position in the engine's process table; processes added to a fresh
    /// engine get 0, 1, 2... in order, and a removed one's index is reused.
    pub fn index(self) -> u32 {
        self.index
    }

    /// How many processes held this index before this one.
    pub fn generation(self) -> u32 {
        self.generation
    }
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.index, self.generation)
    }
}

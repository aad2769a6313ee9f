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
    /// Index of a process in the workload (stable across policies and isolated runs).
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

//! Clients' own CUDA C kernels on a real GPU: what the daemon (`gpumuxd`)
//! runs for the processes that connect to it.
//!
//! * [`module`]: client source → preemptible workers → CUBIN (NVRTC, cached)
//!   → kernels with their parameter sizes and resources;
//! * [`memory`]: device allocations, host registration of clients' shared regions;
//! * [`work`]: the work bound to an engine operation (a launch or a copy);
//! * [`fault`]: faults that lose the context, told by the driver's code;
//! * `context`: the context of its own that a fault can break and a rebuild replaces;
//! * `device`: [`ClientDevice`], the engine's `Device` over all of it.

mod context;
pub(crate) use context::forget_current;
mod copy_pool;
mod device;
mod direct;
pub mod fault;
mod host_copy;
pub mod memory;
pub mod module;
mod mover;
mod pinned_pool;
mod staging;
mod swap;
pub mod work;

pub use context::ClientContext;
pub use device::{
    AheadCounts, ClientDevice, Looked, Refill, DEEP_HOLD_NS, DEEP_MAX, ENDED_WAITING_MAX, PEER_HOLD_NS, PEER_HOLD_VAR,
};
pub use fault::ContextLost;
pub use memory::{MemoryError, Pinner};
pub use module::{ClientKernel, CompiledModule, ModuleError};
pub use pinned_pool::{chunk_layout, AHEAD_VAR, DEVICE_MEMORY_VAR, PINNED_VAR};
pub use swap::{oversubscribe_off, OVERSUBSCRIBE_VAR};
pub use work::{
    check_launch_shape, BindError, ClientWork, CopyLane, HostPtr, KernelHandle, PitchedSide, MAX_BLOCK, MAX_GRID,
    MAX_LAUNCH_BLOCKS,
};

//! The engine's [`Device`](gpumux_engine::device::Device) on a real NVIDIA GPU
//! (`gpumux run --device cuda:N`).
//!
//! Each engine launch runs the suite kernel that `KernelDesc.suite` names as
//! preemptible workers ([`WorkerLaunch`](crate::preempt::WorkerLaunch))
//! restricted to the launch's SM set (`%smid` filtering) and block ranges.
//! What the contract asks, and how it is realised here:
//!
//! * `Launch`: one `WorkerLaunch` per contiguous range of not-yet-done suite
//!   blocks, queued on one stream of the launch's priority (engine priority
//!   `p` → CUDA stream priority `least - p`, clamped: higher is more urgent).
//!   Block indices are mapped between the engine's grid and the suite's
//!   ([`blocks`]).
//! * Exhaustion: workers claim blocks on the GPU, so the host learns that a
//!   launch has nothing left to issue only when it ends: its SMs are released
//!   (`Exhausted`) together with `LaunchEnded` (no leftover overlap).
//! * `Retreat`, any mechanism: the retreat request is written into the
//!   control record by `cuStreamWriteValue32` on an idle control stream;
//!   workers stop at their next chunk boundary (a drain of at most one chunk
//!   per worker). `ContextSwitch` cannot be done in software (no register
//!   save) and `Flush` cannot drop running blocks: both are served as this
//!   chunk-boundary drain, the cheapest safe equivalent. A partial retreat is
//!   retreat + restart on the SMs that remain; the released SMs are announced
//!   (`Retreated`) when the old workers have all left.
//! * `Grow`: retreat + restart on the larger set.
//! * `Copy`: a real asynchronous copy of `bytes` between pinned host staging
//!   memory and a device scratch buffer, on one stream per direction.
//! * Time: nanoseconds of a monotonic host clock since the device was opened;
//!   `advance` polls CUDA events (busy-wait, sleeping only when nothing runs).
//!
//! One module per concern:
//! * [`suite_ref`]: which suite app, kernel and size a kernel names, and the
//!   rules of multi-kernel instances ([`check_workload`] before a run);
//! * [`blocks`]: engine blocks ↔ suite blocks;
//! * `state`: what a GPU keeps across device opens (context, prepared
//!   kernels and their buffers, pooled workers and streams);
//! * `registry`: the GPUs this process has opened, lent to one device at a time;
//! * [`verify`]: the outputs checked when a run ends ([`CudaDevice::finish`]);
//! * `cuda_device`: [`CudaDevice`], the `Device` impl itself.

pub mod blocks;
mod cuda_device;
mod registry;
mod state;
pub mod suite_ref;
pub mod verify;

pub use cuda_device::CudaDevice;
pub use registry::device_info;
pub(crate) use state::info_of;
pub use suite_ref::{check_workload, Refusal, SuiteTarget, WorkloadRefused, SUPPORTED};
pub use verify::{KernelCheck, Verdict, Verification};

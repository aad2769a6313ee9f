//! gpumux's real-GPU backend: CUDA kernels rewritten into persistent,
//! preemptible workers that run on a chosen set of SMs, stop within one chunk
//! of blocks when told to retreat, and resume exactly where they stopped.
//!
//! Layers, bottom up (each depends only on those above it in this list):
//! * [`lex`], [`transform`]: CUDA C source → worker source (pure text, CPU-tested);
//! * [`suite`]: benchmark kernels in CUDA C with CPU references and sizes;
//! * [`nvrtc`]: run-time compilation with a cache keyed by source hash;
//! * [`runtime`]: context, memory, streams, modules, events (raw driver API);
//! * [`launch_plan`]: native or workers, and the chunk, from a kernel's measured block time;
//! * [`preempt`]: control records, launch on an SM set, retreat, resume;
//! * [`exec`]: runs a suite workload natively, as workers, or under random preemption;
//! * [`device`]: the engine's `Device` trait on a real GPU (`gpumux run --device cuda:N`);
//! * [`split`]: one launch split over several GPUs, its inputs replicated and its outputs merged;
//! * [`client`]: the same machinery for clients' own kernels, memory and copies (the daemon's).
//!
//! The measurements (overhead, preemption latency, spatial sharing) and the
//! `gpumux-cuda-check` program live in the `gpumux-cuda-bench` crate, on top
//! of this one: the backend prints nothing and parses no command line.

#![warn(missing_docs)]

pub mod client;
pub mod device;
pub mod error;
pub mod exec;
pub mod launch_plan;
pub mod lex;
pub mod nvrtc;
pub mod preempt;
pub mod runtime;
pub mod source_check;
pub mod split;
pub mod suite;
pub mod transform;

pub use device::{device_info, CudaDevice};
pub use error::CudaError;
pub use runtime::{cuda_available, DeviceSummary};

//! gpumux's scheduling core, with no I/O (docs/architecture.md, "The engine is sans-IO").
//!
//! * [`Engine`] is the scheduler with a live interface: processes are added
//!   and removed while it runs, operations are submitted to their streams
//!   and their completions polled; it asks a [`Policy`] who gets which SMs,
//!   emits [`Command`]s and consumes [`Event`]s.
//! * [`Replay`] is the front-end that plays a [`Workload`] on it (host
//!   threads, repetitions, asynchronous launches, run records).
//! * [`Device`] is what the simulator and the CUDA backend implement;
//!   [`scripted::ScriptedDevice`] is a small one for tests.
//! * [`policies`] holds one file per scheduling policy.
//! * [`metrics`] turns run records into NTT, ANTT, STP and fairness.
//!
//! Progress of a kernel is a set of block ranges ([`ranges::BlockRanges`]), so
//! preemption, resumption, resizing and splitting are all range operations.

#![warn(missing_docs)]

mod active;
pub mod device;
pub mod driver;
mod engine;
pub mod id_map;
pub mod ids;
pub mod kernel;
mod launch_map;
pub mod metrics;
pub mod model;
pub mod policies;
pub mod policy;
mod process;
pub mod ranges;
pub mod record;
mod replay;
pub mod scripted;
pub mod smset;
pub mod time;
mod view;

pub use device::{Command, Device, DeviceError, Event, Mechanism, Message, ProtocolError};
pub use engine::{ArrivalOrder, Engine, EngineError};
pub use ids::{KernelId, LaunchId, OpId, ProcessId, Slot, SmId};
pub use kernel::{DeviceInfo, KernelDesc, KernelShape, SimTiming, SmLimits};
pub use model::{Op, ProcessSpec, Workload};
pub use policy::{ActiveKernel, Decision, Policy, SchedView, SmState};
pub use process::{Completion, OpOutcome, ProcessInfo, StreamOp};
pub use replay::Replay;

//! gpumux's scheduling core, with no I/O (DESIGN.md, "Sans-IO core").
//!
//! * [`engine::Engine`] runs processes' streams and asks a [`policy::Policy`]
//!   who gets which SMs; it emits [`device::Command`]s and consumes
//!   [`device::Event`]s.
//! * [`device::Device`] is what the simulator and the CUDA backend implement.
//! * [`policies`] holds one file per scheduling policy.
//! * [`metrics`] turns run records into NTT, ANTT, STP and fairness.
//!
//! Progress of a kernel is a set of block ranges ([`ranges::BlockRanges`]), so
//! preemption, resumption, resizing and splitting are all range operations.

mod active;
pub mod device;
pub mod driver;
pub mod engine;
pub mod ids;
pub mod kernel;
pub mod metrics;
pub mod model;
pub mod policies;
pub mod policy;
pub mod ranges;
pub mod record;
pub mod smset;
pub mod time;

pub use device::{Command, Device, DeviceError, Event, Mechanism};
pub use engine::{ArrivalOrder, Engine, EngineError};
pub use kernel::{DeviceInfo, KernelDesc, KernelShape, SimTiming, SmLimits};
pub use model::{Op, ProcessSpec, Workload};
pub use policy::{Decision, Policy, SchedView};

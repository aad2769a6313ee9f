//! The simulated GPU, gpumux's default device (docs/simulator.md).
//!
//! [`SimGpu`] implements the engine's `Device` trait in nanosecond virtual
//! time: SM occupancy, memory bandwidth ([`memory`]: a per-SM ceiling and
//! shared DRAM), copy engines, and the three hardware preemption mechanisms
//! of Tanasic et al. that real GPUs do not expose. [`presets`] holds the K20c of Tanasic Table 2 and the H100/H200;
//! [`links`] models the host and peer links of a machine of several GPUs.

#![warn(missing_docs)]

pub mod gpu;
pub mod links;
pub mod memory;
pub mod presets;
pub mod synthetic;
pub mod timing;

pub use gpu::{MemStats, SimGpu, SimTuning};

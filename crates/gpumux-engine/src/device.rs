//! The boundary between the engine and a device: commands out, events in.
//!
//! A device (the simulator, the CUDA backend, a test double) realises the
//! engine's decisions with whatever mechanisms it has. The contract:
//!
//! * `Launch` starts a launch: the device issues blocks to SMs of `sms` as
//!   capacity allows, restoring `restore` (context-switched blocks) first, then
//!   block indices of `blocks` in increasing order.
//! * When a launch has nothing left to issue, the device releases all its SMs
//!   at once (`SmReleased` with `Exhausted`); its resident blocks keep running
//!   and keep their capacity, so the next owner of the SM fills in behind them
//!   (today's hardware "leftover" behaviour). When the last block completes the
//!   launch ends (`LaunchEnded` with no remaining work).
//! * `Grow` adds SMs to a live launch. Growing an exhausted launch is a no-op.
//! * `Retreat` stops issuing on some SMs of a launch and frees them with the
//!   given mechanism; each SM is announced with `SmReleased(Retreated)` once it
//!   holds no more of the launch's state. When a launch holds no SM and has
//!   nothing resident, it ends and hands back the work it did not do: block
//!   ranges never issued (or flushed) and saved contexts.
//! * Every SM of a launch is released before its `LaunchEnded`.

use crate::ids::{CopyId, KernelId, LaunchId, ProcessId, SmId};
use crate::kernel::{DeviceInfo, KernelDesc};
use crate::ranges::BlockRanges;
use crate::smset::SmSet;
use crate::time::Nanos;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// How a device frees an SM that is running blocks (Tanasic 3.2; Park et al. for flushing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mechanism {
    /// Save registers and shared memory of resident blocks; restore them later.
    ContextSwitch,
    /// Stop issuing and wait for resident blocks to finish.
    Drain,
    /// Drop resident idempotent blocks (they rerun later); drain the others.
    Flush,
}

impl Mechanism {
    pub fn short(&self) -> &'static str {
        match self {
            Mechanism::ContextSwitch => "cs",
            Mechanism::Drain => "drain",
            Mechanism::Flush => "flush",
        }
    }
}

/// A block that was context-switched out part-way: the device restores it
/// before issuing new blocks of the kernel. `remaining_ns` is what is left of
/// its work (simulator); a device that cannot save contexts never makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedBlock {
    pub index: u64,
    pub remaining_ns: Nanos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyDirection {
    HostToDevice,
    DeviceToHost,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    Launch {
        launch: LaunchId,
        kernel: KernelId,
        process: ProcessId,
        priority: i32,
        desc: Arc<KernelDesc>,
        /// Seeds per-block variation so the same block takes the same time
        /// under every policy and in the isolated run.
        time_key: u64,
        blocks: BlockRanges,
        restore: Vec<SavedBlock>,
        sms: SmSet,
    },
    Grow {
        launch: LaunchId,
        sms: SmSet,
    },
    Retreat {
        launch: LaunchId,
        sms: SmSet,
        mechanism: Mechanism,
    },
    Copy {
        copy: CopyId,
        process: ProcessId,
        direction: CopyDirection,
        bytes: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseCause {
    /// The launch had nothing left to issue.
    Exhausted,
    /// The engine asked for the SM back.
    Retreated,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    SmReleased {
        launch: LaunchId,
        sm: SmId,
        cause: ReleaseCause,
    },
    LaunchEnded {
        launch: LaunchId,
        /// Blocks never issued, or flushed: they must run again.
        remaining: BlockRanges,
        saved: Vec<SavedBlock>,
        /// Blocks of this launch that completed.
        completed: u64,
    },
    CopyDone {
        copy: CopyId,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("the engine sent an invalid command: {0}")]
    Protocol(String),
    #[error("nothing is running on the device and no timer is set at {now} ns: the run cannot progress")]
    Stalled { now: Nanos },
    /// The device's own machinery failed (a driver call, a kernel it cannot
    /// run): `what` says what it was doing, `source` why it failed.
    #[error("device backend error: {what}")]
    Backend {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    TimeOverflow(#[from] crate::time::TimeOverflow),
}

impl DeviceError {
    /// A backend failure while doing `what`, keeping the error that caused it.
    pub fn backend(what: impl Into<String>, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        DeviceError::Backend { what: what.into(), source: source.into() }
    }
}

/// Counters a device keeps over a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceStats {
    pub blocks_completed: u64,
    /// Blocks started again after a flush dropped them.
    pub blocks_rerun: u64,
    /// Σ over SMs of the time the SM had at least one resident block.
    pub sm_busy_ns: u128,
    /// Σ over SMs of the time spent saving or restoring contexts.
    pub sm_switch_ns: u128,
    pub context_saves: u64,
    pub bytes_copied: u64,
    /// Internal events processed (for the simulator's speed benchmark).
    pub events: u64,
}

/// One span of a timeline (Chrome trace): what an SM (lane) did when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceSpan {
    /// SM index; copy engines use lanes after the SMs.
    pub lane: u32,
    pub name: String,
    pub category: String,
    pub start_ns: Nanos,
    pub end_ns: Nanos,
    pub process: Option<ProcessId>,
}

/// A GPU the engine can drive.
pub trait Device {
    fn info(&self) -> &DeviceInfo;

    /// Accepts one command at time `now` (the time of the last `advance`).
    fn submit(&mut self, now: Nanos, command: Command) -> Result<(), DeviceError>;

    /// Runs until something the engine must hear happens, or until `until`
    /// if that comes first. Appends events (all with the same time) to
    /// `events` and returns the time they happened, or `until` if none did.
    fn advance(&mut self, until: Option<Nanos>, events: &mut Vec<Event>) -> Result<Nanos, DeviceError>;

    fn stats(&self) -> DeviceStats;

    /// Asks the device to record a timeline; devices that cannot ignore it.
    fn enable_trace(&mut self) {}

    /// The timeline recorded so far.
    fn take_trace(&mut self) -> Vec<TraceSpan> {
        Vec::new()
    }
}

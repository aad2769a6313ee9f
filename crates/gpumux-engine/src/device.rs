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
//! * A device that frees a retreat's SMs in the command itself (the CUDA
//!   device: its workers leave after their block, and what is launched there
//!   next takes their places as they go) may say so; the engine built
//!   `Engine::with_retreats_freeing_at_once` then frees the SMs when it
//!   sends the `Retreat` and gives them to the kernel they were taken for
//!   right after it, and takes the device's `SmReleased(Retreated)` for
//!   them, when it comes, as done.

use crate::ids::{CopyId, KernelId, LaunchId, OpId, ProcessId, SmId};
use crate::kernel::{DeviceInfo, DoesNotFit, KernelDesc};
use crate::ranges::BlockRanges;
use crate::smset::SmSet;
use crate::time::Nanos;
use crate::view::SmState;
use serde::{Deserialize, Serialize};
use std::ops::Range;
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
    /// The short name policies are spelt with, e.g. `ppq-excl-cs`.
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
    /// The block's index in its kernel's grid.
    pub index: u64,
    /// Work left of it when it was saved.
    pub remaining_ns: Nanos,
}

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CopyDirection {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory.
    DeviceToHost,
    /// Within device memory (a device-to-device copy or a memset): no PCIe
    /// transfer, it runs at device memory bandwidth.
    DeviceToDevice,
}

/// What the engine asks of a device (see the module doc for the contract).
/// Serializable so a device may live in another process (gpumuxd's device process).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Start a launch of `blocks` (after restoring `restore`) of `kernel` on `sms`.
    Launch {
        /// The new launch's id.
        launch: LaunchId,
        /// The kernel it runs blocks of.
        kernel: KernelId,
        /// The stream operation the kernel is (what [`Engine::submit`](crate::Engine::submit)
        /// returned): a front-end that keeps per-operation data (the daemon's
        /// arguments and code) finds it by this id.
        op: OpId,
        /// The front-end's id of the kernel's process.
        process: ProcessId,
        /// The process's priority at launch (a device may map it to a
        /// stream priority).
        priority: i32,
        /// The kernel's shape and timing.
        desc: Arc<KernelDesc>,
        /// Seeds per-block variation so the same block takes the same time
        /// under every policy and in the isolated run.
        time_key: u64,
        /// Block indices to issue, in increasing order.
        blocks: BlockRanges,
        /// Context-switched blocks to restore before any new block.
        restore: Vec<SavedBlock>,
        /// SMs it may issue on.
        sms: SmSet,
    },
    /// Add SMs to a live launch.
    Grow {
        /// The launch.
        launch: LaunchId,
        /// The SMs to add (idle in the engine's table).
        sms: SmSet,
    },
    /// Stop a launch issuing on some of its SMs and free them.
    Retreat {
        /// The launch.
        launch: LaunchId,
        /// The SMs to free.
        sms: SmSet,
        /// How to free them.
        mechanism: Mechanism,
    },
    /// Copy bytes between host and device; answered by `CopyDone`.
    Copy {
        /// The copy's id.
        copy: CopyId,
        /// The stream operation the copy is (what [`Engine::submit`](crate::Engine::submit) returned).
        op: OpId,
        /// The front-end's id of the process it is for.
        process: ProcessId,
        /// Which way.
        direction: CopyDirection,
        /// How much.
        bytes: u64,
    },
}

/// Why a device released an SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseCause {
    /// The launch had nothing left to issue.
    Exhausted,
    /// The engine asked for the SM back.
    Retreated,
}

/// What a device tells the engine (serializable, as [`Command`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// An SM holds no more of the launch's state to issue from.
    SmReleased {
        /// The launch that held it.
        launch: LaunchId,
        /// The SM.
        sm: SmId,
        /// Why.
        cause: ReleaseCause,
    },
    /// A launch holds no SM and has nothing resident: it is over.
    LaunchEnded {
        /// The launch.
        launch: LaunchId,
        /// Blocks never issued, or flushed: they must run again.
        remaining: BlockRanges,
        /// Context-switched blocks: they must be restored.
        saved: Vec<SavedBlock>,
        /// Blocks of this launch that completed.
        completed: u64,
    },
    /// A copy completed.
    CopyDone {
        /// The copy.
        copy: CopyId,
    },
}

/// A message of the protocol, to say which one broke it (shown by its name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// `Command::Launch`.
    Launch,
    /// `Command::Grow`.
    Grow,
    /// `Command::Retreat`.
    Retreat,
    /// `Event::SmReleased`.
    SmReleased,
    /// `Event::LaunchEnded`.
    LaunchEnded,
}

impl std::fmt::Display for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Message::Launch => "Launch",
            Message::Grow => "Grow",
            Message::Retreat => "Retreat",
            Message::SmReleased => "SmReleased",
            Message::LaunchEnded => "LaunchEnded",
        })
    }
}

/// A broken rule of the engine-device contract (the module doc), from
/// either side: a device reports it for a command as
/// [`DeviceError::Protocol`], the engine for an event as
/// [`EngineError::Protocol`](crate::EngineError::Protocol). Either is a bug
/// in one of the two, never a user's mistake.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    /// A message names a launch that was never started or has ended.
    #[error("{by} names unknown launch {launch}")]
    UnknownLaunch {
        /// The launch named.
        launch: LaunchId,
        /// The message that named it.
        by: Message,
    },
    /// A `Launch` reuses the id of a live launch.
    #[error("launch {launch} started twice")]
    LaunchedTwice {
        /// The launch.
        launch: LaunchId,
    },
    /// A `Launch` with no SM to run on.
    #[error("launch {launch} of `{kernel}` has no SMs")]
    NoSms {
        /// The launch.
        launch: LaunchId,
        /// Its kernel's name.
        kernel: String,
    },
    /// A message names an SM the device does not have.
    #[error("SM {sm} does not exist on {device} ({sms} SMs)")]
    NoSuchSm {
        /// The SM named.
        sm: SmId,
        /// The device's name.
        device: String,
        /// How many SMs it has.
        sms: usize,
    },
    /// A `Launch` or `Grow` gives a launch an SM another launch owns.
    #[error("{by} gives launch {launch} SM {sm}, still owned by launch {owner}")]
    SmOwned {
        /// The launch given the SM.
        launch: LaunchId,
        /// The SM.
        sm: SmId,
        /// The launch that owns it.
        owner: LaunchId,
        /// `Launch` or `Grow`.
        by: Message,
    },
    /// An SM released by a launch the engine does not have on it.
    #[error("launch {launch} released SM {sm}, but the engine has it as {state:?}")]
    SmNotHeld {
        /// The launch that released it.
        launch: LaunchId,
        /// The SM.
        sm: SmId,
        /// What the engine's SM table says of it.
        state: SmState,
    },
    /// A launch ended before releasing all its SMs.
    #[error("launch {launch} ended still holding SMs {sms:?}")]
    EndedHoldingSms {
        /// The launch.
        launch: LaunchId,
        /// The SMs it still holds.
        sms: SmSet,
    },
    /// A launch handed back blocks it was never given (they would run twice).
    #[error("launch {launch} handed back blocks {blocks:?} that were not its own")]
    ForeignBlocks {
        /// The launch.
        launch: LaunchId,
        /// The blocks.
        blocks: Range<u64>,
    },
    /// A `CopyDone` for a copy that was never started or is done.
    #[error("copy {copy} finished but was never started")]
    UnknownCopy {
        /// The copy.
        copy: CopyId,
    },
    /// A command stamped later than the device's own time.
    #[error("command at {at} ns is ahead of device time {device_now} ns")]
    AheadOfDevice {
        /// The command's time.
        at: Nanos,
        /// The device's time.
        device_now: Nanos,
    },
    /// A launch of a kernel that cannot run on the device at all.
    #[error(transparent)]
    DoesNotFit(#[from] DoesNotFit),
    /// A command the device does not implement (a test double or a backend
    /// that offers part of the protocol).
    #[error("{device} does not carry out {command}")]
    Unsupported {
        /// The device's name.
        device: String,
        /// The command, as a short description.
        command: String,
    },
    /// A launch asks a device that never saves contexts to restore some.
    #[error("launch {launch}: this device never saves contexts, yet {blocks} are to be restored")]
    CannotRestore {
        /// The launch.
        launch: LaunchId,
        /// Saved blocks it was given.
        blocks: usize,
    },
}

/// Why a device could not go on.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The engine sent a command that breaks the contract.
    #[error("the engine sent an invalid command")]
    Protocol(#[from] ProtocolError),
    /// Nothing can happen any more: a run that would wait forever.
    #[error("nothing is running on the device and no timer is set at {now} ns: the run cannot progress")]
    Stalled {
        /// The device's time.
        now: Nanos,
    },
    /// The device's own machinery failed (a driver call, a kernel it cannot
    /// run): `what` says what it was doing, `source` why it failed.
    #[error("device backend error: {what}")]
    Backend {
        /// What the device was doing.
        what: String,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Device time would overflow.
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
    /// Blocks that ran to the end.
    pub blocks_completed: u64,
    /// Blocks started again after a flush dropped them.
    pub blocks_rerun: u64,
    /// Σ over SMs of the time the SM had at least one resident block.
    pub sm_busy_ns: u128,
    /// Σ over SMs of the time spent saving or restoring contexts.
    pub sm_switch_ns: u128,
    /// Contexts (resident blocks) saved.
    pub context_saves: u64,
    /// Bytes moved by copies.
    pub bytes_copied: u64,
    /// Internal events processed (for the simulator's speed benchmark).
    pub events: u64,
}

/// One span of a timeline (Chrome trace): what an SM (lane) did when.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceSpan {
    /// SM index; copy engines use lanes after the SMs.
    pub lane: u32,
    /// What ran, e.g. a kernel's name.
    pub name: String,
    /// Kind of span (block, save, restore, copy...), for colouring.
    pub category: String,
    /// Start.
    pub start_ns: Nanos,
    /// End.
    pub end_ns: Nanos,
    /// Whose work it was.
    pub process: Option<ProcessId>,
}

/// A GPU the engine can drive.
pub trait Device {
    /// What the device offers.
    fn info(&self) -> &DeviceInfo;

    /// Accepts one command at time `now` (the time of the last `advance`).
    fn submit(&mut self, now: Nanos, command: Command) -> Result<(), DeviceError>;

    /// Runs until something the engine must hear happens, or until `until`
    /// if that comes first. Appends events (all with the same time) to
    /// `events` and returns the time they happened, or `until` if none did.
    fn advance(&mut self, until: Option<Nanos>, events: &mut Vec<Event>) -> Result<Nanos, DeviceError>;

    /// Counters so far.
    fn stats(&self) -> DeviceStats;

    /// Asks the device to record a timeline; devices that cannot ignore it.
    fn enable_trace(&mut self) {}

    /// The timeline recorded so far.
    fn take_trace(&mut self) -> Vec<TraceSpan> {
        Vec::new()
    }
}

//! The messages between the daemon ([`super::remote`]) and its device
//! process ([`crate::device_host`]), sent over a [`super::link::Link`].
//!
//! The daemon calls; the device process carries out every message in the
//! order sent and never speaks unasked. Memory, registration, modules and
//! [`ToDevice::Poll`] are answered; bindings and commands are not, and a
//! device failure they cause is the answer to the next `Poll`. Lockstep, so
//! the device sees commands and polls in the order the engine made them
//! ([`super::remote`] says why that matters).

use super::{DevAddr, KernelCode, LoadError, MemError, MemInfo, ModuleImage, OpWork, Wake};
use gpumux_engine::device::{Command, Event};
use gpumux_engine::ids::{LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use serde::{Deserialize, Serialize};

/// The device process's number for a client's shared region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RegionId(pub u64);

/// A host span as the device process knows it: a region by number, an offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRef {
    /// The region (registered before with [`ToDevice::RegisterHost`]).
    pub region: RegionId,
    /// Offset in it.
    pub offset: u64,
}

/// One oversubscription call to the device process ([`ToDevice::Swap`]).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub enum SwapCall {
    /// [`super::Backend::reserve`].
    Reserve(u64),
    /// [`super::Backend::evict`].
    Evict(DevAddr),
    /// [`super::Backend::restore`].
    Restore(DevAddr),
    /// [`super::Backend::readdress_evicted`].
    Readdress(DevAddr),
}

/// Daemon → device process.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToDevice {
    /// Answered by [`FromDevice::Alloc`].
    Alloc {
        /// Bytes.
        bytes: u64,
    },
    /// Answered by [`FromDevice::Free`].
    Free {
        /// The allocation.
        addr: DevAddr,
    },
    /// Answered by [`FromDevice::MemInfo`].
    MemInfo,
    /// Oversubscription ([`super::Backend::reserve`], `evict`, `restore`,
    /// `readdress_evicted`). Answered by [`FromDevice::Swapped`].
    Swap(SwapCall),
    /// [`super::Backend::start_move`]. No answer: the move comes in a later
    /// [`FromDevice::Polled`]'s `moved`.
    StartMove {
        /// The daemon's token of the move.
        token: u64,
        /// Which buffer, out or back.
        what: super::BufferMove,
    },
    /// [`super::Backend::settle_moves`]. Answered by [`FromDevice::Settled`].
    SettleMoves,
    /// A client's region; its memfd comes with this message (`SCM_RIGHTS`).
    /// Answered by [`FromDevice::Registered`].
    RegisterHost {
        /// Its number from now on.
        region: RegionId,
        /// Its length, bytes.
        bytes: u64,
    },
    /// [`super::Backend::start_register`]: a client's region, its memfd with
    /// this message (`SCM_RIGHTS`). No answer: the pin comes in a later
    /// [`FromDevice::Polled`]'s `registered`, and the region is `region` from then on.
    StartRegister {
        /// The daemon's token of the pin.
        token: u64,
        /// Its number once registered.
        region: RegionId,
        /// Its length, bytes.
        bytes: u64,
    },
    /// Forget (and unmap) a region. No answer.
    UnregisterHost {
        /// The region.
        region: RegionId,
    },
    /// Answered by [`FromDevice::Module`].
    LoadModule {
        /// The module's name.
        name: String,
        /// CUDA C source.
        source: String,
        /// Compile options.
        options: Vec<String>,
    },
    /// [`super::Backend::start_load`]. No answer: the module comes in a
    /// later [`FromDevice::Polled`]'s `loaded`.
    StartLoad {
        /// The daemon's token of the load.
        token: u64,
        /// The module's name.
        name: String,
        /// CUDA C source.
        source: String,
        /// Compile options.
        options: Vec<String>,
    },
    /// [`super::Backend::bind`]. No answer.
    Bind {
        /// The operation.
        op: OpId,
        /// Its work.
        work: OpWork<HostRef>,
    },
    /// [`super::Backend::unbind`]. No answer.
    Unbind {
        /// The operation.
        op: OpId,
    },
    /// [`super::Backend::unload_module`]. No answer.
    UnloadModule {
        /// That load's kernels.
        kernels: Vec<KernelCode>,
    },
    /// [`super::Backend::submit`]. No answer (a failure answers the next `Poll`).
    Submit(Command),
    /// A launch command the daemon answered itself from an end the device
    /// reported ahead ([`super::ends_ahead`]): carried out as `Submit`, and
    /// the launch's events are not sent. No answer.
    SubmitAnswered(Command),
    /// [`super::Backend::spin_for`]: poll the link this long after each
    /// message from now on (0: the default). No answer.
    Spin {
        /// µs.
        us: u64,
    },
    /// [`super::Backend::poll`], after every message sent before it.
    /// Answered by [`FromDevice::Polled`], or by [`FromDevice::ContextLost`]
    /// or [`FromDevice::Fatal`] if the device failed since the last poll.
    Poll,
    /// `Poll`, held while the device is busy (docs/daemon.md, "Held polls"):
    /// the device process polls its device again and again for at most `us`
    /// µs and answers at the first news (an event, an end seen ahead, a
    /// load, a pin, a move or a failure), as soon as the daemon sends any
    /// other message, or when its device has nothing due within the hold.
    /// Still lockstep: the device is polled only inside this message's
    /// handling, after every message sent before it and before any sent
    /// after. Answered as `Poll`.
    PollHeld {
        /// How long it may hold, µs.
        us: u32,
    },
    /// Ends a [`ToDevice::PollHeld`] being held (the daemon has a request
    /// that waits for the poll's answer); nothing otherwise. No answer.
    EndHold,
    /// One piece of [`super::Backend::read_back`] ([`super::pieces`]) or
    /// [`super::Backend::read_to_region`]: the allocation's `bytes` bytes
    /// from `offset` copied to `region` at `at` (the daemon's staging
    /// region, or a split's region, registered before). Answered by
    /// [`FromDevice::Piece`].
    ReadPiece {
        /// The allocation.
        addr: DevAddr,
        /// Where in it the piece starts.
        offset: u64,
        /// The piece's length (it ends inside the region).
        bytes: u64,
        /// The region.
        region: RegionId,
        /// Where in the region the piece goes.
        at: u64,
    },
    /// One piece of [`super::Backend::write_in`] or
    /// [`super::Backend::write_from_region`]: `bytes` bytes of `region` from
    /// `at` copied into the allocation from `offset`. Answered by
    /// [`FromDevice::Piece`].
    WritePiece {
        /// The allocation.
        addr: DevAddr,
        /// Where in it the piece goes.
        offset: u64,
        /// The piece's length (it ends inside the region).
        bytes: u64,
        /// The region.
        region: RegionId,
        /// Where in the region the piece comes from.
        at: u64,
    },
    /// A launch command the daemon answered itself from an end the device
    /// reported ahead, and its operation's unbind right behind it, as one
    /// message (unless `GPUMUX_RETIRE_ANSWERED=0`, [`super::remote`]; issue 35):
    /// [`super::Backend::retire_answered`]. The device already saw the
    /// kernel end and gave its launch record back: it drops the operation's
    /// state, makes no launch and sends no event. No answer (a failure
    /// answers the next `Poll`).
    ///
    /// Last in the enum: a variant's number is its place (postcard), and
    /// the daemon and its device process are always one binary, so a new
    /// message needs no version of its own; it goes at the end all the same,
    /// so that the numbers of the others stay what they were.
    Retire {
        /// The launch the daemon answered.
        launch: LaunchId,
        /// Its operation, unbound with it.
        op: OpId,
    },
}

/// Device process → daemon.
// `Polled` is the large one and the one sent most (each poll's answer): a
// box would be an allocation per poll for a value that lives only between
// its read and its handling.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Serialize, Deserialize)]
pub enum FromDevice {
    /// The first message: the device is open.
    Ready {
        /// The device in words.
        describe: String,
        /// What the engine needs of it.
        info: DeviceInfo,
        /// [`super::Backend::frees_retreats_at_once`].
        frees_retreats_at_once: bool,
        /// [`super::Backend::compute_capability`].
        compute_capability: [u32; 2],
        /// [`super::Backend::swap_granularity`].
        swap_granularity: Option<u64>,
    },
    /// The first message instead of `Ready`: the device could not be opened
    /// (no GPU, no driver); the process exits after it.
    Unavailable {
        /// Why, for the person starting the daemon.
        message: String,
    },
    /// Answer to [`ToDevice::Alloc`].
    Alloc(Result<DevAddr, MemError>),
    /// Answer to [`ToDevice::Free`].
    Free(Result<(), MemError>),
    /// Answer to [`ToDevice::MemInfo`].
    MemInfo(Result<MemInfo, MemError>),
    /// Answer to [`ToDevice::Swap`]: an address (`Reserve`, `Readdress`) or
    /// the move's time in ns (`Evict`, `Restore`).
    Swapped(Result<u64, MemError>),
    /// Answer to [`ToDevice::RegisterHost`].
    Registered(Result<(), MemError>),
    /// Answer to [`ToDevice::SettleMoves`]: every move not yet reported.
    Settled(Vec<super::Moved>),
    /// Answer to [`ToDevice::LoadModule`].
    Module(Result<ModuleImage, LoadError>),
    /// Answer to [`ToDevice::Poll`]: what the device's poll reported, in its order.
    Polled {
        /// The events.
        events: Vec<Event>,
        /// Operations that ended without their work done ([`super::Backend::take_failed`]).
        failed: Vec<super::OpFailed>,
        /// Loads that finished ([`super::Backend::take_loaded`]).
        loaded: Vec<super::Loaded>,
        /// Pins that finished ([`super::Backend::take_registered`]).
        registered: Vec<super::Registered>,
        /// Buffer moves that finished ([`super::Backend::take_moved`]).
        moved: Vec<super::Moved>,
        /// Kernels that ran before their launch command ([`super::Backend::take_ends_ahead`]).
        ends_ahead: Vec<super::ends_ahead::EndAhead>,
        /// The device's [`super::Backend::next_wake`] right after that poll.
        wake: Wake,
        /// Where the exchange's time went in the device process ([`super::exchange_clock`]).
        times: super::exchange_clock::HostTimes,
    },
    /// Answer to [`ToDevice::Poll`]: the context is broken
    /// ([`super::Failure::ContextLost`]); the process does nothing more with
    /// the device and waits to be killed.
    ContextLost {
        /// Operations on the device at the time.
        suspects: Vec<OpId>,
        /// The driver's words.
        what: String,
    },
    /// Answer to [`ToDevice::Poll`]: the device failed in a way no restart
    /// fixes ([`super::Failure::Fatal`]).
    Fatal {
        /// The error, with its causes.
        what: String,
    },
    /// Answer to [`ToDevice::ReadPiece`] and [`ToDevice::WritePiece`].
    Piece(Result<(), MemError>),
}

impl FromDevice {
    /// The message's name, for errors about an unexpected one.
    pub fn name(&self) -> &'static str {
        match self {
            FromDevice::Ready { .. } => "Ready",
            FromDevice::Unavailable { .. } => "Unavailable",
            FromDevice::Alloc(_) => "Alloc",
            FromDevice::Free(_) => "Free",
            FromDevice::MemInfo(_) => "MemInfo",
            FromDevice::Swapped(_) => "Swapped",
            FromDevice::Registered(_) => "Registered",
            FromDevice::Settled(_) => "Settled",
            FromDevice::Module(_) => "Module",
            FromDevice::Polled { .. } => "Polled",
            FromDevice::ContextLost { .. } => "ContextLost",
            FromDevice::Fatal { .. } => "Fatal",
            FromDevice::Piece(_) => "Piece",
        }
    }
}

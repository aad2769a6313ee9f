//! What the daemon needs of a device (docs/daemon.md, "Devices").
//!
//! A [`Backend`] is three things at once: device memory (allocations the
//! daemon hands out as buffer handles), a module compiler (CUDA C source →
//! preemptible workers, cached by source and options), and the engine's
//! device contract ([`gpumux_engine::Device`]'s commands and events) driven
//! in **real time**: device time is nanoseconds since the backend opened,
//! [`Backend::poll`] never blocks, and the core thread sleeps until
//! [`Backend::next_wake`] when no request comes in.
//!
//! The engine's commands carry the stream operation they serve (`op`); the
//! daemon binds each operation's real work (code and arguments, addresses
//! and host spans) with [`Backend::bind`] before the engine can start it,
//! and the backend looks it up when the command comes.
//!
//! Two devices: [`sim`] (host memory, simulated time, kernels compute
//! nothing) and [`cuda`] (one CUDA context on a real GPU). Either runs in
//! the daemon's process or, behind [`remote`], in a child process the daemon
//! restarts after a fault ([`link`] and [`wire`] are how the two talk).

use crate::shm::ShmRegion;
use gpumux_engine::device::{Command, DeviceError, Event, ReleaseCause};
use gpumux_engine::ids::{LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::time::Nanos;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod answers_ahead;
pub mod capped;
pub mod compile;
pub mod copy_engine;
pub mod cuda;
pub mod ends_ahead;
pub mod exchange_clock;
pub mod link;
pub mod pieces;
pub mod remote;
pub mod sim;
pub mod wire;

/// A device address (the simulated device's are made up, but stable).
pub type DevAddr = u64;

/// Device memory, as the device reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemInfo {
    /// Free, bytes.
    pub free: u64,
    /// In all, bytes.
    pub total: u64,
}

/// The backend's handle on one compiled kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KernelCode(pub u64);

/// One kernel of a loaded module, with what the engine needs to know of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelImage {
    /// Its name in the source.
    pub name: String,
    /// Its code, for [`OpWork::Kernel`].
    pub code: KernelCode,
    /// Parameter sizes in bytes, in order, where the device knows them
    /// (launches with other sizes are refused before they reach the engine).
    pub param_sizes: Option<Vec<u32>>,
    /// Registers per thread (occupancy).
    pub regs_per_thread: u32,
    /// Static shared memory per block, bytes.
    pub static_smem: u32,
    /// The most threads per block it can be launched with.
    pub max_threads_per_block: u32,
    /// The most dynamic shared memory per block it can be launched with, bytes.
    pub max_dynamic_smem: u32,
}

/// A compiled module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleImage {
    /// Its kernels.
    pub kernels: Vec<KernelImage>,
    /// The compiler's log (warnings).
    pub log: String,
    /// Found in the cache rather than compiled now.
    pub cached: bool,
}

/// Why a module did not load.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum LoadError {
    /// The transformation refuses a kernel of it.
    #[error("{message}")]
    Transform {
        /// 1-based line.
        line: u32,
        /// The transformation's message (line and reason).
        message: String,
    },
    /// The compiler refuses it; the log says why.
    #[error("{log}")]
    Compile {
        /// NVRTC's log.
        log: String,
    },
    /// The device failed (no NVRTC, a driver error).
    #[error("{0}")]
    Device(String),
}

/// Why a memory request failed.
#[derive(Debug, thiserror::Error, Serialize, Deserialize)]
pub enum MemError {
    /// The device has not that much free.
    #[error("the device has no {bytes} bytes free ({free} of {total} free){}", if bound.is_empty() { String::new() } else { format!("; {bound}") })]
    OutOfMemory {
        /// Asked for.
        bytes: u64,
        /// Free now.
        free: u64,
        /// In all.
        total: u64,
        /// What bounds the device's memory, in words, where it is a rule
        /// and not the hardware (the simulated device's); else empty.
        bound: String,
    },
    /// The device failed.
    #[error("{0}")]
    Device(String),
}

/// A span of a client's shared region: what a copy reads or writes on the host.
#[derive(Clone, Debug)]
pub struct HostSpan {
    /// The region, kept mapped (and registered) while the operation lives.
    pub region: Arc<ShmRegion>,
    /// Offset in it.
    pub offset: u64,
}

/// The real work behind one engine operation. `S` is how a host span is
/// named: a [`HostSpan`] in the daemon, a [`wire::HostRef`] on the way to
/// the device process (the region's number there instead of its mapping).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum OpWork<S = HostSpan> {
    /// A kernel launch: code, shape and its parameters, each as the bytes the
    /// kernel expects (buffer handles already turned into device addresses).
    Kernel {
        /// The code.
        code: KernelCode,
        /// Grid, blocks.
        grid: [u32; 3],
        /// Block, threads.
        block: [u32; 3],
        /// Dynamic shared memory per block.
        shared_bytes: u32,
        /// One entry per parameter.
        params: Vec<Vec<u8>>,
        /// The kernel before it on its stream, if nothing but markers
        /// (recorded events, syncs: they order nothing on the GPU) lies
        /// between them: a device may queue this kernel's work behind it
        /// (the CUDA device's queue ahead, `gpumux_cuda::client` docs).
        after: Option<OpId>,
        /// Only blocks `[start, end)` of the grid (linear index), the
        /// engine's block 0 being `start`: a part of a split launch
        /// (`core/split.rs`); `None`: the whole grid.
        range: Option<[u64; 2]>,
    },
    /// `bytes` from the host span to `dst`.
    ToDevice {
        /// Destination.
        dst: DevAddr,
        /// Source.
        src: S,
        /// How many.
        bytes: u64,
    },
    /// `bytes` from `src` to the host span.
    ToHost {
        /// Source.
        src: DevAddr,
        /// Destination.
        dst: S,
        /// How many.
        bytes: u64,
    },
    /// Device to device.
    DeviceCopy {
        /// Source.
        src: DevAddr,
        /// Destination.
        dst: DevAddr,
        /// How many.
        bytes: u64,
    },
    /// Fill with a byte.
    Memset {
        /// Destination.
        dst: DevAddr,
        /// The byte.
        value: u8,
        /// How many.
        bytes: u64,
    },
    /// Fill with a 16- or 32-bit word (`Request::Fill`).
    Fill {
        /// Destination, aligned to `width`.
        dst: DevAddr,
        /// The word (its low 16 bits for `width` 2).
        value: u32,
        /// Bytes a word: 2 or 4.
        width: u8,
        /// How many bytes, a multiple of `width`.
        bytes: u64,
    },
    /// A pitched copy (`Request::Copy2D`, `cuMemcpy2DAsync`): `height` rows
    /// of `width` bytes; not host to host (the core refuses that).
    Copy2D {
        /// Where the rows are read.
        src: Side2D<S>,
        /// Where they are written.
        dst: Side2D<S>,
        /// Bytes a row, at most either pitch.
        width: u64,
        /// Rows.
        height: u64,
    },
}

/// One side of an [`OpWork::Copy2D`]: its first row and its pitch, the span
/// of all its rows checked by the core.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Side2D<S = HostSpan> {
    /// Device memory.
    Device {
        /// The first row.
        addr: DevAddr,
        /// Bytes from one row's start to the next's.
        pitch: u64,
    },
    /// A host region.
    Host {
        /// The first row.
        span: S,
        /// Bytes from one row's start to the next's.
        pitch: u64,
    },
}

impl<S> Side2D<S> {
    /// Bytes from one row's start to the next's.
    pub fn pitch(&self) -> u64 {
        match self {
            Side2D::Device { pitch, .. } | Side2D::Host { pitch, .. } => *pitch,
        }
    }

    /// The same side with its host span turned into another form by `f`.
    pub fn map_span<T, E>(self, f: &mut impl FnMut(S) -> Result<T, E>) -> Result<Side2D<T>, E> {
        Ok(match self {
            Side2D::Device { addr, pitch } => Side2D::Device { addr, pitch },
            Side2D::Host { span, pitch } => Side2D::Host { span: f(span)?, pitch },
        })
    }
}

/// Bytes from a pitched range's first byte to its last, plus one:
/// `(height - 1) × pitch + width`; `None` on overflow or an empty range.
pub fn pitched_extent(pitch: u64, width: u64, height: u64) -> Option<u64> {
    if width == 0 || height == 0 {
        return None;
    }
    (height - 1).checked_mul(pitch)?.checked_add(width)
}

impl<S> OpWork<S> {
    /// The same work with each host span turned into another form by `f`.
    pub fn map_spans<T, E>(self, mut f: impl FnMut(S) -> Result<T, E>) -> Result<OpWork<T>, E> {
        Ok(match self {
            OpWork::Kernel { code, grid, block, shared_bytes, params, after, range } => {
                OpWork::Kernel { code, grid, block, shared_bytes, params, after, range }
            }
            OpWork::ToDevice { dst, src, bytes } => OpWork::ToDevice { dst, src: f(src)?, bytes },
            OpWork::ToHost { src, dst, bytes } => OpWork::ToHost { src, dst: f(dst)?, bytes },
            OpWork::DeviceCopy { src, dst, bytes } => OpWork::DeviceCopy { src, dst, bytes },
            OpWork::Memset { dst, value, bytes } => OpWork::Memset { dst, value, bytes },
            OpWork::Fill { dst, value, width, bytes } => OpWork::Fill { dst, value, width, bytes },
            OpWork::Copy2D { src, dst, width, height } => {
                OpWork::Copy2D { src: src.map_span(&mut f)?, dst: dst.map_span(&mut f)?, width, height }
            }
        })
    }
}

/// An operation the device ended without doing its work, for a reason of
/// its own (a binding the device refused, a launch the driver refused): the
/// engine saw it end as usual, and its client must hear why (the error is
/// sticky on its stream: the next sync reports it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpFailed {
    /// The operation.
    pub op: OpId,
    /// Why, in words.
    pub why: String,
}

/// A module load started with [`Backend::start_load`] that finished.
#[derive(Debug, Serialize, Deserialize)]
pub struct Loaded {
    /// The caller's token of the load.
    pub token: u64,
    /// The module, or why it did not load.
    pub result: Result<ModuleImage, LoadError>,
}

/// A buffer move of [`Backend::start_move`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BufferMove {
    /// [`Backend::evict`] the buffer at this address.
    Evict(DevAddr),
    /// [`Backend::restore`] the buffer at this address.
    Restore(DevAddr),
}

/// A move started with [`Backend::start_move`] that finished.
#[derive(Debug, Serialize, Deserialize)]
pub struct Moved {
    /// The caller's token of the move.
    pub token: u64,
    /// Done (with the time it took, ns, or 0 where the device does not
    /// model it), or why not: then nothing changed, as for `evict` and
    /// `restore`.
    pub result: Result<Nanos, MemError>,
}

/// A pin started with [`Backend::start_register`] that finished.
#[derive(Debug, Serialize, Deserialize)]
pub struct Registered {
    /// The caller's token of the pin.
    pub token: u64,
    /// Done, or why not (the region is then not registered).
    pub result: Result<(), MemError>,
}

/// What the core should do about a device error.
#[derive(Debug)]
pub enum Failure {
    /// The context is broken (a kernel faulted): every device allocation,
    /// module and operation is gone. `suspects` are the operations that were
    /// running on the device when it happened (the culprit is among them; the
    /// driver does not say which); `what` is the driver's message.
    ContextLost {
        /// Operations running at the time.
        suspects: Vec<OpId>,
        /// The driver's words.
        what: String,
    },
    /// Anything else: the daemon logs it and stops (a bug, or a device gone).
    Fatal(DeviceError),
}

/// When the core must look at the device again (serializable: a device
/// process reports its device's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Wake {
    /// Nothing is in flight: wait for requests only.
    Idle,
    /// Not before this long from now.
    After(Duration),
    /// Poll again at once (a real GPU: completions are seen by polling).
    Spin,
}

/// What a look between a device process's messages did ([`Backend::look_between`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Looked {
    /// Kernels run ahead seen ended (reported with the next poll's answer).
    pub ended: u64,
    /// Kernels queued behind a run's last one.
    pub queued: u64,
    /// It stopped at its bound of posts with a run that may go on: look
    /// again while no message waits, whether or not another end landed.
    pub more: bool,
}

/// A device the daemon serves (module doc).
///
/// The wrappers around another backend ([`capped::Capped`],
/// [`answers_ahead::AnswersAhead`]) write out every method, those with a
/// default too: their impls deny clippy's `missing_trait_methods`, so a
/// method added here fails clippy until each wrapper forwards it (or says
/// why not). A forward forgotten was a real bug: `Capped` lost the spans
/// and region copies, which have defaults that do nothing.
pub trait Backend: Send {
    /// The device in words, for `Welcome` and `gpumux ps`.
    fn describe(&self) -> String;
    /// What the engine needs of it (SMs, limits).
    fn info(&self) -> &DeviceInfo;
    /// Compute capability, major and minor, for `DeviceProperties` (a
    /// simulated device answers its preset's; `[0, 0]`: unknown).
    fn compute_capability(&self) -> [u32; 2] {
        [0, 0]
    }

    /// Whether an `OpWork::Kernel` whose engine kernel has fewer blocks than
    /// its grid runs them as a block range of the whole launch (a split
    /// launch's part, core/split.rs; `OpWork::Kernel::range`). The simulated
    /// device does (its kernels compute nothing: a range is its block
    /// count), the CUDA device does (`ClientDevice::run_range`), a device
    /// process does what its device does. A device that does not runs split
    /// launches whole.
    fn runs_block_ranges(&self) -> bool {
        false
    }

    /// Device memory now.
    fn mem_info(&mut self) -> Result<MemInfo, MemError>;
    /// Allocates `bytes` (> 0).
    fn alloc(&mut self, bytes: u64) -> Result<DevAddr, MemError>;
    /// Frees an allocation of [`Backend::alloc`] or [`Backend::reserve`],
    /// resident or evicted (its host copy then goes too). The daemon frees
    /// only when no bound operation uses it.
    fn free(&mut self, addr: DevAddr) -> Result<(), MemError>;
    /// Oversubscription (docs/daemon.md, "Memory oversubscription"): the
    /// smallest buffer this device can evict, bytes (its mapping
    /// granularity: a smaller buffer stays resident, as evicting it frees
    /// little); `None`: it cannot evict at all. Devices that can keep a
    /// buffer's address across an eviction ([`Backend::evict`]).
    fn swap_granularity(&self) -> Option<u64> {
        None
    }
    /// An address for a buffer of `bytes` with no device memory behind it:
    /// a buffer born evicted (its contents zero), brought in by
    /// [`Backend::restore`]. For an allocation that does not fit now.
    fn reserve(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        Err(no_swap(bytes))
    }
    /// Moves the buffer at `addr` (an allocation of at least
    /// [`Backend::swap_granularity`] bytes) to host memory and gives its
    /// device memory back; its address stays reserved. Returns how long
    /// from now the move is done, ns: a simulated device's model of its host
    /// link; 0 for a device whose call returns with the copy done (CUDA). The daemon evicts only a buffer no
    /// bound operation can touch.
    fn evict(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        Err(MemError::Device(format!("this device cannot evict {addr:#x}")))
    }
    /// Undoes [`Backend::evict`] (or [`Backend::reserve`]): device memory
    /// mapped at the same address, the contents copied back, the host copy
    /// freed. Returns the move's time, as `evict`. `OutOfMemory`: nothing
    /// changed.
    fn restore(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        Err(MemError::Device(format!("this device cannot restore {addr:#x}")))
    }
    /// Starts a move without waiting for it (issue 39: a move of 84 GB held
    /// the device, and every client's launches, for seconds): the device
    /// moves buffers in the order they were started, on a thread and
    /// streams of its own, so a restore started after the evictions that
    /// make its room finds it. `Some`: done already (a device that moves
    /// in the call: this default); `None`: [`Backend::take_moved`] reports
    /// it with `token`. The daemon starts a move only of a buffer no bound
    /// operation can touch, and frees a buffer under way only through
    /// [`Backend::free`], which waits for its move.
    fn start_move(&mut self, _token: u64, what: BufferMove) -> Option<Result<Nanos, MemError>> {
        Some(match what {
            BufferMove::Evict(addr) => self.evict(addr),
            BufferMove::Restore(addr) => self.restore(addr),
        })
    }
    /// Appends the moves of [`Backend::start_move`] that finished (the core
    /// takes them after each poll, and looks again each poll period while
    /// any is under way).
    fn take_moved(&mut self, _out: &mut Vec<Moved>) {}
    /// Waits for every move under way and appends them as
    /// [`Backend::take_moved`] would (a lost context: the core settles its
    /// account of the moves before it rebuilds).
    fn settle_moves(&mut self, out: &mut Vec<Moved>) {
        self.take_moved(out)
    }
    /// Evicted buffers' host copies outlive [`Backend::rebuild`] (they are
    /// in this process); `false` for a device process, which takes them
    /// with it when it is restarted.
    fn evicted_survive_rebuild(&self) -> bool {
        false
    }
    /// After [`Backend::rebuild`]: the evicted buffer that was at `addr`
    /// gets an address in the new context (the same where the device can)
    /// and keeps its host copy. An error: its contents are gone with the
    /// old context (a device process that died held them).
    fn readdress_evicted(&mut self, addr: DevAddr) -> Result<DevAddr, MemError> {
        Err(MemError::Device(format!("this device kept no evicted buffer at {addr:#x}")))
    }
    /// The `bytes` of the allocation at `addr`, read back now with nothing
    /// of the device running on it (a client moving to another GPU:
    /// `core/handover.rs`). `None`: this device cannot, and the client stays.
    fn read_back(&mut self, addr: DevAddr, bytes: u64) -> Option<Result<Vec<u8>, MemError>> {
        self.read_span(addr, 0, bytes)
    }
    /// Writes `data` at the start of the allocation at `addr` now (a moved
    /// client's buffer on its new GPU). `None`: this device cannot.
    fn write_in(&mut self, addr: DevAddr, data: &[u8]) -> Option<Result<(), MemError>> {
        self.write_span(addr, 0, data)
    }
    /// [`Backend::read_back`] of the `bytes` bytes from `offset` on (a
    /// split's declared slices, a merge's changed words: only the bytes
    /// wanted cross). An error for a span past the allocation's end.
    fn read_span(&mut self, _addr: DevAddr, _offset: u64, _bytes: u64) -> Option<Result<Vec<u8>, MemError>> {
        None
    }
    /// [`Backend::write_in`] at `offset` of the allocation.
    fn write_span(&mut self, _addr: DevAddr, _offset: u64, _data: &[u8]) -> Option<Result<(), MemError>> {
        None
    }
    /// `len` bytes of the allocation at `addr` from `offset` copied now into
    /// `region` at `at`, by the device itself (a split's bytes: the region
    /// is shared by the daemon's devices and registered with each, pinned
    /// on a GPU, so each piece is one DMA and another GPU's device copies
    /// from the same bytes, with no copy in the daemon between). `None`:
    /// this device cannot.
    fn read_to_region(
        &mut self,
        _addr: DevAddr,
        _offset: u64,
        _region: &Arc<ShmRegion>,
        _at: u64,
        _len: u64,
    ) -> Option<Result<(), MemError>> {
        None
    }
    /// `len` bytes of `region` from `at` copied now into the allocation at
    /// `addr` from `offset` (as [`Backend::read_to_region`]).
    fn write_from_region(
        &mut self,
        _addr: DevAddr,
        _offset: u64,
        _region: &Arc<ShmRegion>,
        _at: u64,
        _len: u64,
    ) -> Option<Result<(), MemError>> {
        None
    }
    /// One piece of a read-back ([`pieces`]): `into.len()` bytes of the
    /// allocation at `addr` from `offset` on, copied now into `into` (host
    /// memory this device registered, where it is a region of a device
    /// process). `None`: this device cannot.
    fn read_piece(&mut self, _addr: DevAddr, _offset: u64, _into: &mut [u8]) -> Option<Result<(), MemError>> {
        None
    }
    /// One piece of a write-in: `from` copied now into the allocation at
    /// `addr` from `offset` on. `None`: this device cannot.
    fn write_piece(&mut self, _addr: DevAddr, _offset: u64, _from: &[u8]) -> Option<Result<(), MemError>> {
        None
    }
    /// Makes a client's shared region usable by copies (a real GPU pins it).
    fn register_host(&mut self, region: &Arc<ShmRegion>) -> Result<(), MemError>;
    /// Starts registering a region without waiting: pinning takes long for a
    /// large one (1 GiB: 716 ms on the H100 machine, every client waiting
    /// while the core did it), so a real GPU pins on a thread of its own.
    /// [`Backend::take_registered`] reports it with `token`; from then on it
    /// is registered as by [`Backend::register_host`]. The caller keeps the
    /// region and does not unregister it before that.
    fn start_register(&mut self, token: u64, region: &Arc<ShmRegion>);
    /// Appends the pins of [`Backend::start_register`] that finished (the
    /// core takes them after each poll).
    fn take_registered(&mut self, out: &mut Vec<Registered>);
    /// Undoes [`Backend::register_host`] once no bound operation uses the region.
    fn unregister_host(&mut self, region: &ShmRegion);

    /// Transforms and compiles a module (or finds it in the cache).
    fn load_module(&mut self, name: &str, source: &str, options: &[String]) -> Result<ModuleImage, LoadError>;
    /// Starts loading a module without waiting for it: the transformation
    /// and the compile (tens of ms with NVRTC) run off the calling thread
    /// where the device can, so the core and a device process serve every
    /// other client meanwhile (issue 35: a compile held both for 40-50 ms,
    /// and every client's launches waited). The result comes from
    /// [`Backend::take_loaded`] with `token`; [`Backend::next_wake`] asks
    /// for a look while loads are under way. A load under way when the
    /// context is rebuilt finishes on the new one.
    fn start_load(&mut self, token: u64, name: &str, source: &str, options: &[String]);
    /// Appends the loads of [`Backend::start_load`] that finished since the
    /// last call (the core takes them after each poll).
    fn take_loaded(&mut self, out: &mut Vec<Loaded>);
    /// Undoes one [`Backend::load_module`] whose kernels (`kernels`, all of
    /// that load's) no client can launch any more. Operations still bound to
    /// them keep their code until unbound; a load that returned the same
    /// kernels as another (a cached image) keeps them for the other.
    fn unload_module(&mut self, kernels: &[KernelCode]);
    /// Kernels loaded and not unloaded (a long-lived daemon's leak check).
    fn kernels_loaded(&self) -> usize;

    /// Binds the work of engine operation `op`, before the engine may start
    /// it. A binding the device refuses is not an error of the call: the
    /// operation ends at once having run nothing when the engine starts it,
    /// and [`Backend::take_failed`] reports it with the reason.
    fn bind(&mut self, op: OpId, work: OpWork);
    /// Forgets an operation that completed or was dropped.
    fn unbind(&mut self, op: OpId);

    /// Device time now, ns since the backend opened.
    fn now(&self) -> Nanos;
    /// [`Backend::now`] at `at`, an instant the caller has just read: a
    /// backend whose device time is the monotonic clock since it opened
    /// answers without reading the clock again (the core's path read it
    /// ~20 times a launch: issue 35's callgrind). By default, a read now.
    fn now_at(&self, at: Instant) -> Nanos {
        let _ = at;
        self.now()
    }
    /// Carries out an engine command at device time now.
    fn submit(&mut self, command: Command) -> Result<(), Failure>;
    /// Appends what happened by now (never blocks) and returns the device time.
    fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure>;
    /// Appends the operations that ended without their work being done
    /// ([`OpFailed`]) since the last call; the core takes them after each
    /// poll, before the engine hears of their end.
    fn take_failed(&mut self, out: &mut Vec<OpFailed>);
    /// Sends a poll whose answer the next [`Backend::poll`] takes, so that
    /// the core can handle client requests while a device in another
    /// process works through the commands before it. `false`: this backend
    /// answers polls at once (in-process), or it failed (the poll says so).
    fn start_poll(&mut self) -> bool {
        false
    }
    /// The answer to [`Backend::start_poll`]'s poll is here (or none is
    /// awaited): [`Backend::poll`] will not wait.
    fn poll_ready(&mut self) -> bool {
        true
    }
    /// [`Backend::start_poll`], the device allowed to hold its answer up to
    /// `hold` while it is busy and has no news (a device in another process:
    /// docs/daemon.md, "Held polls"); the core sets `hold` by its timers.
    fn start_held_poll(&mut self, _hold: Duration) -> bool {
        self.start_poll()
    }
    /// Ends the hold of a poll started with [`Backend::start_held_poll`]
    /// whose answer a request waits for.
    fn end_hold(&mut self) {}
    /// When to poll next if no request comes.
    fn next_wake(&self) -> Wake;
    /// How long a device in another process should poll for the next message
    /// after each (`Duration::ZERO`: its default); see `crate::spin`.
    fn spin_for(&mut self, _window: Duration) {}
    /// The device frees a retreat's SMs in the command itself (the CUDA
    /// device: its workers leave after their block while the next launch
    /// there waits for their places): the engine may then give them out in
    /// the same turn (`Engine::with_retreats_freeing_at_once`).
    fn frees_retreats_at_once(&self) -> bool {
        false
    }
    /// Keep the ends of kernels the device ran before the engine launched
    /// them for [`Backend::take_ends_ahead`] (a device process asks, to send
    /// them to the daemon: [`ends_ahead`]). A device that runs nothing ahead
    /// ignores it.
    fn report_ends_ahead(&mut self) {}
    /// Hold the messages to a device in another process from now until
    /// [`Backend::release_sends`], and send them then as one write (the
    /// same messages in the same order: `link::Link::hold`). The core holds
    /// a launch's command and, for one answered from its end known ahead,
    /// its operation's unbind: one write per kernel of a chain where there
    /// were two. Anything that waits for the device sends them first.
    /// A device in this process has nothing to hold.
    fn hold_sends(&mut self) {}
    /// Sends what [`Backend::hold_sends`] held, and stops holding.
    fn release_sends(&mut self) {}
    /// Appends the ends seen ahead since the last call ([`Backend::report_ends_ahead`]).
    fn take_ends_ahead(&mut self, _out: &mut Vec<ends_ahead::EndAhead>) {}
    /// Kernels run ahead whose ends the device can see without a poll's
    /// work (the CUDA device: ends published in host memory): `Some`, with
    /// whether one has landed since the last poll; `None`: nothing to watch
    /// (or the device does not say). A held poll in a device process polls
    /// the device when this turns `Some(true)`, and not back to back while
    /// it says `Some(false)` (`device_host::hold`).
    fn run_end_landed(&self) -> Option<bool> {
        None
    }
    /// A look between a device process's messages (`GPUMUX_DEEPEN_BETWEEN`,
    /// [`crate::device_host`], "Between messages"): the CUDA device sees the
    /// ends of its runs from host memory and lets the runs go on by at most
    /// `posts` kernels. It makes no event and ends no launch; the ends it saw
    /// go with the next poll's [`Backend::take_ends_ahead`]. A failure is the
    /// next poll's answer. A device that runs nothing ahead does nothing.
    fn look_between(&mut self, _posts: usize) -> Result<Looked, Failure> {
        Ok(Looked::default())
    }
    /// Carries out a launch command the daemon answered itself from an end
    /// this device reported ahead ([`ends_ahead`]): the device adopts what it
    /// ran and ends the launch (the device process drops its events).
    fn submit_answered(&mut self, command: Command) -> Result<(), Failure> {
        self.submit(command)
    }
    /// [`Backend::submit_answered`] of launch `launch` of `op` and
    /// [`Backend::unbind`] of `op` at once, the command itself not sent
    /// (a device process's `ToDevice::Retire`; off with `GPUMUX_RETIRE_ANSWERED=0`):
    /// the device saw the kernel end and reported it ([`ends_ahead`]), so
    /// it drops what it keeps of the operation, makes no launch and reports
    /// no event for it. By default, the unbind alone: a device that runs
    /// nothing ahead keeps nothing of a launch it never had.
    fn retire_answered(&mut self, launch: LaunchId, op: OpId) -> Result<(), Failure> {
        let _ = launch;
        self.unbind(op);
        Ok(())
    }
    /// Launch commands answered without the device from ends it saw ahead
    /// so far ([`ends_ahead`]; a device process's daemon side).
    fn ends_answered(&self) -> u64 {
        0
    }
    /// Appends the events of launch commands this backend answered itself
    /// since the last poll (ends known ahead, [`ends_ahead`]), for the engine
    /// to read now, in the turn that made them, instead of at the next poll:
    /// true if there were any. The core then launches the next kernel of a
    /// chain whose end is known too, and so on, with no device round between.
    fn take_answered(&mut self, _events: &mut Vec<Event>) -> bool {
        false
    }
    /// Where the exchanges with a device in another process went since the
    /// last call, in words ([`exchange_clock`]); `None` in-process.
    fn exchange_lap(&mut self) -> Option<String> {
        None
    }

    /// After [`Failure::ContextLost`]: a fresh context, with no memory,
    /// modules or operations (the daemon re-allocates and reloads what its
    /// clients had).
    fn rebuild(&mut self) -> Result<(), MemError>;
}

/// The error of a device that cannot swap ([`Backend::reserve`]).
fn no_swap(bytes: u64) -> MemError {
    MemError::Device(format!("this device cannot hold a buffer of {bytes} bytes evicted (it does not swap)"))
}

/// The operation a launch or copy serves.
pub(crate) fn refused_op(command: &Command) -> Option<OpId> {
    match command {
        Command::Launch { op, .. } | Command::Copy { op, .. } => Some(*op),
        Command::Grow { .. } | Command::Retreat { .. } => None,
    }
}

/// What the engine hears of a launch or copy that ends without running:
/// its SMs released, its blocks reported done, the copy done.
pub(crate) fn ended_at_once(command: &Command) -> Vec<Event> {
    let mut out = Vec::new();
    ended_at_once_into(command, &mut out);
    out
}

/// [`ended_at_once`], appended to `out`: the answers ahead of a chain's
/// kernels go to a list kept from turn to turn, with no allocation per
/// kernel (issue 35's callgrind).
pub(crate) fn ended_at_once_into(command: &Command, out: &mut Vec<Event>) {
    match command {
        Command::Launch { launch, blocks, sms, .. } => {
            out.extend(sms.iter().map(|sm| Event::SmReleased { launch: *launch, sm, cause: ReleaseCause::Exhausted }));
            out.push(Event::LaunchEnded {
                launch: *launch,
                remaining: Default::default(),
                saved: Vec::new(),
                completed: blocks.len(),
            });
        }
        Command::Copy { copy, .. } => out.push(Event::CopyDone { copy: *copy }),
        Command::Grow { .. } | Command::Retreat { .. } => {}
    }
}

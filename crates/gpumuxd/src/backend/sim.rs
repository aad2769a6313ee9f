//! The simulated device behind the daemon (`--device sim:h100`, or any
//! preset of [`gpumux_sim::presets`]).
//!
//! **Time** is real: device time is wall-clock nanoseconds since the backend
//! opened (or was rebuilt), busy or idle, by one rule with one exception.
//! The rule: the simulator follows the clock up to its next event and stops
//! there until the core polls (the core must see an event before its
//! commands can cross it, as in lockstep: docs/daemon.md, "Where the device
//! runs"). A poll advances [`SimGpu`] to the clock and reports the first
//! instant with events, at that instant; the first command after a poll
//! takes effect at the clock's time, or one nanosecond before the next
//! unseen event if that is sooner ([`SimGpu::catch_up`]), and the other
//! commands until the next poll join it. So a client's launch after an idle
//! stretch, or between polls of a busy device, takes its whole time from
//! when it came (the clock used to stand still while nobody polled). The
//! exception: the core's answer to the events a poll reported (the next
//! kernel of a stream, a grant of released SMs) takes effect at their
//! instant, until a poll reports nothing new: the core's reaction time is
//! not charged, alike whether other clients keep the device busy or not, so
//! kernels queued in the engine run back to back as in `gpumux run`, and an
//! alone run compares with a shared one like for like (a host's wake-up
//! latency, hundreds of µs on a loaded CI host, would otherwise be charged
//! per kernel, more to a client alone than beside busy neighbours). Behind
//! the clock (past `EVENTS_PER_POLL`), commands take effect at the
//! simulator's time.
//!
//! Memory is real too, in host RAM: one zeroed anonymous mapping per
//! allocation, so copies and memsets move the client's bytes when the
//! simulator says they are done and data round-trips bitwise. Kernels compute
//! nothing: they take their simulated time (from the launch's
//! `block_time_ns`). Modules go through the real transformation, so a kernel
//! the GPU would refuse is refused here with the same message, but nothing is
//! compiled. A kernel whose body calls `__trap()` breaks the context when its
//! first block ends: the deterministic stand-in for a GPU fault that lets CI
//! test recovery.
//!
//! **What it checks in place of a compiler** (issue 36, case 9: a wrong
//! argument count or size, or a source that cannot compile, used to show up
//! only on a GPU; `gpumux_cuda::source_check`): a source whose brackets,
//! literals or comments a lexer sees unclosed, or with a kernel that does not
//! return `void`, fails to load with `Compile` and the lines; and a kernel
//! whose parameters are all of built-in types (pointers, scalars, vector
//! types) gets its parameter sizes, so a launch with other argument counts or
//! sizes is refused (`validate::launch`, and the client library before
//! sending). A kernel with a parameter of another type (a struct, a typedef,
//! a template parameter) gets none, and the module's log says which
//! parameter of which kernel.
//!
//! **Memory** is bounded by [`memory_bound`]: the preset's size, but at most
//! half of the host's physical memory, so clients cannot make the daemon's
//! host run out of RAM by filling "device" memory; an allocation past it is
//! `OutOfMemory` naming the bound. `sim:h100,memory=256MiB` gives a
//! smaller device (tests of oversubscription; policy studies).
//!
//! **Eviction** (docs/daemon.md, "Memory oversubscription") copies an
//! allocation's real bytes into a host store of its own and back, at the
//! same made-up address; each move takes the preset's host link time
//! (`pcie_latency_ns` + bytes / `pcie_bandwidth`), which the core waits
//! before the restored client's work may start, so policies pay for what
//! they move. The bytes are copied on a mover thread of the device's own,
//! one move after another in the order started, as a GPU's mover copies
//! them: the core's thread only starts a move and hears of its end (when
//! the link model says so and its bytes have landed, whichever is later),
//! and serves other clients meanwhile (issue 39). The host store is made
//! of chunks laid end to end, by the CUDA device's rule
//! (`gpumux_cuda::client::chunk_layout`: whole chunks, and a tail shorter
//! than half a chunk), with chunks of `SWAP_CHUNK`, smaller than a GPU's
//! 128 MiB so that the tests' buffers of tens of MiB cross several chunk
//! boundaries on their round trips.

use super::compile::WorkPool;
use super::copy_engine::{CopyEngine, Fill, Move, Rows, ON_THREAD_FROM};
use super::{
    pitched_extent, Backend, BufferMove, DevAddr, Failure, KernelCode, KernelImage, LoadError, Loaded, MemError,
    MemInfo, ModuleImage, Moved, OpFailed, OpWork, Registered, Side2D, Wake,
};
use crate::shm::ShmRegion;
use gpumux_cuda::lex::{lex, Kind};
use gpumux_cuda::transform::{transform, TransformError, BODY_SUFFIX};
use gpumux_engine::device::{Command, Device, DeviceError, Event};
use gpumux_engine::ids::{CopyId, LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::time::Nanos;
use gpumux_sim::{presets, SimGpu};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Device memory when a preset does not say (an H100's).
const DEFAULT_CAPACITY: u64 = 80 << 30;
/// The simulated device's memory is at most the host's physical memory
/// divided by this ([`memory_bound`]).
const HOST_MEMORY_DIVISOR: u64 = 2;
/// Where made-up device addresses start (far from 0, so a zero pointer is never valid).
const ADDRESS_BASE: DevAddr = 1 << 40;
/// Alignment of every allocation (what `cudaMalloc` guarantees).
const ALIGN: u64 = 256;
/// The smallest allocation the simulated device evicts: a GPU's mapping
/// granularity (2 MiB on the H100), so the simulator decides as the CUDA
/// device does.
const SWAP_GRANULARITY: u64 = 2 << 20;
/// The chunks of an evicted allocation's host store (module doc, "Eviction").
const SWAP_CHUNK: usize = 4 << 20;
/// The most simulator events one poll processes (a few ms of this thread's
/// time): a grid of 2^31 short blocks held the core in one poll for 186 s
/// while simulated time chased the clock (issue 36, case 4). Past it the
/// device runs behind the clock, and the core serves requests between polls.
const EVENTS_PER_POLL: u64 = 1_000;
/// A module's source and options, and its launchable kernels and log ([`launchable`]).
type SimTransform = ((String, Vec<String>), Result<Launchable, LoadError>);
/// How often moves under way on the copy engine's or the mover's thread
/// (and transformations) are looked for.
const MOVE_LOOK: Duration = Duration::from_micros(100);
/// Registers per thread the simulator assumes of a kernel (nothing is compiled to say).
const SIM_REGS_PER_THREAD: u32 = 32;
/// Dynamic shared memory a simulated kernel may take per block: CUDA's 48 KiB
/// default for a kernel that did not opt in to more.
const SIM_MAX_DYNAMIC_SMEM: u32 = 48 * 1024;

/// Why a `sim:` device name was refused.
#[derive(Debug, thiserror::Error)]
#[error("unknown simulated device `{0}`; known: {known}", known = presets::NAMES.iter().map(|n| format!("sim:{n}")).collect::<Vec<_>>().join(", "))]
pub struct UnknownPreset(pub String);

/// One allocation's bytes: an anonymous private mapping, zeroed by the
/// kernel and only backed where touched, so a client may "allocate" more
/// than the host would want to zero up front, and a failure is an error,
/// not an abort.
struct HostBlock {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value and only touched through &/&mut self.
unsafe impl Send for HostBlock {}

impl HostBlock {
    fn new(len: usize) -> Option<HostBlock> {
        // SAFETY: a fresh anonymous mapping; checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then(|| HostBlock { ptr: p.cast(), len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// An evicted allocation's host store: chunks laid end to end (module doc,
/// "Eviction"), holding `len` bytes from the first chunk's first byte.
struct Chunked {
    pieces: Vec<HostBlock>,
    len: usize,
}

impl Chunked {
    /// `len` bytes of zeros (fresh mappings).
    fn zeros(len: usize) -> Option<Chunked> {
        let (n, tail) = gpumux_cuda::client::chunk_layout(len, SWAP_CHUNK);
        let sizes = std::iter::repeat_n(SWAP_CHUNK, n).chain((tail > 0).then_some(tail));
        let pieces = sizes.map(HostBlock::new).collect::<Option<Vec<_>>>()?;
        Some(Chunked { pieces, len })
    }

    /// Its pieces filled with `bytes` (of its length), piece by piece.
    fn copy_in(&mut self, bytes: &[u8]) {
        let mut at = 0;
        for p in &mut self.pieces {
            let n = p.len.min(bytes.len() - at);
            p.bytes_mut()[..n].copy_from_slice(&bytes[at..at + n]);
            at += n;
        }
    }

    /// Its `len` bytes into `out` (of that length), piece by piece.
    fn copy_out(&self, out: &mut [u8]) {
        let mut at = 0;
        for p in &self.pieces {
            let n = p.len.min(out.len() - at);
            out[at..at + n].copy_from_slice(&p.bytes()[..n]);
            at += n;
        }
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// A buffer whose bytes the mover copied ([`SimBackend::mover`]), with the
/// address it keeps.
enum Landed {
    /// Evicted: its host store.
    Evicted(DevAddr, Chunked),
    /// Restored: its device memory.
    Restored(DevAddr, HostBlock),
}

/// A buffer move started ([`Backend::start_move`]).
struct MoveUnderWay {
    token: u64,
    /// When the host link model says it ends (device time).
    end: Nanos,
    result: Result<Nanos, MemError>,
    /// Its buffer, while the mover copies its bytes: the buffer is in
    /// neither `memory` nor `evicted` until they land.
    carrying: Option<DevAddr>,
}

/// A pending context fault: the trapping launch's first block ends at `at`.
struct Fault {
    at: Nanos,
    op: OpId,
    kernel: String,
}

/// The simulated backend (module doc).
pub struct SimBackend {
    /// Moves copies' bytes off the core (first: dropped, it waits for its
    /// moves before `memory` is unmapped).
    copy_engine: CopyEngine,
    info: DeviceInfo,
    seed: u64,
    sim: SimGpu,
    /// Wall-clock origin of device time.
    origin: Instant,
    /// The simulator's time: where the last `advance` left it.
    sim_now: Nanos,
    /// Commands went in since the last poll (the simulator settles them then).
    unsettled: bool,
    /// The last poll reported events: the core's commands until its next
    /// poll answer them, at their instant (module doc, "Time").
    reacting: bool,
    /// The last poll stopped short of the clock ([`EVENTS_PER_POLL`]).
    behind: bool,
    capacity: u64,
    /// What bounds `capacity`, in words, for `OutOfMemory` ([`memory_bound`]).
    memory_rule: String,
    used: u64,
    memory: BTreeMap<DevAddr, HostBlock>,
    /// Evicted allocations' bytes, by the address they keep (module doc).
    evicted: BTreeMap<DevAddr, Chunked>,
    next_addr: DevAddr,
    bound: crate::core::id_map::IdMap<OpId, OpWork>,
    copies: crate::core::id_map::IdMap<CopyId, OpId>,
    /// Compiled modules by source and options, and how many loads hold each
    /// (a load of the same source gets the same kernels).
    modules: HashMap<(String, Vec<String>), (ModuleImage, usize)>,
    /// Loads started ([`Backend::start_load`]): their transformation, on a
    /// thread; the kernels get codes when the load is taken, so a rebuild in
    /// between loads them into the new context.
    transforms: WorkPool<SimTransform>,
    /// Pins started, for [`Backend::take_registered`] (done at once).
    registered: Vec<Registered>,
    /// Copies evicted and restored buffers' bytes, one move after another
    /// in the order started, as a GPU's mover thread does (issue 39: copied
    /// on the core's thread, a 64 MiB buffer's moves cost an urgent client
    /// beside it 75-86 % of its rate). It owns a buffer's bytes, source and
    /// destination, until they land, so nothing else can touch them.
    mover: WorkPool<Option<Landed>>,
    /// Buffer moves started ([`Backend::start_move`]), each reported when
    /// the host link model says it ends and its bytes have landed.
    moves: Vec<MoveUnderWay>,
    /// When the moves started so far end: they run one after another, as a
    /// GPU's mover runs them (device time).
    link_free_at: Nanos,
    trapping: HashSet<KernelCode>,
    next_code: u64,
    fault: Option<Fault>,
    /// [`ENDS_AHEAD_VAR`]'s scripted ends, in a device process that asked.
    scripted: Option<ScriptedEnds>,
}

/// Set to `1` in a device process's environment, the simulated device
/// reports every one-block kernel bound to follow another on its stream as
/// ended ahead at its next poll, and ends such a launch that the daemon
/// answered without running it: a scripted device for tests of the daemon's
/// path for ends known ahead (`backend::ends_ahead`) without a GPU. The
/// simulator does not model queue ahead (the CUDA device's); off, nothing
/// changes.
pub const ENDS_AHEAD_VAR: &str = "GPUMUX_SIM_ENDS_AHEAD";

/// What [`ENDS_AHEAD_VAR`] scripts.
#[derive(Default)]
struct ScriptedEnds {
    /// Bound, run ahead, and not seen yet by a look between messages
    /// ([`Backend::look_between`]) or a poll.
    unseen: Vec<crate::backend::ends_ahead::EndAhead>,
    /// Seen by a look, for the next poll.
    report: Vec<crate::backend::ends_ahead::EndAhead>,
    /// Reported and not launched yet.
    reported: crate::core::id_map::IdSet<OpId>,
    /// The ends of answered launches, for the next poll (the device process drops them).
    answers: Vec<Event>,
}

impl SimBackend {
    /// Opens the preset `name` (`h100`, `sim:h100`, ...), with its options
    /// after commas (`memory=SIZE`: that much device memory; [`sim_spec`]).
    pub fn open(name: &str) -> Result<SimBackend, UnknownPreset> {
        let (preset, memory) = sim_spec(name)?;
        let mut info = presets::by_name(preset).ok_or_else(|| UnknownPreset(name.to_string()))?;
        if let Some(m) = memory {
            info.mem_bytes = m;
        }
        Ok(SimBackend::with_info(info))
    }

    /// Opens a simulated `info` (its memory: `mem_bytes`, or 80 GiB if 0,
    /// bounded by this host's memory: [`memory_bound`]).
    pub fn with_info(info: DeviceInfo) -> SimBackend {
        SimBackend::with_host_memory(info, host_memory())
    }

    /// [`SimBackend::with_info`] on a host of `host` bytes of physical memory (`None`: unknown).
    fn with_host_memory(mut info: DeviceInfo, host: Option<u64>) -> SimBackend {
        let seed = 0;
        let preset = if info.mem_bytes > 0 { info.mem_bytes } else { DEFAULT_CAPACITY };
        let (capacity, bound) = memory_bound(&info.name, preset, host);
        if capacity < preset {
            tracing::info!("{bound}");
        }
        // What clients see (`Welcome`, `gpumux ps`) is what they can allocate.
        info.mem_bytes = capacity;
        SimBackend {
            copy_engine: CopyEngine::new(),
            sim: SimGpu::new(info.clone(), seed).with_event_budget(EVENTS_PER_POLL),
            info,
            seed,
            origin: Instant::now(),
            sim_now: 0,
            unsettled: false,
            reacting: false,
            behind: false,
            capacity,
            memory_rule: bound,
            used: 0,
            memory: BTreeMap::new(),
            evicted: BTreeMap::new(),
            next_addr: ADDRESS_BASE,
            bound: Default::default(),
            copies: Default::default(),
            modules: HashMap::new(),
            transforms: WorkPool::new("gpumuxd-transform", 1),
            registered: Vec::new(),
            mover: WorkPool::new("gpumuxd-mover", 1),
            moves: Vec::new(),
            link_free_at: 0,
            trapping: HashSet::new(),
            next_code: 0,
            fault: None,
            scripted: None,
        }
    }

    /// An `OutOfMemory` for `bytes`, naming what bounds the memory.
    fn out_of_memory(&self, bytes: u64) -> MemError {
        let free = self.capacity - self.used;
        MemError::OutOfMemory { bytes, free, total: self.capacity, bound: self.memory_rule.clone() }
    }

    /// The time a move of `bytes` over the host link takes (module doc).
    fn link_time(&self, bytes: u64) -> Nanos {
        let rate = self.info.pcie_bandwidth.max(1.0);
        self.info.pcie_latency_ns.saturating_add((bytes as f64 / rate * 1e9).round() as Nanos)
    }

    /// Starts the eviction of the allocation at `addr`: its device memory
    /// is counted free now (a restore started next finds the room, as on a
    /// GPU whose mover runs moves in order), and the mover copies its bytes
    /// into a fresh host store (real bytes, so a round trip is checked
    /// bitwise). Returns the host link's time for it.
    fn start_evict(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        let len = self.memory.get(&addr).ok_or_else(|| MemError::Device(format!("{addr:#x} is not resident")))?.len;
        // Mapped here (cheap: nothing is touched) so that a failure is this call's error.
        let mut to =
            Chunked::zeros(len).ok_or_else(|| MemError::Device(format!("no host memory for a copy of {len} bytes")))?;
        let from = self.memory.remove(&addr).ok_or_else(|| MemError::Device(format!("{addr:#x} is not resident")))?;
        self.used -= len as u64;
        self.mover.give(0, move || {
            to.copy_in(from.bytes());
            // `from` is unmapped here, off the core's thread too.
            Some(Landed::Evicted(addr, to))
        });
        Ok(self.link_time(len as u64))
    }

    /// Starts the restore of the evicted buffer at `addr`, as
    /// [`SimBackend::start_evict`]: its device memory counted used now,
    /// its bytes copied back by the mover.
    fn start_restore(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        let len = self.evicted.get(&addr).ok_or_else(|| MemError::Device(format!("{addr:#x} is not evicted")))?.len;
        let bytes = len as u64;
        if bytes > self.capacity - self.used {
            return Err(self.out_of_memory(bytes));
        }
        let mut to =
            HostBlock::new(len).ok_or_else(|| MemError::Device(format!("no host memory for a copy of {len} bytes")))?;
        let from = self.evicted.remove(&addr).ok_or_else(|| MemError::Device(format!("{addr:#x} is not evicted")))?;
        self.used += bytes;
        self.mover.give(0, move || {
            from.copy_out(to.bytes_mut());
            Some(Landed::Restored(addr, to))
        });
        Ok(self.link_time(bytes))
    }

    /// Whether the mover holds the buffer at `addr`.
    fn under_way(&self, addr: DevAddr) -> bool {
        self.moves.iter().any(|m| m.carrying == Some(addr))
    }

    /// Puts the buffers whose bytes landed where they now live.
    fn take_landed(&mut self) {
        for (_, landed) in self.mover.take() {
            let addr = match landed {
                Some(Landed::Evicted(addr, store)) => {
                    self.evicted.insert(addr, store);
                    addr
                }
                Some(Landed::Restored(addr, block)) => {
                    self.memory.insert(addr, block);
                    addr
                }
                None => continue,
            };
            // At most one move of a buffer is under way (`land_moves` before another).
            if let Some(m) = self.moves.iter_mut().find(|m| m.carrying == Some(addr)) {
                m.carrying = None;
            }
        }
    }

    /// Waits for the mover's copies under way and takes them: before a
    /// buffer under way is freed or moved again, or the context goes.
    fn land_moves(&mut self) {
        self.mover.settle();
        self.take_landed();
    }

    /// Holds the mover until the returned sender is dropped: a test's
    /// window in which moves are under way however fast the host copies.
    /// At most 10 s: a core that waited for the mover fails its test's
    /// assertions then rather than hanging.
    #[cfg(test)]
    pub(crate) fn hold_mover(&mut self) -> std::sync::mpsc::Sender<()> {
        let (release, held) = std::sync::mpsc::channel::<()>();
        self.mover.give(0, move || {
            // Err once `release` is dropped, or after the 10 s.
            let _ = held.recv_timeout(Duration::from_secs(10));
            None
        });
        release
    }

    /// The allocation holding `[addr, addr + bytes)`, with the offset of `addr` in it.
    fn span_mut(&mut self, addr: DevAddr, bytes: u64) -> Result<(&mut HostBlock, usize), Failure> {
        let found = self.memory.range_mut(..=addr).next_back();
        match found {
            Some((&base, block)) if addr - base + bytes <= block.len as u64 => Ok((block, (addr - base) as usize)),
            _ => Err(fatal(format!("a copy names device memory {addr:#x}+{bytes} outside every allocation"))),
        }
    }

    /// The move of copy operation `op`'s bytes, now that the simulator says
    /// it is done: its source (none for a fill) and destination, checked.
    fn move_of(&mut self, op: OpId, copy: CopyId) -> Result<Move, Failure> {
        let Some(work) = self.bound.get(&op).cloned() else {
            return Err(fatal(format!("copy operation {op} finished but was never bound")));
        };
        let mv = |src: *const u8, dst: *mut u8, bytes: u64, fill, region| Move {
            copy,
            src,
            dst,
            bytes: bytes as usize,
            rows: Rows::ONE,
            fill,
            region,
        };
        Ok(match work {
            OpWork::ToDevice { dst, src, bytes } => {
                if !src.region.contains(src.offset, bytes) {
                    return Err(fatal(format!("copy {op} reads outside its shared region")));
                }
                let (block, at) = self.span_mut(dst, bytes)?;
                let to = block.bytes_mut()[at..].as_mut_ptr();
                // SAFETY: `contains` checked offset + bytes against the mapping.
                let from = unsafe { src.region.as_ptr().add(src.offset as usize) };
                mv(from, to, bytes, None, Some(src.region.clone()))
            }
            OpWork::ToHost { src, dst, bytes } => {
                if !dst.region.contains(dst.offset, bytes) {
                    return Err(fatal(format!("copy {op} writes outside its shared region")));
                }
                let (block, at) = self.span_mut(src, bytes)?;
                let from = block.bytes()[at..].as_ptr();
                // SAFETY: as above.
                let to = unsafe { dst.region.as_ptr().add(dst.offset as usize) };
                mv(from, to, bytes, None, Some(dst.region.clone()))
            }
            OpWork::DeviceCopy { src, dst, bytes } => {
                let from = {
                    let (block, at) = self.span_mut(src, bytes)?;
                    block.bytes()[at..].as_ptr()
                };
                let (block, at) = self.span_mut(dst, bytes)?;
                mv(from, block.bytes_mut()[at..].as_mut_ptr(), bytes, None, None)
            }
            OpWork::Memset { dst, value, bytes } => {
                let (block, at) = self.span_mut(dst, bytes)?;
                mv(std::ptr::null(), block.bytes_mut()[at..].as_mut_ptr(), bytes, Some(Fill::Byte(value)), None)
            }
            OpWork::Fill { dst, value, width, bytes } => {
                let (block, at) = self.span_mut(dst, bytes)?;
                let fill = Some(Fill::Word { value, width });
                mv(std::ptr::null(), block.bytes_mut()[at..].as_mut_ptr(), bytes, fill, None)
            }
            OpWork::Copy2D { src, dst, width, height } => {
                let from = self.pitched(op, &src, width, height)?;
                let to = self.pitched(op, &dst, width, height)?;
                let rows =
                    Rows { count: height as usize, src_pitch: src.pitch() as usize, dst_pitch: dst.pitch() as usize };
                Move { copy, src: from.0, dst: to.0, bytes: width as usize, rows, fill: None, region: from.1.or(to.1) }
            }
            OpWork::Kernel { .. } => return Err(fatal(format!("operation {op} is a kernel, not a copy"))),
        })
    }

    /// Where a pitched copy's side starts, its whole span checked (and the
    /// host region it lies in, kept mapped by the move).
    fn pitched(
        &mut self,
        op: OpId,
        side: &Side2D,
        width: u64,
        height: u64,
    ) -> Result<(*mut u8, Option<Arc<ShmRegion>>), Failure> {
        let extent = pitched_extent(side.pitch(), width, height).ok_or_else(|| {
            fatal(format!("copy {op}: {height} rows of {width} bytes, {} apart, are no range", side.pitch()))
        })?;
        match side {
            Side2D::Device { addr, .. } => {
                let (block, at) = self.span_mut(*addr, extent)?;
                Ok((block.bytes_mut()[at..].as_mut_ptr(), None))
            }
            Side2D::Host { span, .. } => {
                if !span.region.contains(span.offset, extent) {
                    return Err(fatal(format!("copy {op} names rows outside its host region")));
                }
                // SAFETY: `contains` checked offset + extent against the mapping.
                let at = unsafe { span.region.as_ptr().add(span.offset as usize) };
                Ok((at, Some(span.region.clone())))
            }
        }
    }
}

/// One launchable kernel of a module ([`launchable`]).
struct SimKernel {
    name: String,
    /// Its body calls `__trap()` directly.
    traps: bool,
    /// Every parameter's size, if all are of built-in types.
    param_sizes: Option<Vec<u32>>,
}

/// A module's launchable kernels and its log (notes on kernels whose
/// arguments go unchecked).
struct Launchable {
    kernels: Vec<SimKernel>,
    log: String,
}

/// A module's launchable kernels, as the transformation finds them: each
/// defined, non-template kernel's name, whether its body traps and its
/// parameter sizes where it can know them; or why the source would not
/// compile, where a lexer can see it (module doc).
fn launchable(source: &str) -> Result<Launchable, LoadError> {
    // The transformation first, as on a GPU (where NVRTC comes after it).
    let t = transform(source).map_err(transform_error)?;
    let errors = gpumux_cuda::source_check::syntax_errors(source);
    if !errors.is_empty() {
        let mut log = errors.join("\n");
        log.push_str(
            "\n(the simulated device compiles nothing: it checks what a lexer can see, a GPU's compiler the rest)",
        );
        return Err(LoadError::Compile { log });
    }
    let mut log = String::new();
    let mut kernels = Vec::new();
    for k in t.kernels.iter().filter(|k| k.defined && !k.template) {
        let sizes: Vec<Option<u32>> =
            k.param_types.iter().map(|ty| gpumux_cuda::source_check::param_size(ty)).collect();
        let param_sizes = sizes.iter().copied().collect::<Option<Vec<u32>>>();
        if let Some(i) = sizes.iter().position(Option::is_none) {
            let _ = writeln!(
                log,
                "note: `{}`'s parameter {} (`{} {}`) is of a type whose size the simulated device cannot know \
                 without a compiler, so `{}`'s arguments are not checked here (a GPU checks them)",
                k.name, i, k.param_types[i], k.params[i], k.name
            );
        }
        kernels.push(SimKernel { name: k.name.clone(), traps: body_traps(&t.source, &k.name), param_sizes });
    }
    Ok(Launchable { kernels, log })
}

impl SimBackend {
    /// From now on, scripted ends ahead as [`ENDS_AHEAD_VAR`] says (for
    /// tests that cannot set the variable for a whole process).
    pub fn script_ends_ahead(&mut self) {
        self.scripted.get_or_insert_with(ScriptedEnds::default);
    }

    /// The image of a module loaded before with the same source and options
    /// (another load holds it now too).
    fn cached(&mut self, key: &(String, Vec<String>)) -> Option<ModuleImage> {
        let (m, loads) = self.modules.get_mut(key)?;
        *loads += 1;
        Some(ModuleImage { cached: true, ..m.clone() })
    }

    /// Gives a module's kernels codes: its image, loaded once.
    fn register(&mut self, key: (String, Vec<String>), launchable: Launchable) -> ModuleImage {
        let mut kernels = Vec::new();
        for SimKernel { name, traps, param_sizes } in launchable.kernels {
            let code = KernelCode(self.next_code);
            self.next_code += 1;
            if traps {
                self.trapping.insert(code);
            }
            kernels.push(KernelImage {
                name,
                code,
                param_sizes,
                regs_per_thread: SIM_REGS_PER_THREAD,
                static_smem: 0,
                max_threads_per_block: 1024,
                // CUDA's default for a kernel that did not opt in to more
                // (what the CUDA device's kernels have: it opts in to nothing).
                max_dynamic_smem: SIM_MAX_DYNAMIC_SMEM,
            });
        }
        let image = ModuleImage { kernels, log: launchable.log, cached: false };
        self.modules.insert(key, (image.clone(), 1));
        image
    }
}

/// A simulated device's spec split into its preset and its device memory
/// (`sim:h100,memory=256MiB`); an unknown option or a bad size is refused
/// naming it.
pub fn sim_spec(spec: &str) -> Result<(&str, Option<u64>), UnknownPreset> {
    let mut parts = spec.split(',');
    let preset = parts.next().unwrap_or(spec);
    let mut memory = None;
    for opt in parts {
        let size = opt.strip_prefix("memory=").and_then(|v| crate::config::parse_bytes(v.trim()).ok());
        match size {
            Some(bytes) if bytes > 0 => memory = Some(bytes),
            _ => {
                return Err(UnknownPreset(format!(
                    "{spec} (`{opt}`: the one option of a simulated device is memory=SIZE, e.g. memory=256MiB)"
                )))
            }
        }
    }
    Ok((preset, memory))
}

/// The host's physical memory in bytes, if the system says.
fn host_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system constants.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGE_SIZE)) };
    let (pages, page) = (u64::try_from(pages).ok()?, u64::try_from(page).ok()?);
    pages.checked_mul(page).filter(|&b| b > 0)
}

/// `bytes` in GiB, one decimal.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The simulated device `name`'s memory, and the rule that gave it in words:
/// the preset's size (`preset` bytes), but at most the host's physical
/// memory (`host` bytes, if known) divided by `HOST_MEMORY_DIVISOR`,
/// rounded down to a MiB. Device memory is host RAM here (module doc): on a
/// 24 GiB host an H100 preset let clients allocate, and fill, 80 GiB.
pub fn memory_bound(name: &str, preset: u64, host: Option<u64>) -> (u64, String) {
    let share = host.map(|h| (h / HOST_MEMORY_DIVISOR) & !((1 << 20) - 1)).filter(|&b| b > 0);
    match share {
        Some(share) if share < preset => (
            share,
            format!(
                "the simulated device {name} has {}: its preset's {}, bounded to half of this host's {} of RAM \
                 (its memory is the host's)",
                gib(share),
                gib(preset),
                gib(host.unwrap_or(0))
            ),
        ),
        _ => (preset, format!("the simulated device {name} has {}, its preset's memory", gib(preset))),
    }
}

fn fatal(what: String) -> Failure {
    Failure::Fatal(DeviceError::backend("the simulated device", what))
}

fn transform_error(e: TransformError) -> LoadError {
    let line = match &e {
        TransformError::Unsupported { line, .. }
        | TransformError::Reserved { line, .. }
        | TransformError::Parse { line, .. } => *line,
    };
    LoadError::Transform { line: u32::try_from(line).unwrap_or(u32::MAX), message: e.to_string() }
}

/// Whether the body of kernel `name` in a transformed `source` calls
/// `__trap` directly (a helper function that traps is not seen: the
/// stand-in needs to be deterministic, not complete).
fn body_traps(source: &str, name: &str) -> bool {
    let body_fn = format!("{name}{BODY_SUFFIX}");
    let toks: Vec<_> = lex(source).into_iter().filter(|t| t.significant()).collect();
    let Some(start) = toks.iter().position(|t| t.kind == Kind::Ident && t.text(source) == body_fn) else {
        return false;
    };
    let mut depth = 0usize;
    let mut in_body = false;
    for t in &toks[start..] {
        match (t.kind, t.text(source)) {
            (Kind::Punct, "{") => {
                in_body = true;
                depth += 1;
            }
            (Kind::Punct, "}") if in_body => {
                depth -= 1;
                if depth == 0 {
                    return false;
                }
            }
            (Kind::Ident, "__trap") if in_body => return true,
            _ => {}
        }
    }
    false
}

impl Backend for SimBackend {
    fn describe(&self) -> String {
        self.info.name.clone()
    }

    fn runs_block_ranges(&self) -> bool {
        // Its kernels take time and compute nothing: a range is its count.
        true
    }

    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn compute_capability(&self) -> [u32; 2] {
        // The presets' GPUs: the K20c is Kepler (3.5), the H100 and H200 Hopper (9.0).
        match self.info.name.as_str() {
            "sim:k20c" => [3, 5],
            _ => [9, 0],
        }
    }

    fn mem_info(&mut self) -> Result<MemInfo, MemError> {
        Ok(MemInfo { free: self.capacity - self.used, total: self.capacity })
    }

    fn alloc(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        let free = self.capacity - self.used;
        let len = usize::try_from(bytes).map_err(|_| self.out_of_memory(bytes))?;
        if bytes == 0 || bytes > free {
            return Err(self.out_of_memory(bytes));
        }
        let block = HostBlock::new(len).ok_or_else(|| self.out_of_memory(bytes))?;
        let addr = self.next_addr;
        let span = bytes.div_ceil(ALIGN).saturating_add(1).saturating_mul(ALIGN);
        self.next_addr = self.next_addr.saturating_add(span);
        self.memory.insert(addr, block);
        self.used += bytes;
        Ok(addr)
    }

    fn free(&mut self, addr: DevAddr) -> Result<(), MemError> {
        if self.under_way(addr) {
            self.land_moves();
        }
        if self.evicted.remove(&addr).is_some() {
            return Ok(());
        }
        let block =
            self.memory.remove(&addr).ok_or_else(|| MemError::Device(format!("{addr:#x} is not an allocation")))?;
        self.used -= block.len as u64;
        Ok(())
    }

    fn swap_granularity(&self) -> Option<u64> {
        Some(SWAP_GRANULARITY)
    }

    fn reserve(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        let len = usize::try_from(bytes).map_err(|_| self.out_of_memory(bytes))?;
        if bytes == 0 || bytes > self.capacity {
            return Err(self.out_of_memory(bytes));
        }
        let block = Chunked::zeros(len).ok_or_else(|| self.out_of_memory(bytes))?;
        let addr = self.next_addr;
        let span = bytes.div_ceil(ALIGN).saturating_add(1).saturating_mul(ALIGN);
        self.next_addr = self.next_addr.saturating_add(span);
        self.evicted.insert(addr, block);
        Ok(addr)
    }

    // The calls that return with the copy done (a device process's
    // `SwapCall`s): a move started and waited for.
    fn evict(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        if self.under_way(addr) {
            self.land_moves();
        }
        let took = self.start_evict(addr)?;
        self.land_moves();
        Ok(took)
    }

    fn restore(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        if self.under_way(addr) {
            self.land_moves();
        }
        let took = self.start_restore(addr)?;
        self.land_moves();
        Ok(took)
    }

    fn start_move(&mut self, token: u64, what: BufferMove) -> Option<Result<Nanos, MemError>> {
        let addr = match what {
            BufferMove::Evict(addr) | BufferMove::Restore(addr) => addr,
        };
        // Moved again before its last move landed (the core waits for a
        // move's report, so rare): that move's bytes first.
        if self.under_way(addr) {
            self.land_moves();
        }
        let result = match what {
            BufferMove::Evict(addr) => self.start_evict(addr),
            BufferMove::Restore(addr) => self.start_restore(addr),
        };
        let now = self.now();
        let (end, carrying) = match result {
            Ok(took) => {
                self.link_free_at = self.link_free_at.max(now).saturating_add(took);
                (self.link_free_at, Some(addr))
            }
            Err(_) => (now, None),
        };
        self.moves.push(MoveUnderWay { token, end, result, carrying });
        None
    }

    fn take_moved(&mut self, out: &mut Vec<Moved>) {
        self.take_landed();
        let now = self.now();
        // Done when the link model says so and its bytes are there (a
        // loaded host's copy may take longer than the modelled link).
        self.moves.retain_mut(|m| {
            if m.end > now || m.carrying.is_some() {
                return true;
            }
            let result = std::mem::replace(&mut m.result, Ok(0));
            out.push(Moved { token: m.token, result });
            false
        });
    }

    fn settle_moves(&mut self, out: &mut Vec<Moved>) {
        self.land_moves();
        for m in &mut self.moves {
            m.end = 0;
        }
        self.take_moved(out);
    }

    fn evicted_survive_rebuild(&self) -> bool {
        true
    }

    fn readdress_evicted(&mut self, addr: DevAddr) -> Result<DevAddr, MemError> {
        // Addresses are never reused (`next_addr` only grows): it keeps its own.
        if self.evicted.contains_key(&addr) {
            Ok(addr)
        } else {
            Err(MemError::Device(format!("no evicted buffer at {addr:#x}")))
        }
    }

    fn read_span(&mut self, addr: DevAddr, offset: u64, bytes: u64) -> Option<Result<Vec<u8>, MemError>> {
        let Some(block) = self.memory.get(&addr) else {
            return Some(Err(MemError::Device(format!("{addr:#x} is not a resident allocation"))));
        };
        let all = block.bytes();
        let len = usize::try_from(bytes).unwrap_or(usize::MAX);
        Some(piece_range(offset, len, all.len()).map(|r| all[r].to_vec()))
    }

    fn write_span(&mut self, addr: DevAddr, offset: u64, data: &[u8]) -> Option<Result<(), MemError>> {
        let Some(block) = self.memory.get_mut(&addr) else {
            return Some(Err(MemError::Device(format!("{addr:#x} is not a resident allocation"))));
        };
        let all = block.bytes_mut();
        Some(piece_range(offset, data.len(), all.len()).map(|r| all[r].copy_from_slice(data)))
    }

    fn read_piece(&mut self, addr: DevAddr, offset: u64, into: &mut [u8]) -> Option<Result<(), MemError>> {
        let Some(block) = self.memory.get(&addr) else {
            return Some(Err(MemError::Device(format!("{addr:#x} is not a resident allocation"))));
        };
        Some(piece_range(offset, into.len(), block.bytes().len()).map(|r| into.copy_from_slice(&block.bytes()[r])))
    }

    fn write_piece(&mut self, addr: DevAddr, offset: u64, from: &[u8]) -> Option<Result<(), MemError>> {
        let Some(block) = self.memory.get_mut(&addr) else {
            return Some(Err(MemError::Device(format!("{addr:#x} is not a resident allocation"))));
        };
        let all = block.bytes_mut();
        Some(piece_range(offset, from.len(), all.len()).map(|r| all[r].copy_from_slice(from)))
    }

    fn read_to_region(
        &mut self,
        addr: DevAddr,
        offset: u64,
        region: &Arc<ShmRegion>,
        at: u64,
        len: u64,
    ) -> Option<Result<(), MemError>> {
        match super::pieces::region_span(region, at, len) {
            Ok(span) => self.read_piece(addr, offset, span),
            Err(e) => Some(Err(e)),
        }
    }

    fn write_from_region(
        &mut self,
        addr: DevAddr,
        offset: u64,
        region: &Arc<ShmRegion>,
        at: u64,
        len: u64,
    ) -> Option<Result<(), MemError>> {
        match super::pieces::region_bytes(region, at, len) {
            Ok(span) => self.write_piece(addr, offset, span),
            Err(e) => Some(Err(e)),
        }
    }

    fn register_host(&mut self, _region: &Arc<ShmRegion>) -> Result<(), MemError> {
        Ok(())
    }

    fn unregister_host(&mut self, _region: &ShmRegion) {}

    fn start_register(&mut self, token: u64, _region: &Arc<ShmRegion>) {
        // Nothing to pin: host memory is the device's.
        self.registered.push(Registered { token, result: Ok(()) });
    }

    fn take_registered(&mut self, out: &mut Vec<Registered>) {
        out.append(&mut self.registered);
    }

    fn load_module(&mut self, _name: &str, source: &str, options: &[String]) -> Result<ModuleImage, LoadError> {
        let key = (source.to_string(), options.to_vec());
        if let Some(image) = self.cached(&key) {
            return Ok(image);
        }
        let kernels = launchable(source)?;
        Ok(self.register(key, kernels))
    }

    fn start_load(&mut self, token: u64, _name: &str, source: &str, options: &[String]) {
        // The transformation runs on the pool's thread (a large module takes
        // ms: issue 36, "compiles run off the core"); kernels get their codes
        // when the core takes the load.
        let key = (source.to_string(), options.to_vec());
        self.transforms.give(token, move || {
            let kernels = launchable(&key.0);
            (key, kernels)
        });
    }

    fn take_loaded(&mut self, out: &mut Vec<Loaded>) {
        for (token, (key, kernels)) in self.transforms.take() {
            let result = match self.cached(&key) {
                Some(image) => Ok(image),
                None => kernels.map(|k| self.register(key, k)),
            };
            out.push(Loaded { token, result });
        }
    }

    fn unload_module(&mut self, kernels: &[KernelCode]) {
        let Some(first) = kernels.first() else { return };
        let key = self
            .modules
            .iter()
            .find(|(_, (m, _))| m.kernels.first().map(|k| k.code) == Some(*first))
            .map(|(k, _)| k.clone());
        let Some((_, loads)) = key.as_ref().and_then(|k| self.modules.get_mut(k)) else { return };
        *loads -= 1;
        if *loads > 0 {
            return;
        }
        if let Some((m, _)) = key.and_then(|k| self.modules.remove(&k)) {
            for k in m.kernels {
                self.trapping.remove(&k.code);
            }
        }
    }

    fn kernels_loaded(&self) -> usize {
        self.modules.values().map(|(m, _)| m.kernels.len()).sum()
    }

    fn bind(&mut self, op: OpId, work: OpWork) {
        if let (Some(s), OpWork::Kernel { after: Some(_), grid: [1, 1, 1], .. }) = (self.scripted.as_mut(), &work) {
            // Scripted as queued and run ahead: its launch is here (issue 35's stage stamps).
            gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchStart, op.0, 0);
            gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchReturn, op.0, 0);
            s.unseen.push(crate::backend::ends_ahead::EndAhead { op, blocks: 1 });
            s.reported.insert(op);
        }
        self.bound.insert(op, work);
    }

    fn unbind(&mut self, op: OpId) {
        if let Some(s) = self.scripted.as_mut() {
            s.reported.remove(&op);
            s.report.retain(|e| e.op != op);
            s.unseen.retain(|e| e.op != op);
        }
        self.bound.remove(&op);
    }

    fn report_ends_ahead(&mut self) {
        if std::env::var(ENDS_AHEAD_VAR).is_ok_and(|v| v.trim() == "1") {
            tracing::info!("simulated device: scripted ends ahead ({ENDS_AHEAD_VAR}=1)");
            self.script_ends_ahead();
        }
    }

    fn run_end_landed(&self) -> Option<bool> {
        // Scripted: an end neither a look nor a poll took yet counts as
        // landed, as a CUDA device's published ends would (so the held poll's
        // watch and the looks between messages are tested).
        let s = self.scripted.as_ref()?;
        (!s.reported.is_empty()).then_some(!s.unseen.is_empty())
    }

    fn take_ends_ahead(&mut self, out: &mut Vec<crate::backend::ends_ahead::EndAhead>) {
        if let Some(s) = self.scripted.as_mut() {
            // Those a look saw first: they were bound first (stream order).
            out.append(&mut s.report);
            out.append(&mut s.unseen);
        }
    }

    fn look_between(&mut self, _posts: usize) -> Result<super::Looked, Failure> {
        // Scripted: a look sees every end bound since; it queues nothing (the
        // simulator models no queue ahead).
        let Some(s) = self.scripted.as_mut() else { return Ok(super::Looked::default()) };
        let ended = s.unseen.len() as u64;
        s.report.append(&mut s.unseen);
        Ok(super::Looked { ended, queued: 0, more: false })
    }

    fn submit_answered(&mut self, command: Command) -> Result<(), Failure> {
        if let (Some(s), Command::Launch { op, .. }) = (self.scripted.as_mut(), &command) {
            if s.reported.remove(op) {
                // Scripted as run ahead: it ends at once, having run nothing here.
                crate::backend::ended_at_once_into(&command, &mut s.answers);
                return Ok(());
            }
        }
        self.submit(command)
    }

    fn retire_answered(&mut self, launch: LaunchId, op: OpId) -> Result<(), Failure> {
        let ran_ahead = self.scripted.as_mut().is_some_and(|s| s.reported.remove(&op));
        self.unbind(op);
        if ran_ahead {
            // Scripted as run ahead: nothing of it is left here, and no event.
            return Ok(());
        }
        // The daemon retires only a launch this device reported ended ahead.
        let what = format!("launch {launch} of {op} retired as ended ahead, which this device never reported");
        Err(Failure::Fatal(DeviceError::backend("the simulated device", what)))
    }

    fn now(&self) -> Nanos {
        Nanos::try_from(self.origin.elapsed().as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn now_at(&self, at: Instant) -> Nanos {
        Nanos::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn submit(&mut self, command: Command) -> Result<(), Failure> {
        // Unless it answers the events of the last poll, the first command
        // since that poll takes effect at its wall time, or just before an
        // event the core has not seen yet (module doc, "Time"); the rest of
        // the round joins it at that instant.
        if !self.unsettled && !self.reacting {
            self.sim_now = self.sim.catch_up(self.now());
        }
        match &command {
            Command::Launch { op, desc, .. } => {
                if let Some(s) = self.scripted.as_mut() {
                    // Launched the ordinary way (its report crossed the command): it runs here.
                    s.reported.remove(op);
                }
                if let Some(OpWork::Kernel { code, .. }) = self.bound.get(op) {
                    if self.trapping.contains(code) && self.fault.is_none() {
                        let block = desc.sim_timing.map_or(0, |t| t.block_time_ns);
                        self.fault =
                            Some(Fault { at: self.sim_now.saturating_add(block), op: *op, kernel: desc.name.clone() });
                    }
                }
            }
            Command::Copy { copy, op, .. } => {
                self.copies.insert(*copy, *op);
            }
            Command::Grow { .. } | Command::Retreat { .. } => {}
        }
        self.unsettled = true;
        // The simulated launch call, for issue 35's stage stamps (nothing when off).
        let launched = match &command {
            Command::Launch { op, .. } if gpumux_stamps::on() => Some(op.0),
            _ => None,
        };
        if let Some(op) = launched {
            gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchStart, op, 0);
        }
        let r = self.sim.submit(self.sim_now, command).map_err(Failure::Fatal);
        if let Some(op) = launched {
            gpumux_stamps::stamp(gpumux_stamps::Stage::LaunchReturn, op, 0);
        }
        r
    }

    fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
        let wall = self.now().max(self.sim_now);
        if let Some(f) = self.fault.as_ref().filter(|f| f.at <= wall) {
            return Err(Failure::ContextLost {
                suspects: vec![f.op],
                what: format!("kernel `{}` called __trap() (an illegal instruction on a GPU)", f.kernel),
            });
        }
        self.unsettled = false;
        let before = events.len();
        if let Some(s) = self.scripted.as_mut() {
            events.append(&mut s.answers);
        }
        let start = events.len();
        self.sim_now = self.sim.advance(Some(wall), events).map_err(Failure::Fatal)?;
        // Short of the clock with nothing to report: the event budget ran out.
        self.behind = self.sim_now < wall && events.len() == start;
        // A finished copy's bytes move now: a small one here, a large one on
        // the copy engine's thread, its end withheld until they are there.
        let mut i = start;
        while i < events.len() {
            let Event::CopyDone { copy } = events[i] else {
                i += 1;
                continue;
            };
            let op = self.copies.remove(&copy).ok_or_else(|| fatal(format!("unknown copy {copy} finished")))?;
            let m = self.move_of(op, copy)?;
            // Small moves here, unless the thread has moves in hand: a
            // stream's next copy may be queued behind the one before
            // (the engine's copy ahead), and its bytes must land after.
            if (m.total_bytes() as u64) < ON_THREAD_FROM && self.copy_engine.in_flight() == 0 {
                // SAFETY: `move_of` checked both spans; they stay mapped during the call.
                unsafe { m.run() };
                i += 1;
            } else {
                // SAFETY: the spans stay valid until the copy is reported done (copy_engine's doc).
                if unsafe { self.copy_engine.start(m) } {
                    events.remove(i);
                } else {
                    i += 1;
                }
            }
        }
        let mut moved = Vec::new();
        self.copy_engine.take_done(&mut moved);
        events.extend(moved.into_iter().map(|copy| Event::CopyDone { copy }));
        self.reacting = events.len() > before;
        Ok(self.sim_now)
    }

    fn take_failed(&mut self, _out: &mut Vec<OpFailed>) {
        // The simulator runs every binding: the daemon's checks before it
        // (`validate`) are the limits it imitates, and it has no driver.
    }

    fn next_wake(&self) -> Wake {
        if !self.registered.is_empty() || self.scripted.as_ref().is_some_and(|s| !s.answers.is_empty()) {
            return Wake::After(Duration::ZERO);
        }
        if self.transforms.pending() > 0 {
            // A transformation's end is looked for, not announced.
            return Wake::After(MOVE_LOOK);
        }
        if self.unsettled {
            return Wake::After(Duration::ZERO);
        }
        if self.behind {
            // Work to catch up on, in bounded polls, as a busy GPU is polled.
            return Wake::Spin;
        }
        // A buffer move's end is known: looked at then, and every
        // `MOVE_LOOK` after it until the mover's copy has landed.
        let look = self.now().saturating_add(MOVE_LOOK.as_nanos() as Nanos);
        let moved = self.moves.iter().map(|m| if m.carrying.is_some() { m.end.max(look) } else { m.end }).min();
        if self.copy_engine.in_flight() > 0 {
            // A move's end is looked for, not announced; a move takes ms
            // (a smaller one is done inline), so a look every
            // `MOVE_LOOK` costs a copy little and leaves the CPU to others.
            let moved = moved.map(|t| Duration::from_nanos(t.saturating_sub(self.now())));
            return Wake::After(moved.map_or(MOVE_LOOK, |m| m.min(MOVE_LOOK)));
        }
        let next = [self.sim.next_event_at(), self.fault.as_ref().map(|f| f.at), moved].into_iter().flatten().min();
        match next {
            None => Wake::Idle,
            Some(t) => Wake::After(Duration::from_nanos(t.saturating_sub(self.now()))),
        }
    }

    fn rebuild(&mut self) -> Result<(), MemError> {
        // Moves under way finish before their memory goes; their copies are lost with the rest.
        self.copy_engine.settle();
        self.sim = SimGpu::new(self.info.clone(), self.seed).with_event_budget(EVENTS_PER_POLL);
        self.origin = Instant::now();
        self.sim_now = 0;
        // Buffer moves' bytes land first (a restored buffer's device
        // memory goes with the rest below): reported at the next look.
        self.land_moves();
        for m in &mut self.moves {
            m.end = 0;
        }
        self.link_free_at = 0;
        self.unsettled = false;
        self.reacting = false;
        self.behind = false;
        self.used = 0;
        // Evicted bytes are in host memory: they outlive the context.
        self.memory.clear();
        self.bound.clear();
        self.copies.clear();
        self.modules.clear();
        if let Some(s) = self.scripted.as_mut() {
            *s = ScriptedEnds::default();
        }
        self.fault = None;
        Ok(())
    }
}

/// The range of a piece of `len` bytes at `offset` in an allocation of `size`.
fn piece_range(offset: u64, len: usize, size: usize) -> Result<std::ops::Range<usize>, MemError> {
    usize::try_from(offset)
        .ok()
        .and_then(|o| Some(o..o.checked_add(len)?))
        .filter(|r| r.end <= size)
        .ok_or_else(|| MemError::Device(format!("{len} bytes at offset {offset} of an allocation of {size}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_engine::ids::{LaunchId, ProcessId};
    use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
    use gpumux_engine::ranges::BlockRanges;
    use gpumux_engine::smset::SmSet;
    use gpumux_engine::SmId;

    const TRAP_SRC: &str =
        "__global__ void ok(float* x) { x[0] = 1; }\n__global__ void bad(int* p) { if (p) __trap(); }\n";

    /// The device time of an instant just read is the time `now` would have
    /// read then: between the reads just before and just after it, and the
    /// same for the same instant (the core stamps a launch from the clock
    /// read that timed its send, `Backend::now_at`).
    #[test]
    fn device_time_at_an_instant_is_the_time_read_then() {
        let b = SimBackend::with_info(gpumux_sim::presets::h100());
        std::thread::sleep(Duration::from_millis(1));
        let before = b.now();
        let at = Instant::now();
        let after = b.now();
        let t = b.now_at(at);
        assert!(before <= t && t <= after, "{before} <= {t} <= {after}");
        assert!(t > 0, "a millisecond after the backend opened");
        assert_eq!(b.now_at(at), t, "the same instant, the same time");
    }

    fn poll_until(b: &mut SimBackend, mut done: impl FnMut(&[Event]) -> bool) -> Result<Vec<Event>, Failure> {
        let mut all = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            b.poll(&mut all)?;
            if done(&all) {
                return Ok(all);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        panic!("nothing happened in 5 s: {all:?}");
    }

    fn launch(op: u64, kernel: &str, block_ns: u64) -> Command {
        let desc = KernelDesc::new(kernel, KernelShape::new(4, 128, 32)).with_sim_timing(SimTiming::new(block_ns));
        Command::Launch {
            launch: LaunchId(op),
            kernel: gpumux_engine::KernelId(op),
            op: OpId(op),
            process: ProcessId(0),
            priority: 0,
            desc: Arc::new(desc),
            time_key: op,
            blocks: BlockRanges::full(4),
            restore: Vec::new(),
            sms: SmSet::single(SmId(op as u16)),
        }
    }

    /// `op` as launch `op` of `blocks` blocks of `block_ns` each, on SM `sm` alone.
    fn launch_on(op: u64, sm: u16, blocks: u64, block_ns: u64) -> Command {
        let desc = KernelDesc::new("k", KernelShape::new(blocks, 128, 32)).with_sim_timing(SimTiming::new(block_ns));
        match launch(op, "k", block_ns) {
            Command::Launch { launch, kernel, op, process, priority, time_key, restore, .. } => Command::Launch {
                launch,
                kernel,
                op,
                process,
                priority,
                desc: Arc::new(desc),
                time_key,
                blocks: BlockRanges::full(blocks),
                restore,
                sms: SmSet::single(SmId(sm)),
            },
            other => other,
        }
    }

    /// Polls until launch `op` ends: the device time the poll that reported it returned.
    fn ended_at(b: &mut SimBackend, op: u64) -> Nanos {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut events = Vec::new();
        while Instant::now() < deadline {
            events.clear();
            let at = b.poll(&mut events).expect("a poll");
            if events.iter().any(|e| matches!(e, Event::LaunchEnded { launch, .. } if launch.0 == op)) {
                return at;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        panic!("launch {op} did not end in 5 s");
    }

    /// The clock does not stand still while nobody polls an idle device: a
    /// kernel submitted 30 ms after the last poll takes its whole 20 ms (it
    /// used to start at the last poll's time, and end at the first poll after
    /// its submission, 10 ms early).
    #[test]
    fn a_kernel_submitted_after_an_idle_stretch_takes_its_whole_time() {
        let mut b = SimBackend::open("h100").unwrap();
        b.poll(&mut Vec::new()).unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let (submitted, wall) = (b.now(), Instant::now());
        b.submit(launch_on(1, 0, 4, 20_000_000)).unwrap();
        let end = ended_at(&mut b, 1);
        assert!(end >= submitted + 20_000_000, "submitted at {submitted} ns, ended at {end} ns: under 20 ms");
        assert!(wall.elapsed() >= Duration::from_millis(20), "reported after {:?} of wall time", wall.elapsed());
    }

    /// One rule alone and beside a busy neighbour: the core's answer to an
    /// end it polled (the next kernel, even 3 ms of the core's time later)
    /// starts at that end, back to back; a launch after a poll that reported
    /// nothing (a client's, 3 ms later) starts at its wall time. A fix that
    /// caught up only an idle device charged the core's reaction alone and
    /// not shared, and the replay test saw a client faster shared than alone.
    #[test]
    fn answers_to_events_run_back_to_back_and_later_launches_at_their_time_beside_a_neighbour_or_none() {
        for neighbour in [false, true] {
            let mut b = SimBackend::open("h100").unwrap();
            if neighbour {
                b.submit(launch_on(9, 9, 1, 2_000_000_000)).unwrap();
            }
            b.submit(launch_on(1, 0, 1, 5_000_000)).unwrap();
            let first = ended_at(&mut b, 1);
            std::thread::sleep(Duration::from_millis(3));
            b.submit(launch_on(2, 0, 1, 5_000_000)).unwrap();
            let second = ended_at(&mut b, 2);
            assert_eq!(second, first + 5_000_000, "neighbour {neighbour}: the answer ran back to back");
            let mut events = Vec::new();
            let polled = b.poll(&mut events).unwrap();
            assert!(events.is_empty(), "{events:?}");
            std::thread::sleep(Duration::from_millis(3));
            b.submit(launch_on(3, 0, 1, 5_000_000)).unwrap();
            let third = ended_at(&mut b, 3);
            let gap = third.saturating_sub(polled + 5_000_000);
            assert!(
                gap >= 3_000_000,
                "neighbour {neighbour}: a launch 3 ms after the last poll started {gap} ns after it"
            );
        }
    }

    /// A command between polls never takes effect after an event the core
    /// has not seen: here a retreat 20 ms after the last poll of a launch
    /// whose first wave ended unseen 2 ms after its start is taken (the launch has not
    /// ended for the simulator), and the launch's end is reported after it.
    #[test]
    fn a_command_never_crosses_an_event_the_core_has_not_seen() {
        use gpumux_engine::device::Mechanism;
        let mut b = SimBackend::open("h100").unwrap();
        b.submit(launch_on(1, 0, 64, 2_000_000)).unwrap();
        let started = b.sim_now;
        b.poll(&mut Vec::new()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let retreat =
            Command::Retreat { launch: LaunchId(1), sms: SmSet::single(SmId(0)), mechanism: Mechanism::Drain };
        b.submit(retreat).expect("the launch is still running for the device");
        let first_wave = started + 2_000_000;
        assert!(b.sim_now < first_wave, "stopped at {} ns, the first wave ended at {first_wave} ns", b.sim_now);
        assert!(b.sim_now > started, "and followed the clock up to it");
        let mut events = Vec::new();
        poll_until(&mut b, |e| {
            events = e.to_vec();
            e.iter().any(|e| matches!(e, Event::LaunchEnded { .. }))
        })
        .unwrap();
        assert!(events.iter().any(|e| matches!(e, Event::SmReleased { .. })), "{events:?}");
    }

    #[test]
    fn presets_come_from_the_simulator_and_unknown_names_list_them() {
        assert_eq!(SimBackend::open("sim:h100").map(|b| b.info.num_sms).ok(), Some(132));
        let k20c = presets::by_name("k20c").unwrap();
        assert_eq!(SimBackend::with_host_memory(k20c, Some(64 << 30)).capacity, 5 << 30);
        let e = SimBackend::open("sim:h900").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("sim:h900") && e.contains("sim:h200"), "{e}");
    }

    /// Issue 36, case 9: on 717b546 a 24 GiB host let clients allocate (and
    /// fill) 80 GiB of an H100 preset's "device" memory, which is host RAM.
    #[test]
    fn memory_is_the_presets_but_at_most_half_of_the_hosts() {
        let h100 = presets::by_name("h100").unwrap();
        let mut b = SimBackend::with_host_memory(h100.clone(), Some(24 << 30));
        assert_eq!((b.capacity, b.info.mem_bytes), (12 << 30, 12 << 30), "what clients see is the bound");
        let e = b.alloc(13 << 30).unwrap_err().to_string();
        assert!(e.contains("12.0 GiB: its preset's 80.0 GiB, bounded to half of this host's 24.0 GiB of RAM"), "{e}");
        b.alloc(11 << 30).unwrap();
        assert_eq!(SimBackend::with_host_memory(h100.clone(), Some(1 << 40)).capacity, 80 << 30);
        assert_eq!(SimBackend::with_host_memory(h100, None).capacity, 80 << 30, "an unknown host: the preset");
        let real = SimBackend::open("h100").unwrap();
        let host = host_memory().unwrap();
        assert!(real.capacity <= host / 2 && real.capacity <= 80 << 30, "{} on a host of {host}", real.capacity);
    }

    #[test]
    fn memory_is_counted_aligned_and_refused_past_capacity() {
        let mut b = SimBackend::with_host_memory(presets::by_name("k20c").unwrap(), Some(64 << 30));
        let a = b.alloc(1000).unwrap();
        let c = b.alloc(1).unwrap();
        assert_eq!((a % ALIGN, c % ALIGN), (0, 0));
        assert!(c >= a + 1000);
        assert_eq!(b.mem_info().unwrap().free, (5 << 30) - 1001);
        assert!(matches!(b.alloc(5 << 30), Err(MemError::OutOfMemory { .. })));
        b.free(a).unwrap();
        assert!(b.free(a).is_err(), "a double free is an error, not a panic");
        assert_eq!(b.mem_info().unwrap().free, (5 << 30) - 1);
    }

    #[test]
    fn memset_and_device_copy_move_bytes_when_the_simulator_says_done() {
        use gpumux_engine::device::CopyDirection;
        let mut b = SimBackend::open("h100").unwrap();
        let (x, y) = (b.alloc(4096).unwrap(), b.alloc(4096).unwrap());
        b.bind(OpId(1), OpWork::Memset { dst: x + 16, value: 0xab, bytes: 100 });
        b.bind(OpId(2), OpWork::DeviceCopy { src: x, dst: y, bytes: 4096 });
        let copy = |c, op| Command::Copy {
            copy: CopyId(c),
            op: OpId(op),
            process: ProcessId(0),
            direction: CopyDirection::DeviceToDevice,
            bytes: 4096,
        };
        b.submit(copy(1, 1)).unwrap();
        poll_until(&mut b, |e| !e.is_empty()).unwrap();
        b.submit(copy(2, 2)).unwrap();
        poll_until(&mut b, |e| !e.is_empty()).unwrap();
        let (block, at) = b.span_mut(y, 4096).unwrap();
        let data = &block.bytes()[at..at + 4096];
        assert!(data[..16].iter().all(|&v| v == 0));
        assert!(data[16..116].iter().all(|&v| v == 0xab));
        assert!(data[116..].iter().all(|&v| v == 0));
    }

    #[test]
    fn refused_kernels_name_the_line_and_modules_are_cached() {
        let mut b = SimBackend::open("h100").unwrap();
        let e = b.load_module("g.cu", "__global__ void k() {\n  cooperative_groups::this_grid().sync();\n}\n", &[]);
        assert!(matches!(e, Err(LoadError::Transform { line: 2, .. })), "{e:?}");
        let m = b.load_module("t.cu", TRAP_SRC, &[]).unwrap();
        assert_eq!(m.kernels.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(), ["ok", "bad"]);
        assert!(!m.cached);
        assert!(b.load_module("t.cu", TRAP_SRC, &[]).unwrap().cached);
        assert!(!b.load_module("t.cu", TRAP_SRC, &["-DX".into()]).unwrap().cached);
        // Two loads of one image, one of another: each unload undoes one load.
        let codes: Vec<KernelCode> = m.kernels.iter().map(|k| k.code).collect();
        assert_eq!(b.kernels_loaded(), 4);
        b.unload_module(&codes);
        assert_eq!(b.kernels_loaded(), 4, "the other load still holds it");
        assert!(b.trapping.contains(&codes[1]));
        b.unload_module(&codes);
        assert_eq!(b.kernels_loaded(), 2);
        assert!(!b.trapping.contains(&codes[1]), "its kernels are forgotten");
        let again = b.load_module("t.cu", TRAP_SRC, &[]).unwrap();
        assert!(!again.cached, "compiled again after its last unload");
        assert!(again.kernels.iter().all(|k| !codes.contains(&k.code)), "codes are not reused");
    }

    #[test]
    fn a_trapping_kernel_loses_the_context_at_its_first_block_end() {
        let mut b = SimBackend::open("h100").unwrap();
        let m = b.load_module("t.cu", TRAP_SRC, &[]).unwrap();
        let work = |code| OpWork::Kernel {
            code,
            grid: [4, 1, 1],
            block: [128, 1, 1],
            shared_bytes: 0,
            params: vec![],
            after: None,
            range: None,
        };
        b.bind(OpId(1), work(m.kernels[0].code));
        b.bind(OpId(2), work(m.kernels[1].code));
        b.submit(launch(1, "ok", 1_000)).unwrap();
        poll_until(&mut b, |e| e.iter().any(|e| matches!(e, Event::LaunchEnded { .. }))).unwrap();
        b.submit(launch(2, "bad", 1_000)).unwrap();
        match poll_until(&mut b, |_| false) {
            Err(Failure::ContextLost { suspects, what }) => {
                assert_eq!(suspects, vec![OpId(2)]);
                assert!(what.contains("bad") && what.contains("__trap"), "{what}");
            }
            other => panic!("expected a lost context, got {other:?}"),
        }
        b.rebuild().unwrap();
        assert_eq!(b.mem_info().unwrap().free, b.capacity);
        assert!(!b.load_module("t.cu", TRAP_SRC, &[]).unwrap().cached, "a new context has no modules");
    }

    #[test]
    fn the_trap_finder_reads_only_the_kernel_body() {
        let t = transform(
            "__device__ void h() { __trap(); }\n__global__ void a() { h(); }\n__global__ void b() { { __trap(); } }\n",
        )
        .unwrap();
        assert!(!body_traps(&t.source, "a"));
        assert!(body_traps(&t.source, "b"));
    }

    /// An evicted allocation is kept in chunks of [`SWAP_CHUNK`] and a tail
    /// (the CUDA device's rule), and its bytes come back bitwise across the
    /// chunks' boundaries; a buffer born evicted is zeros in chunks too.
    #[test]
    fn an_evicted_allocation_is_kept_in_chunks_and_comes_back_bitwise_across_their_boundaries() {
        let mut d = SimBackend::open("sim:h100,memory=64MiB").expect("the preset");
        let len = 3 * SWAP_CHUNK + SWAP_CHUNK / 4 + 4096;
        let a = d.alloc(len as u64).expect("alloc");
        let data: Vec<u8> = (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        d.memory.get_mut(&a).expect("resident").bytes_mut().copy_from_slice(&data);
        d.evict(a).expect("evict");
        let sizes: Vec<usize> = d.evicted[&a].pieces.iter().map(|p| p.len).collect();
        assert_eq!(sizes, vec![SWAP_CHUNK, SWAP_CHUNK, SWAP_CHUNK, SWAP_CHUNK / 4 + 4096], "3 chunks and a tail");
        for (i, p) in d.evicted[&a].pieces.iter().enumerate() {
            let at = i * SWAP_CHUNK;
            assert!(p.bytes() == &data[at..at + p.len], "piece {i} holds bytes {at}.. of the allocation");
        }
        d.memory.clear(); // nothing of the device's bytes can leak into the restore
        d.used = 0;
        d.restore(a).expect("restore");
        assert!(d.memory[&a].bytes() == &data[..], "back bitwise");
        assert!(d.evicted.is_empty());
        // Past half a chunk, the tail is a whole chunk.
        let z = d.reserve((2 * SWAP_CHUNK + 3 * SWAP_CHUNK / 4) as u64).expect("born evicted");
        assert_eq!(d.evicted[&z].pieces.len(), 3);
        d.restore(z).expect("restore zeros");
        assert!(d.memory[&z].bytes().iter().all(|&b| b == 0), "zeros");
    }

    /// Issue 39: a move's bytes are copied off the core's thread. While the
    /// mover holds a 64 MiB buffer's eviction, the core's calls return and
    /// another client's launches run and end; the move is not reported
    /// before its bytes are there, even past the link model's end; then
    /// its round trip comes back bitwise. (Copied in `start_move`, the
    /// bytes were in the host store when it returned.)
    #[test]
    fn moves_copy_on_the_mover_while_other_launches_run_and_end() {
        let mut d = SimBackend::open("sim:h100,memory=256MiB").expect("the preset");
        let len = 64 << 20;
        let a = d.alloc(len as u64).expect("alloc");
        let data: Vec<u8> = (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        d.memory.get_mut(&a).expect("resident").bytes_mut().copy_from_slice(&data);
        let release = d.hold_mover();
        assert!(d.start_move(7, BufferMove::Evict(a)).is_none(), "reported later");
        assert!(d.under_way(a) && !d.evicted.contains_key(&a), "the bytes are the mover's, not copied yet");
        assert_eq!(d.mem_info().expect("mem info").free, 256 << 20, "its device memory counts free at once");
        // Another client's kernels, one after another, served meanwhile.
        for op in 1..=3 {
            d.submit(launch_on(op, op as u16, 4, 200_000)).expect("launch");
            ended_at(&mut d, op);
        }
        let end = d.moves[0].end;
        while d.now() <= end {
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut moved = Vec::new();
        d.take_moved(&mut moved);
        assert!(moved.is_empty(), "past the link model's end, not reported before its bytes: {moved:?}");
        assert!(d.under_way(a), "still held");
        drop(release);
        d.settle_moves(&mut moved);
        assert_eq!(moved.len(), 1);
        assert_eq!(moved[0].token, 7);
        assert!(moved[0].result.is_ok(), "{:?}", moved[0].result);
        assert!(!d.under_way(a) && d.evicted.contains_key(&a) && !d.memory.contains_key(&a));
        // Back, reported at the link's end once landed.
        assert!(d.start_move(8, BufferMove::Restore(a)).is_none());
        let deadline = Instant::now() + Duration::from_secs(5);
        moved.clear();
        while moved.is_empty() {
            assert!(Instant::now() < deadline, "the restore was never reported");
            std::thread::sleep(Duration::from_micros(200));
            d.take_moved(&mut moved);
        }
        assert_eq!(moved[0].token, 8);
        assert!(d.memory[&a].bytes() == &data[..], "back bitwise");
        // Freed while under way: waits for its move.
        assert!(d.start_move(9, BufferMove::Evict(a)).is_none());
        d.free(a).expect("free");
        assert!(d.memory.is_empty() && d.evicted.is_empty());
        assert_eq!(d.mem_info().expect("mem info").free, 256 << 20);
    }

    /// The scripted device's side of a `Retire` (`remote`, "Retired"): a
    /// kernel it reported ended ahead is retired with no event and its
    /// operation forgotten; one it never reported (bound to no kernel before
    /// it, so never run ahead), or retired twice, is refused as fatal, the
    /// launch and operation named.
    #[test]
    fn a_retire_of_a_kernel_reported_ended_ahead_leaves_nothing_and_any_other_is_refused() {
        let mut d = SimBackend::with_info(gpumux_sim::presets::h100());
        d.script_ends_ahead();
        let image = d.load_module("m.cu", "__global__ void j() {}\n", &[]).expect("the module loads");
        let code = image.kernels[0].code;
        let one_block = |after| OpWork::Kernel {
            code,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            shared_bytes: 0,
            params: Vec::new(),
            after,
            range: None,
        };
        d.bind(OpId(1), one_block(None));
        d.bind(OpId(2), one_block(Some(OpId(1))));
        let mut ends = Vec::new();
        d.take_ends_ahead(&mut ends);
        assert_eq!(ends.iter().map(|e| e.op).collect::<Vec<_>>(), [OpId(2)], "op 2 ran ahead");
        d.retire_answered(LaunchId(20), OpId(2)).expect("a kernel reported ended ahead is retired");
        assert!(!d.bound.contains_key(&OpId(2)), "its operation is forgotten, as at an unbind");
        let mut events = Vec::new();
        d.poll(&mut events).expect("polled");
        assert!(events.is_empty(), "no event for a retired kernel: {events:?}");
        let refused = |r: Result<(), Failure>| match r {
            // As the device process words it for the daemon (`failure_message`).
            Err(Failure::Fatal(e)) => format!("{:#}", anyhow::Error::new(e)),
            other => panic!("not refused as fatal: {other:?}"),
        };
        let twice = refused(d.retire_answered(LaunchId(21), OpId(2)));
        assert!(twice.contains("launch 21") && twice.contains("never reported"), "{twice}");
        let never = refused(d.retire_answered(LaunchId(10), OpId(1)));
        assert!(never.contains("launch 10") && never.contains("never reported"), "{never}");
        assert!(!d.bound.contains_key(&OpId(1)), "refused, and unbound all the same (the daemon stops)");
    }
}

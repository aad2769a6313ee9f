//! The wire protocol between gpumuxd and its clients (docs/daemon.md, "The protocol").
//!
//! No I/O here: message types, the frame codec and the limits both sides
//! check. The daemon (`gpumuxd`) and the client library (`gpumux-client`)
//! share this crate, so the two cannot disagree on a byte.
//!
//! **Frames.** Over a Unix stream socket each message is one frame: a 4-byte
//! little-endian length `n` (1 ≤ n ≤ [`MAX_FRAME_BYTES`]) followed by `n`
//! bytes of the message, encoded with postcard (a compact, documented serde
//! format). The length is checked before anything is read into memory, and
//! decoding checks every tag, length and UTF-8 string; the receiver then
//! checks every field's meaning (handles, sizes, ranges) before use.
//!
//! **Conversation.** The client speaks first with [`Request::Hello`] (magic,
//! version, name, priority, weight); the daemon answers [`Reply::Welcome`]
//! or an error and closes. After that the client sends requests, each with an
//! id of its choice; the daemon answers each with one [`ServerFrame::Reply`]
//! carrying the same id, not necessarily in order (a `SyncStream` is answered
//! when the stream is done, a `Status` at once). The daemon may also send a
//! [`ServerFrame::Notice`] at any time (the context was lost, the daemon is
//! shutting down). A client that breaks a rule gets an error frame with
//! [`ErrorKind::BadFrame`] or [`ErrorKind::Protocol`] and is disconnected.
//!
//! **Bulk data** never goes through the socket: the client creates a sealed
//! memfd and passes it with `SCM_RIGHTS` alongside [`Request::AttachShm`];
//! copies name offsets in it. Besides that staging region, a client may
//! attach host regions of its own ([`Request::AttachHost`], pinned by the
//! daemon like `cudaHostAlloc` memory) and copy between them and device
//! memory directly ([`Request::CopyFromHostRegion`],
//! [`Request::CopyToHostRegion`]): no staging copy on either side.

#![warn(missing_docs)]

use serde::{Deserialize, Serialize};

mod codec;
pub use codec::{decode_frame_body, encode_frame, encode_frame_into, FrameError, FrameReader};

/// The first bytes of every `Hello`.
pub const MAGIC: [u8; 4] = *b"GMUX";
/// The protocol version this crate speaks. A daemon answers a client of
/// another version with [`ErrorKind::Version`] naming both. Version 2
/// added `UseRings`; version 3 answers a `Launch` only when it is refused;
/// version 4 added host regions (`AttachHost`, `DetachHost`,
/// `CopyFromHostRegion`, `CopyToHostRegion`, the `host_memory` limit and the
/// pinned host memory of `Status`); version 5 added what CUDA programs use
/// beyond one stream (issue 40: `StreamWaitEvent`, `EventElapsed`,
/// `DeviceProperties`, `Occupancy`, `HostFunc`, `EndHostFunc`, `Fill`, the
/// `NotReady` error); version 6 added evicted memory to `Status` (issue 39:
/// `memory_evicted`, `swap_memory`); version 7 serves several GPUs (issue
/// 38: `Hello::gpu` pins a client to one, `Welcome::gpu` says which it got,
/// `Status::gpus` and `ClientStatus::gpu`). A daemon answers an older
/// client's `Hello`, which no longer decodes, with the same `Version` error
/// ([`hello_version`]). Version 8 added copies that do not wait
/// (`CopyFromHostRegionAsync`, `CopyToHostRegionAsync`: answered only when
/// refused, as `cudaMemcpyAsync` from pinned memory) and pitched copies in
/// one request (`Copy2D`, `cudaMemcpy2DAsync`). Version 9 added
/// `Hello::class` (issue 38: what bounds a client's kernels, so that
/// placement puts memory-bound clients beside compute-bound ones). Version 10
/// splits a launch over several GPUs (issue 38: `SplitKernel` per kernel,
/// `LaunchSplit` per launch, with [`Split`]). Version 11 answers a staging
/// copy's chunk (`CopyToDevice`, `CopyToHost`) with [`Reply::Copied`], which
/// says how many other clients are busy, so that the client's copier takes
/// fewer threads beside them (issue 35).
pub const VERSION: u16 = 11;
/// The largest frame body either side accepts (module sources are the big ones).
pub const MAX_FRAME_BYTES: u32 = 8 << 20;
/// The longest client or kernel name.
pub const MAX_NAME_BYTES: usize = 256;
/// The largest module source.
pub const MAX_SOURCE_BYTES: usize = 4 << 20;
/// At most this many compile options, each at most [`MAX_NAME_BYTES`].
pub const MAX_OPTIONS: usize = 64;
/// At most this many kernel arguments.
pub const MAX_ARGS: usize = 256;
/// The most bytes of kernel parameters (CUDA's limit on Hopper is 32764).
pub const MAX_PARAM_BYTES: usize = 32764;
/// The most host regions ([`Request::AttachHost`]) a client may have
/// attached at once, whatever their bytes (each is a mapping and a pinned
/// range in the daemon).
pub const MAX_HOST_REGIONS: usize = 1024;

/// A client's device buffer, valid only on the connection that allocated it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BufferId(pub u64);
/// A loaded module, per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModuleId(pub u64);
/// A kernel of a loaded module, per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelId(pub u64);
/// A stream of a client; stream 0 exists from the handshake on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct StreamId(pub u32);
/// An event recorded on a stream, per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EventId(pub u64);
/// A host region of a client ([`Request::AttachHost`]), per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostRegionId(pub u64);

impl StreamId {
    /// The stream every client has.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// What a client sends: a request and the id its reply will carry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientFrame {
    /// Chosen by the client; echoed in the reply. Id 0 is reserved for notices.
    pub id: u64,
    /// What is asked.
    pub request: Request,
}

/// The protocol version a client frame's `Hello` states, read from the
/// frame's first bytes alone: `Some` when `body` begins as a [`ClientFrame`]
/// whose request is `Hello` with the [`MAGIC`], even if the rest does not
/// decode as this version's `Hello` (an older client's `Hello` has fewer
/// fields). The daemon answers such a client with `ErrorKind::Version`
/// naming both versions rather than a decode error.
pub fn hello_version(body: &[u8]) -> Option<u16> {
    /// `ClientFrame { id, request: Request::Hello { magic, version, .. } }`'s
    /// first fields as postcard writes them: the id, the variant's index
    /// (0: `Hello` is the first), then the magic and the version.
    #[derive(Deserialize)]
    struct HelloHead {
        _id: u64,
        variant: u32,
        magic: [u8; 4],
        version: u16,
    }
    let (head, _) = postcard::take_from_bytes::<HelloHead>(body).ok()?;
    (head.variant == 0 && head.magic == MAGIC).then_some(head.version)
}

/// What the daemon sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ServerFrame {
    /// The answer to the request with id `id`.
    Reply {
        /// The request's id.
        id: u64,
        /// What came of it.
        result: Result<Reply, ErrorReply>,
    },
    /// Something the client did not ask about.
    Notice(Notice),
}

/// A place in a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferSlice {
    /// The buffer.
    pub buffer: BufferId,
    /// Byte offset from its start.
    pub offset: u64,
}

/// A place in a host region ([`Request::AttachHost`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostSlice {
    /// The region.
    pub region: HostRegionId,
    /// Byte offset from its start.
    pub offset: u64,
}

/// A kernel argument, as the kernel's parameter expects it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Arg {
    /// A device pointer: the buffer's address plus `offset` (checked to lie in it).
    Buffer(BufferSlice),
    /// `int` / `int32_t`.
    I32(i32),
    /// `unsigned` / `uint32_t`.
    U32(u32),
    /// `long long` / `int64_t`.
    I64(i64),
    /// `unsigned long long` / `size_t` / `uint64_t`.
    U64(u64),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
    /// Anything else (a struct by value), laid out as the kernel expects.
    Bytes(Vec<u8>),
}

impl Arg {
    /// Bytes the argument takes in the kernel's parameter block.
    pub fn size(&self) -> usize {
        match self {
            Arg::Buffer(_) | Arg::I64(_) | Arg::U64(_) | Arg::F64(_) => 8,
            Arg::I32(_) | Arg::U32(_) | Arg::F32(_) => 4,
            Arg::Bytes(b) => b.len(),
        }
    }
}

/// What bounds a client's kernels, as it declares it (`Hello::class`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClientClass {
    /// Its kernels stream memory: they leave the SMs' arithmetic idle.
    Memory,
    /// Its kernels are arithmetic-bound: they leave memory bandwidth idle.
    Compute,
}

impl ClientClass {
    /// Its name in `GPUMUX_CLASS`, logs and `--class`.
    pub fn name(self) -> &'static str {
        match self {
            ClientClass::Memory => "memory",
            ClientClass::Compute => "compute",
        }
    }

    /// The other class: the one it pairs with.
    pub fn other(self) -> ClientClass {
        match self {
            ClientClass::Memory => ClientClass::Compute,
            ClientClass::Compute => ClientClass::Memory,
        }
    }
}

impl std::str::FromStr for ClientClass {
    type Err = String;

    fn from_str(s: &str) -> Result<ClientClass, String> {
        match s {
            "memory" => Ok(ClientClass::Memory),
            "compute" => Ok(ClientClass::Compute),
            other => Err(format!("unknown class `{other}`; known: memory, compute")),
        }
    }
}

/// Everything a client can ask.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// The first request of a connection, and only the first.
    Hello {
        /// Must be [`MAGIC`].
        magic: [u8; 4],
        /// The client's [`VERSION`].
        version: u16,
        /// Shown by `gpumux ps`; at most [`MAX_NAME_BYTES`].
        name: String,
        /// Larger is more urgent; at most the config's limit for the client's uid.
        priority: i32,
        /// Share for proportional policies, > 0 and at most the config's limit.
        weight: f64,
        /// The GPU to run on (its index among the daemon's GPUs, from 0);
        /// `None`: the daemon places the client by its placement policy. A
        /// GPU the daemon does not serve is refused with the list it does.
        gpu: Option<u32>,
        /// What bounds the client's kernels, if it says (`GPUMUX_CLASS`):
        /// the `pairs` placement puts a memory-bound client beside
        /// compute-bound ones (docs/multi-gpu.md, "Placement").
        class: Option<ClientClass>,
    },
    /// Changes the client's priority (next scheduling round).
    SetPriority(i32),
    /// Changes the client's weight (next scheduling round).
    SetWeight(f64),
    /// Attaches the shared-memory region sent with this frame (`SCM_RIGHTS`,
    /// one memfd sealed against shrinking, at least `bytes` long); it replaces
    /// any region attached before. Copies then name offsets in it.
    AttachShm {
        /// Its size.
        bytes: u64,
    },
    /// Allocates device memory (counted against the client's quota).
    Alloc {
        /// How much; > 0.
        bytes: u64,
    },
    /// Frees a buffer once the work queued on its streams before now is done.
    Free(BufferId),
    /// Fills `bytes` bytes from `dst` with `value`, in stream order.
    Memset {
        /// Where.
        dst: BufferSlice,
        /// The byte.
        value: u8,
        /// How many.
        bytes: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// Copies `bytes` bytes from the shared region at `shm_offset` to `dst`.
    /// Answered when the region may be reused (the copy is done), with
    /// [`Reply::Copied`].
    CopyToDevice {
        /// Where in device memory.
        dst: BufferSlice,
        /// Where in the shared region.
        shm_offset: u64,
        /// How many.
        bytes: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// Copies `bytes` bytes from `src` into the shared region at
    /// `shm_offset`. Answered when the data is there, with [`Reply::Copied`].
    CopyToHost {
        /// Where in device memory.
        src: BufferSlice,
        /// Where in the shared region.
        shm_offset: u64,
        /// How many.
        bytes: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// Copies between two of the client's buffers, in stream order.
    CopyDevice {
        /// From.
        src: BufferSlice,
        /// To.
        dst: BufferSlice,
        /// How many.
        bytes: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// Compiles CUDA C source into preemptible workers (cached by source and
    /// options) and answers with its kernels.
    LoadModule {
        /// Shown in errors (`vector_add.cu`).
        name: String,
        /// The CUDA C source; at most [`MAX_SOURCE_BYTES`].
        source: String,
        /// NVRTC options (`-DN=4`, `--use_fast_math`); `-arch` is the daemon's.
        options: Vec<String>,
    },
    /// Launches a kernel, in stream order. Answered only when refused (an
    /// error with the request's id, in order with the connection's other
    /// replies); an accepted launch gets no reply, like a CUDA launch, and
    /// its end (or its failure) is seen through `SyncStream` or an event.
    /// (A reply per accepted launch cost the daemon a frame the client
    /// library dropped: 0.6 µs of the core's ~7.5 µs a launch, docs/daemon.md.)
    Launch(Launch),
    /// A new stream; its work runs in order, independent of other streams.
    CreateStream,
    /// Ends a stream after its queued work.
    DestroyStream(StreamId),
    /// Answered when every operation queued on the stream before it is done.
    SyncStream(StreamId),
    /// Records an event at this point of the stream.
    RecordEvent(StreamId),
    /// Whether the event's work is done (never blocks).
    QueryEvent(EventId),
    /// Answered when the event's work is done.
    WaitEvent(EventId),
    /// Forgets an event.
    DestroyEvent(EventId),
    /// The daemon's table of clients (`gpumux ps`); open to every allowed uid.
    Status,
    /// The client is done: its work is retreated and its memory freed, as on
    /// a disconnect, and the daemon answers before closing.
    Goodbye,
    /// Moves the rest of the conversation onto two shared-memory rings
    /// (`gpumux-ring`) whose file, a memfd sealed against shrinking of
    /// `4096 + 2 × capacity` bytes, comes with this frame (`SCM_RIGHTS`).
    /// Sent right after `Hello`'s answer, with nothing else in flight, over
    /// the socket. Once answered `Done` (through the rings), every frame both
    /// ways goes through the rings; the socket then carries only a doorbell
    /// byte (0) for a side that sleeps, a byte (1) with the descriptor of the
    /// next `AttachShm` or `AttachHost`, sent before its frame, and the end of the
    /// connection. An error answer (on the socket) leaves the conversation
    /// on the socket.
    UseRings {
        /// Each ring's bytes: a power of two from 4 KiB to 16 MiB.
        capacity: u32,
    },
    /// Attaches a host region of the client's besides its shared region: the
    /// memfd sent with this frame (`SCM_RIGHTS`, as for `AttachShm`: sealed
    /// against shrinking, at least `bytes` long). The daemon maps it and pins
    /// it (a real GPU registers it, as `cudaHostAlloc` memory is), counts
    /// `bytes` against the client's `host_memory` limit, and answers
    /// [`Reply::HostRegion`]. Copies then move data between it and device
    /// memory directly ([`Request::CopyFromHostRegion`],
    /// [`Request::CopyToHostRegion`]).
    AttachHost {
        /// Its size, > 0.
        bytes: u64,
    },
    /// Detaches a host region: its handle is gone at once (and its bytes no
    /// longer count against the limit); the daemon unpins and unmaps it once
    /// the work queued before now is done.
    DetachHost(HostRegionId),
    /// Copies `bytes` bytes from a host region to `dst`, in stream order,
    /// with no staging copy. Answered when the copy is done (the span may be
    /// reused).
    CopyFromHostRegion {
        /// Where in device memory.
        dst: BufferSlice,
        /// Where in the host region.
        src: HostSlice,
        /// How many.
        bytes: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// Copies `bytes` bytes from `src` into a host region, in stream order,
    /// with no staging copy. Answered when the data is there.
    CopyToHostRegion {
        /// Where in device memory.
        src: BufferSlice,
        /// Where in the host region.
        dst: HostSlice,
        /// How many.
        bytes: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// Makes `stream`'s later work wait until `event`'s work is done,
    /// without blocking the host (`cudaStreamWaitEvent`): the event as
    /// recorded now counts, a later `RecordEvent` does not change what this
    /// waits for. The scheduler never starts the waiting work before then,
    /// under any policy and across preemptions. Answered `Done` at once.
    StreamWaitEvent {
        /// The stream that waits.
        stream: StreamId,
        /// What it waits for (any stream of the client's, this one included).
        event: EventId,
    },
    /// The time between two events' ends (`cudaEventElapsedTime`), answered
    /// [`Reply::Elapsed`]; [`ErrorKind::NotReady`] while either has not
    /// ended. An event's time is the device time at which the daemon saw the
    /// work before it end (docs/daemon.md, "Event timing").
    EventElapsed {
        /// The earlier event.
        start: EventId,
        /// The later event.
        end: EventId,
    },
    /// What the device is (`cudaGetDeviceProperties`), answered
    /// [`Reply::Properties`].
    DeviceProperties,
    /// How many blocks of a kernel one SM holds at once
    /// (`cudaOccupancyMaxActiveBlocksPerMultiprocessor`), answered
    /// [`Reply::Occupancy`].
    Occupancy {
        /// The kernel.
        kernel: KernelId,
        /// Threads per block, 1 ..= the kernel's limit.
        block_threads: u32,
        /// Dynamic shared memory per block, bytes.
        dynamic_shared_bytes: u32,
    },
    /// A host function in stream order (`cudaLaunchHostFunc`): answered
    /// [`Reply::HostFunc`] once the stream's earlier work is done, and the
    /// stream's later work waits until the client sends
    /// [`Request::EndHostFunc`] with the answer's token (after running the
    /// function). If an error is sticky on the stream, the answer is that
    /// error and the stream goes on at once (the function is not to run,
    /// as CUDA does not call it after an error).
    HostFunc(StreamId),
    /// The host function of [`Request::HostFunc`]'s `token` returned: its
    /// stream goes on.
    EndHostFunc {
        /// From [`Reply::HostFunc`].
        token: u64,
    },
    /// Fills `count` words of `width` bytes (2 or 4) from `dst` with `value`
    /// (little-endian; its low 16 bits for width 2), in stream order
    /// (`cuMemsetD16`, `cuMemsetD32`). `dst`'s offset must be a multiple of
    /// `width`. Answered when accepted, as `Memset` is.
    Fill {
        /// Where; its offset a multiple of `width`.
        dst: BufferSlice,
        /// The word.
        value: u32,
        /// Bytes a word: 2 or 4.
        width: u8,
        /// How many words.
        count: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// [`Request::CopyFromHostRegion`] without waiting for it
    /// (`cudaMemcpyAsync` from pinned memory): answered only when refused,
    /// as a `Launch` is; its end (or its failure) is seen through
    /// `SyncStream` or an event. The span must not be written until then.
    CopyFromHostRegionAsync {
        /// Where in device memory.
        dst: BufferSlice,
        /// Where in the host region.
        src: HostSlice,
        /// How many.
        bytes: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// [`Request::CopyToHostRegion`] without waiting for it: answered only
    /// when refused; the span holds the data once `SyncStream` or an event
    /// recorded after it says the stream got there.
    CopyToHostRegionAsync {
        /// Where in device memory.
        src: BufferSlice,
        /// Where in the host region.
        dst: HostSlice,
        /// How many.
        bytes: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
    },
    /// A pitched copy (`cudaMemcpy2D`): `height` rows of `width` bytes,
    /// each side's rows its own pitch apart, in stream order, as one
    /// operation (on a GPU one linear copy per row, queued at once). Device to device, host
    /// region to device or device to host region (not host to host).
    /// Answered when done if `wait`, else when accepted (as `CopyDevice`).
    Copy2D {
        /// Where the rows are read.
        src: Place2D,
        /// Where they are written.
        dst: Place2D,
        /// Bytes a row, at most either pitch.
        width: u64,
        /// Rows.
        height: u64,
        /// Ordered after the stream's earlier work.
        stream: StreamId,
        /// Answered when the copy is done (true: the host span may be
        /// reused), or when accepted (false).
        wait: bool,
    },
    /// Splits every later launch of `kernel` over the daemon's GPUs
    /// (`Some`), or stops splitting it (`None`). Answered `Done`, or refused
    /// with the source analysis's reasons when the kernel's writes cannot be
    /// merged and `split.splittable` is `IfChecked` (docs/split.md,
    /// "Splitting in the daemon").
    SplitKernel {
        /// Which kernel.
        kernel: KernelId,
        /// How, or `None` to run it whole again.
        split: Option<Split>,
    },
    /// One launch split over the daemon's GPUs, in stream order like
    /// `Launch` and answered only when refused, as `Launch` is. A daemon of
    /// one GPU runs it whole (its log says so).
    LaunchSplit {
        /// The launch.
        launch: Launch,
        /// How.
        split: Split,
    },
}

/// How a launch is split over GPUs ([`Request::SplitKernel`],
/// [`Request::LaunchSplit`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    /// Whether the daemon's source analysis decides, or the client vouches.
    pub splittable: Splittable,
    /// At most this many GPUs (0: every GPU the daemon serves).
    pub gpus: u32,
    /// How each written buffer argument is merged, by argument index; a
    /// written buffer not named here is merged by shadow copy.
    pub merges: Vec<(u32, SplitMerge)>,
}

/// Whether a kernel may be split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Splittable {
    /// If the daemon's source analysis finds nothing that breaks the merge
    /// (global atomics, stores not indexed by the block, stores at an index
    /// read from memory, ...): else the request is refused with its reasons.
    IfChecked,
    /// The client vouches that different blocks write disjoint words.
    Declared,
}

/// How a written buffer's copies are merged back on the client's GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SplitMerge {
    /// GPU-SPARC's shadow buffers: per 4-byte word, another GPU's value
    /// where it differs from the buffer before the launch.
    Shadow,
    /// Blocks `[g * granule_blocks, (g + 1) * granule_blocks)` write only
    /// bytes `[offset + g * bytes_per_granule, offset + (g + 1) * bytes_per_granule)`
    /// from the argument's pointer: each GPU's slices are copied back as they are.
    Slices {
        /// Blocks per granule.
        granule_blocks: u32,
        /// Bytes a granule writes.
        bytes_per_granule: u64,
        /// Where granule 0's bytes start, from the argument's pointer.
        offset: u64,
    },
}

/// One side of a [`Request::Copy2D`]: where its first row starts, and how
/// far apart its rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Place2D {
    /// In a buffer.
    Device {
        /// The first row.
        at: BufferSlice,
        /// Bytes from one row's start to the next's.
        pitch: u64,
    },
    /// In a host region ([`Request::AttachHost`]).
    Host {
        /// The first row.
        at: HostSlice,
        /// Bytes from one row's start to the next's.
        pitch: u64,
    },
}

/// What a device is ([`Request::DeviceProperties`]), in the terms of CUDA's
/// `cudaDeviceProp`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceProperties {
    /// The device, in words (as in `Welcome`).
    pub name: String,
    /// A simulated device (kernels take time and compute nothing).
    pub simulated: bool,
    /// Compute capability, major and minor (9.0 for Hopper); a simulated
    /// device reports its preset's.
    pub compute_capability: [u32; 2],
    /// Streaming multiprocessors (`multiProcessorCount`).
    pub sms: u32,
    /// Device memory the daemon manages, bytes (`totalGlobalMem`).
    pub memory_bytes: u64,
    /// Peak device memory bandwidth, bytes per second.
    pub memory_bandwidth: f64,
    /// Threads per block (`maxThreadsPerBlock`).
    pub max_threads_per_block: u32,
    /// Block extent per dimension (`maxThreadsDim`).
    pub max_block_dims: [u32; 3],
    /// Grid extent per dimension (`maxGridSize`).
    pub max_grid_dims: [u32; 3],
    /// Resident threads per SM (`maxThreadsPerMultiProcessor`).
    pub max_threads_per_sm: u32,
    /// Resident blocks per SM (`maxBlocksPerMultiProcessor`).
    pub max_blocks_per_sm: u32,
    /// 32-bit registers per SM (`regsPerMultiprocessor`).
    pub registers_per_sm: u32,
    /// Shared memory per SM, bytes (`sharedMemPerMultiprocessor`); also the
    /// most a launch's block may ask for (the daemon's check).
    pub shared_bytes_per_sm: u32,
    /// Threads per warp.
    pub warp_size: u32,
}

/// A kernel launch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Launch {
    /// Which kernel.
    pub kernel: KernelId,
    /// Grid, in blocks, x y z, each ≥ 1.
    pub grid: [u32; 3],
    /// Block, in threads, x y z, each ≥ 1, at most 1024 in all.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
    /// The kernel's parameters, in order.
    pub args: Vec<Arg>,
    /// The stream it is ordered on.
    pub stream: StreamId,
    /// How long one block takes, for a simulated device (which computes
    /// nothing and takes the time instead); a real GPU ignores it.
    pub block_time_ns: Option<u64>,
}

/// A kernel of a loaded module.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelEntry {
    /// Its name in the source.
    pub name: String,
    /// Its handle for `Launch`.
    pub kernel: KernelId,
    /// Its parameter sizes in bytes, in order, where the device knows them
    /// (a real GPU does; the simulated one reports what the source declares,
    /// or nothing).
    pub param_sizes: Option<Vec<u32>>,
}

/// A successful answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// The handshake succeeded.
    Welcome(Welcome),
    /// Done (or accepted, for a launch).
    Done,
    /// The new buffer.
    Buffer(BufferId),
    /// The loaded module.
    Module {
        /// Its handle.
        module: ModuleId,
        /// Its kernels.
        kernels: Vec<KernelEntry>,
        /// The compiler's log (warnings), if any.
        log: String,
        /// Whether it came from the daemon's cache.
        cached: bool,
    },
    /// The new stream.
    Stream(StreamId),
    /// The recorded event.
    Event(EventId),
    /// An event's state.
    Query(bool),
    /// The table of clients.
    Status(Status),
    /// The attached host region ([`Request::AttachHost`]).
    HostRegion(HostRegionId),
    /// Nanoseconds from the first event's end to the second's
    /// ([`Request::EventElapsed`]); negative if the second ended first.
    Elapsed(i64),
    /// The device ([`Request::DeviceProperties`]).
    Properties(DeviceProperties),
    /// Blocks per SM ([`Request::Occupancy`]); 0 when one block does not fit.
    Occupancy(u32),
    /// The stream reached a host function ([`Request::HostFunc`]): run it,
    /// then send [`Request::EndHostFunc`] with this token.
    HostFunc(u64),
    /// A chunk of a staging copy is done ([`Request::CopyToDevice`],
    /// [`Request::CopyToHost`]): as [`Reply::Done`], and what the client's
    /// copier needs to share the host with the others (issue 35).
    Copied {
        /// Other clients of the daemon's GPU that have work queued or
        /// running, or submitted some lately (gpumuxd's `BESIDE_WINDOW`), as
        /// the chunk ended. Above 0, the client copies its next chunks on
        /// fewer threads: its `memcpy` takes the host's memory bandwidth and
        /// cache from theirs (docs/daemon.md, "A pageable copy beside other
        /// clients").
        others: u32,
    },
}

/// What the daemon tells a client at the handshake.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    /// The daemon's protocol version.
    pub version: u16,
    /// The client's number in `gpumux ps`.
    pub client: u64,
    /// The device, in words (`NVIDIA H100 80GB HBM3 (cuda:0)`, `sim:h100`).
    pub device: String,
    /// The scheduling policy.
    pub policy: String,
    /// The SMs.
    pub sms: u32,
    /// The limits the client has.
    pub limits: Limits,
    /// The GPU the client was placed on (its index among the daemon's GPUs;
    /// 0 on a daemon of one GPU). Its streams, buffers and kernels live there.
    pub gpu: u32,
}

/// A client's limits, from the daemon's config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// The highest priority it may ask for.
    pub max_priority: i32,
    /// The largest weight it may ask for.
    pub max_weight: f64,
    /// Device memory it may hold, bytes.
    pub memory_bytes: u64,
    /// Operations it may have queued or running at once.
    pub queued_ops: u32,
    /// The largest shared region it may attach, bytes.
    pub shm_bytes: u64,
    /// Host regions ([`Request::AttachHost`]) it may have attached at once,
    /// bytes in all.
    pub host_memory_bytes: u64,
}

/// Why a request failed. `kind` is for programs, `message` for people.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    /// What went wrong.
    pub kind: ErrorKind,
    /// What to do about it, in words.
    pub message: String,
}

/// The kinds of failure a client can get.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The frame could not be decoded; the connection is closed.
    BadFrame,
    /// A request out of turn (a second `Hello`, anything before `Hello`); the connection is closed.
    Protocol,
    /// The other side speaks another protocol version.
    Version {
        /// The daemon's version.
        daemon: u16,
        /// The client's.
        client: u16,
    },
    /// The config does not allow this uid, or this priority or weight.
    NotPermitted,
    /// Over a limit of the config (memory, queued operations, shared region, host memory).
    Quota,
    /// The device has no memory left (under the client's quota).
    OutOfMemory,
    /// A handle that is not this client's (never allocated, freed, or another's).
    NoSuchHandle,
    /// An offset or size outside its buffer or shared region.
    OutOfRange,
    /// A malformed value (zero size, a grid of 0, a block over 1024 threads, args that do not match).
    Invalid,
    /// The module does not compile; the message holds the compiler's log.
    Compile,
    /// The transformation refuses a kernel; the message names the line and the reason.
    Transform {
        /// 1-based line of the source.
        line: u32,
    },
    /// The context broke while a kernel of this client was running: it
    /// faulted, or, when kernels of several clients were on the device, it is
    /// one of the suspects (the driver does not say which kernel faulted;
    /// the message says how many clients share the suspicion). The context
    /// was rebuilt.
    KernelFault,
    /// Work of this client was lost when another client's kernel broke the
    /// context; the message lists it.
    ContextLost,
    /// The device failed in a way not listed above.
    Device,
    /// The daemon is shutting down.
    ShuttingDown,
    /// The work asked about has not ended yet (an event's time:
    /// `cudaErrorNotReady`); ask again after waiting for it.
    NotReady,
}

/// What the daemon tells a client unasked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Notice {
    /// The CUDA context was lost and rebuilt: `lost` says what of this
    /// client's went with it. Its buffers are gone (their handles stay
    /// valid names but must be re-filled), its modules reloaded.
    ContextLost {
        /// Whether this client's kernel caused it.
        caused_by_you: bool,
        /// What happened, in words (the driver's error).
        what: String,
        /// The client's work that was lost.
        lost: LostWork,
    },
    /// The daemon is stopping; the connection closes next.
    ShuttingDown,
}

/// A client's work lost with a context.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LostWork {
    /// Kernel launches queued or running, as `name` per launch.
    pub launches: Vec<String>,
    /// Copies and memsets queued or running.
    pub copies: u32,
    /// Buffers whose contents are gone (the handles stay allocated, contents undefined).
    pub buffers: Vec<BufferId>,
}

/// The daemon's table of clients.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The device, in words.
    pub device: String,
    /// The policy.
    pub policy: String,
    /// SMs of the device.
    pub sms: u32,
    /// Device memory the daemon's clients hold, bytes: the clients listed,
    /// and clients that have left whose launches or copies are still on
    /// the device (their memory is freed when those end; a kernel's blocks
    /// in flight run to their end), which no row lists.
    pub memory_used: u64,
    /// Device memory in all, bytes.
    pub memory_total: u64,
    /// Of `memory_used`, evicted to host memory, bytes (docs/daemon.md,
    /// "Memory oversubscription").
    pub memory_evicted: u64,
    /// Host memory evicted buffers may take in all (`swap_memory`), bytes.
    pub swap_memory: u64,
    /// Buffers evicted and restored since the daemon started.
    pub evictions: u64,
    /// See `evictions`.
    pub restores: u64,
    /// Host memory the daemon holds pinned for its clients' host regions
    /// ([`Request::AttachHost`]), detached ones still in use included, bytes.
    pub host_memory_used: u64,
    /// Seconds since the daemon started.
    pub uptime_s: f64,
    /// Contexts rebuilt after a fault (on every GPU together).
    pub context_rebuilds: u32,
    /// One row per client.
    pub clients: Vec<ClientStatus>,
    /// One row per GPU the daemon serves (one on a daemon of one GPU); the
    /// fields above are their totals.
    pub gpus: Vec<GpuStatus>,
}

/// One GPU in [`Status`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// Its index among the daemon's GPUs (what `Hello::gpu` names).
    pub gpu: u32,
    /// The device, in words.
    pub device: String,
    /// Its SMs.
    pub sms: u32,
    /// SMs its clients' kernels hold now.
    pub sms_busy: u32,
    /// Device memory its clients hold, bytes (evicted included).
    pub memory_used: u64,
    /// Its device memory, bytes.
    pub memory_total: u64,
    /// Clients placed on it.
    pub clients: u32,
    /// Operations queued or running on it.
    pub ops: u32,
    /// Contexts rebuilt after a fault on it.
    pub context_rebuilds: u32,
}

/// One client in [`Status`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientStatus {
    /// Its number.
    pub client: u64,
    /// The GPU it was placed on ([`GpuStatus::gpu`]).
    pub gpu: u32,
    /// Process id, uid and gid, as the kernel reported them (`SO_PEERCRED`).
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
    /// Name from its `Hello`.
    pub name: String,
    /// Priority now.
    pub priority: i32,
    /// Weight now.
    pub weight: f64,
    /// Device memory held, bytes, resident and evicted.
    pub memory_used: u64,
    /// Of that, evicted to host memory (the daemon brings it back before
    /// its next kernel or copy runs).
    pub memory_evicted: u64,
    /// Its memory quota, bytes.
    pub memory_quota: u64,
    /// Host memory of its attached host regions, bytes.
    pub host_memory_used: u64,
    /// Its host memory limit, bytes.
    pub host_memory_quota: u64,
    /// Operations queued (not started).
    pub ops_queued: u32,
    /// Operations running.
    pub ops_running: u32,
    /// SMs its kernels hold now.
    pub sms_held: u32,
    /// Times its kernels were preempted.
    pub preemptions: u64,
    /// Kernels completed.
    pub kernels_done: u64,
}

impl Request {
    /// A `Hello` of this [`VERSION`] at weight 1, placed by the daemon and
    /// declaring no class: the common case, so that a field added to `Hello`
    /// is not written again at every site that needs no more than this.
    pub fn hello(name: impl Into<String>, priority: i32) -> Request {
        Request::Hello {
            magic: MAGIC,
            version: VERSION,
            name: name.into(),
            priority,
            weight: 1.0,
            gpu: None,
            class: None,
        }
    }

    /// The request's name, for messages (`Launch`, `CopyToDevice`).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "Hello",
            Request::SetPriority(_) => "SetPriority",
            Request::SetWeight(_) => "SetWeight",
            Request::AttachShm { .. } => "AttachShm",
            Request::Alloc { .. } => "Alloc",
            Request::Free(_) => "Free",
            Request::Memset { .. } => "Memset",
            Request::CopyToDevice { .. } => "CopyToDevice",
            Request::CopyToHost { .. } => "CopyToHost",
            Request::CopyDevice { .. } => "CopyDevice",
            Request::LoadModule { .. } => "LoadModule",
            Request::Launch(_) => "Launch",
            Request::CreateStream => "CreateStream",
            Request::DestroyStream(_) => "DestroyStream",
            Request::SyncStream(_) => "SyncStream",
            Request::RecordEvent(_) => "RecordEvent",
            Request::QueryEvent(_) => "QueryEvent",
            Request::WaitEvent(_) => "WaitEvent",
            Request::DestroyEvent(_) => "DestroyEvent",
            Request::Status => "Status",
            Request::Goodbye => "Goodbye",
            Request::UseRings { .. } => "UseRings",
            Request::AttachHost { .. } => "AttachHost",
            Request::DetachHost(_) => "DetachHost",
            Request::CopyFromHostRegion { .. } => "CopyFromHostRegion",
            Request::CopyToHostRegion { .. } => "CopyToHostRegion",
            Request::StreamWaitEvent { .. } => "StreamWaitEvent",
            Request::EventElapsed { .. } => "EventElapsed",
            Request::DeviceProperties => "DeviceProperties",
            Request::Occupancy { .. } => "Occupancy",
            Request::HostFunc(_) => "HostFunc",
            Request::EndHostFunc { .. } => "EndHostFunc",
            Request::Fill { .. } => "Fill",
            Request::CopyFromHostRegionAsync { .. } => "CopyFromHostRegionAsync",
            Request::CopyToHostRegionAsync { .. } => "CopyToHostRegionAsync",
            Request::Copy2D { .. } => "Copy2D",
            Request::SplitKernel { .. } => "SplitKernel",
            Request::LaunchSplit { .. } => "LaunchSplit",
        }
    }
}

impl ErrorReply {
    /// An error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ErrorReply { kind, message: message.into() }
    }
}

impl std::fmt::Display for ErrorReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ErrorReply {}

/// The host-bus speed that both sides assume when they poll for a host
/// copy's reply instead of sleeping: below every GPU's (PCIe 4.0 x16 moves
/// ~25 GB/s, 5.0 ~50), so the estimate errs long, and a wait that polls that
/// long ends at the reply anyway.
pub const SPIN_COPY_BYTES_PER_SEC: u64 = 10_000_000_000;

/// About how long a copy of `bytes` between host and device takes (at
/// [`SPIN_COPY_BYTES_PER_SEC`]): how long a client waiting for it polls for
/// the reply, and (plus its own window) how long the daemon's reader for that
/// client keeps polling for the client's next request.
pub fn expected_copy_time(bytes: u64) -> std::time::Duration {
    // Bytes per ns (10): no product that could overflow for a copy of many GiB.
    std::time::Duration::from_nanos(bytes / (SPIN_COPY_BYTES_PER_SEC / 1_000_000_000))
}

/// Where a daemon listens and a client connects when no path is given:
/// `$XDG_RUNTIME_DIR/gpumux.sock` for a user's daemon, else
/// `/run/gpumux/gpumux.sock`, a system service's (packaging/gpumuxd.service).
pub fn default_socket_path() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => std::path::Path::new(&dir).join("gpumux.sock"),
        _ => std::path::PathBuf::from("/run/gpumux/gpumux.sock"),
    }
}

/// A name a client chose (its `Hello` name, a module's name) made safe to
/// print on anyone's terminal and in any log: every character that is not
/// printable text is written as an escape, so no name can move the cursor,
/// clear a screen, start a new line or reverse the text after it.
///
/// Escaped: control characters (C0, DEL, C1: `\n`, `\r` and `\t` as such,
/// others as `\u{1b}`), the line and paragraph separators, and the invisible
/// format characters that reorder or hide text (bidirectional overrides,
/// embeddings and isolates, zero-width characters, the byte order mark).
/// Everything else, non-ASCII text included, is kept. The result is at most
/// [`MAX_NAME_BYTES`] long (escapes are cut whole, never in their middle),
/// and applying it again changes nothing.
///
/// **Why at the source.** gpumuxd applies this to a client's name when its
/// `Hello` comes, before the name is stored, logged or given to the engine,
/// rather than escaping at each place that prints it: the name reaches
/// every user's `gpumux ps` and `gpumux top`, the `--json` output that
/// scripts read and print, the daemon's log, the engine's process names and
/// any program reading [`Status`] through the client library. Escaping once,
/// where it enters, leaves none of them to forget; `gpumux ps` applies it
/// again (a no-op) for a daemon older than this rule.
pub fn printable_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len().min(MAX_NAME_BYTES));
    let mut piece = String::new();
    for c in name.chars() {
        piece.clear();
        match c {
            '\n' => piece.push_str("\\n"),
            '\r' => piece.push_str("\\r"),
            '\t' => piece.push_str("\\t"),
            c if hides_or_moves_text(c) => piece.extend(c.escape_unicode()),
            c => piece.push(c),
        }
        if out.len() + piece.len() > MAX_NAME_BYTES {
            break;
        }
        out.push_str(&piece);
    }
    out
}

/// Whether `c` is a character [`printable_name`] escapes.
fn hides_or_moves_text(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}' // soft hyphen (invisible)
            | '\u{061C}' // Arabic letter mark
            | '\u{180E}' // Mongolian vowel separator
            | '\u{200B}'..='\u{200F}' // zero-width space, (non-)joiners, LRM, RLM
            | '\u{2028}' | '\u{2029}' // line and paragraph separators
            | '\u{202A}'..='\u{202E}' // bidirectional embeddings and overrides
            | '\u{2060}'..='\u{2064}' // word joiner and invisible operators
            | '\u{2066}'..='\u{2069}' // bidirectional isolates
            | '\u{206A}'..='\u{206F}' // deprecated format characters
            | '\u{FEFF}' // byte order mark
            | '\u{FFF9}'..='\u{FFFB}' // interlinear annotations
        )
}

#[cfg(test)]
mod tests;

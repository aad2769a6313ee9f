//! One launch split over several GPUs inside the daemon (issue 38, item 3;
//! docs/split.md, "Splitting in the daemon").
//!
//! A client asks per launch (`LaunchSplit`) or per kernel (`SplitKernel`).
//! Its home core (the GPU it was placed on) checks the kernel's source with
//! `gpumux_cuda::split::analyse` and refuses, with the analysis's reasons, a
//! kernel whose writes cannot be merged unless the client declared it
//! splittable; it divides the blocks by SM count (`split::partition`) and
//! plans what is replicated and merged (`split::merge::plan`).
//!
//! In stream order the launch is two operations on the client's stream: a
//! marker, which completes when everything before it has, and a hold, which
//! keeps everything after it waiting until the merge ends. When the marker
//! completes, the home core reads back the buffers the launch uses (inputs
//! to replicate, outputs' pre-launch contents for the shadow merge), sends
//! each other GPU's core its block range with those bytes ([`Part`]), and
//! runs its own range on a stream of the client's own, made for the split.
//! Another core runs its part as a session of its own (the kernel's module
//! loaded, the buffers allocated and written in, one launch over the
//! range), reads back what its blocks wrote and sends it home
//! ([`PartDone`]), then lets the session go like a client that left. When
//! every range has ended, the home core merges (`merge_shadow`: per 4-byte
//! word, another GPU's value where it differs from the pre-launch contents;
//! declared slices: copied as they are) and releases the hold.
//!
//! Bytes travel through host memory (`Backend::read_back` / `write_in`, the
//! pieces path of a client's move between GPUs), not over a peer link:
//! every core's device owns its own context.

use super::*;
use gpumux_cuda::split::merge::{self, BlockSlices, BufferUse, Merge, Role};
use gpumux_proto::{Arg, Split, SplitMerge, Splittable};
use std::ops::Range;

/// A part session's key on another core: the high bit keeps it apart from
/// every client's number.
const PART_BIT: u64 = 1 << 63;

/// The split state of one core: its own clients' splits under way, and
/// parts of other cores' splits it runs.
#[derive(Default)]
pub(super) struct Splits {
    /// Every core's channel, by GPU (empty with one GPU).
    peers: Vec<Sender<CoreMsg>>,
    /// Every GPU's SMs, by GPU (how blocks are divided).
    sms: Vec<u32>,
    next_token: u64,
    /// This core's clients' splits, by token.
    pending: HashMap<u64, PendingSplit>,
    /// Parts of other cores' splits run here, by part session.
    parts: HashMap<u64, RunningPart>,
    /// Engine completions of split operations, handled after the drain
    /// that saw them (they submit and release operations).
    pub(super) todo: Vec<Step>,
    /// Regions of this core's splits that ended, kept for the next ones:
    /// each GPU's device registered (pinned) a region the first time it
    /// saw it, which a new region would cost again; released when unused
    /// for a while or past a bound (`split_pool.rs`).
    pub(super) pool: super::split_pool::RegionPool,
}

/// A split operation's end, seen in `drain_completions`.
#[derive(Debug)]
pub(super) enum Step {
    /// The marker: the stream reached the split launch.
    Reached { token: u64, completed: bool },
    /// A range ended, on a home core or a part's.
    RangeEnded { client: u64, token: u64, completed: bool, failed: Option<String> },
}

/// One buffer of a split launch.
#[derive(Clone, Debug)]
struct SplitBuffer {
    id: BufferId,
    addr: DevAddr,
    bytes: u64,
    /// Its contents go to every other GPU before the launch.
    replicate: bool,
    /// Only each other GPU's declared slices go to it before the launch
    /// (an output the kernel does not read, merged by declared slices:
    /// bytes of a slice its blocks leave alone come back as they were).
    slice_replica: bool,
    /// Spans (in the buffer) merged by shadow copy.
    shadow: Vec<Range<u64>>,
    /// Per GPU of the plan, the spans its blocks wrote (declared slices).
    slices: Vec<Vec<Range<u64>>>,
}

impl SplitBuffer {
    /// What GPU `g` of the plan sends home after its range.
    fn back(&self, g: usize) -> Vec<Range<u64>> {
        let mut spans = self.shadow.clone();
        spans.extend(self.slices.get(g).into_iter().flatten().cloned());
        spans
    }
}

struct PendingSplit {
    client: u64,
    stream: StreamId,
    hold: Option<OpId>,
    kernel: String,
    launch: gpumux_proto::Launch,
    /// The plan's GPUs, home first, and their block ranges.
    gpus: Vec<u32>,
    ranges: Vec<Range<u32>>,
    buffers: Vec<SplitBuffer>,
    /// Where in `region` the pre-launch contents of buffers with shadow
    /// spans are, by buffer index.
    snapshots: HashMap<usize, u64>,
    /// The split's bytes (module doc), once the stream reached it.
    region: Option<Arc<ShmRegion>>,
    /// The split's own stream on this core, once reached.
    own_stream: Option<StreamId>,
    ranges_left: usize,
    /// What other GPUs sent home: (plan index, buffer index, span, where
    /// its bytes are in `region`).
    back: Vec<(usize, usize, Range<u64>, u64)>,
    error: Option<String>,
    replicated: u64,
    reached: Option<Instant>,
    /// How long the home core took to read the buffers back and send the parts.
    sending: Duration,
    /// Each other GPU's times, in words (from its [`PartDone`]).
    part_times: Vec<String>,
}

struct RunningPart {
    token: u64,
    home: Sender<CoreMsg>,
    /// Index of this GPU in the plan.
    index: usize,
    /// What to send home: buffer index, its handle, the spans and where
    /// they go in `region`.
    back: Vec<(usize, BufferId, Back)>,
    region: Arc<ShmRegion>,
    /// How long its set-up took (module loaded, buffers allocated and
    /// written in), and when its range was queued.
    setup: Duration,
    queued: Instant,
}

/// A block range of another core's split launch, to run here.
pub struct Part {
    token: u64,
    home_gpu: u32,
    home: Sender<CoreMsg>,
    index: usize,
    client: u64,
    name: String,
    limits: ClientLimits,
    /// The client's priority and weight, its part session's on the other GPU.
    priority: i32,
    weight: f64,
    module: (String, String, Vec<String>),
    kernel: String,
    launch: gpumux_proto::Launch,
    range: Range<u32>,
    buffers: Vec<PartBuffer>,
    /// The split's region: the bytes to write in, and where those sent
    /// back go.
    region: Arc<ShmRegion>,
}

/// A buffer of a part: its handle (the client's), its size, the bytes to
/// write in (replicated; the rest is left as allocated), the spans to send
/// back.
#[derive(Debug)]
struct PartBuffer {
    id: BufferId,
    bytes: u64,
    data: Replica,
    back: Back,
}

/// Bytes for one GPU's copy of a buffer: (offset in the buffer, where they
/// are in the split's region, length).
type Replica = Vec<(u64, u64, u64)>;

/// Spans of a buffer one GPU sends home, each with where its bytes go in
/// the split's region.
type Back = Vec<(Range<u64>, u64)>;

/// `spans` cut to a buffer of `bytes` bytes, empty ones left out.
fn clip(spans: &[Range<u64>], bytes: u64) -> impl Iterator<Item = Range<u64>> + '_ {
    spans.iter().map(move |s| s.start.min(bytes)..s.end.min(bytes)).filter(|s| !s.is_empty())
}

/// Bytes `span` of split buffer `b` read back from the device, or why not.
fn read_span(backend: &mut dyn Backend, b: &SplitBuffer, span: Range<u64>) -> Result<Vec<u8>, String> {
    match backend.read_span(b.addr, span.start, span.end - span.start) {
        Some(Ok(d)) => Ok(d),
        Some(Err(e)) => Err(format!("buffer {}: {e}", b.id.0)),
        None => Err(format!("{} has no read-back", backend.describe())),
    }
}

/// Writes `data` at `offset` of the allocation at `addr`, or says why not.
fn write_span(backend: &mut dyn Backend, addr: DevAddr, offset: u64, data: &[u8]) -> Result<(), String> {
    match backend.write_span(addr, offset, data) {
        Some(r) => r.map_err(|e| e.to_string()),
        None => Err(format!("{} has no write-in", backend.describe())),
    }
}

/// What one GPU's range sent home: (buffer index, span, where its bytes
/// are in the split's region).
type Spans = Vec<(usize, Range<u64>, u64)>;

impl std::fmt::Debug for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Part {{ token: {}, from GPU {}, blocks {:?} }}", self.token, self.home_gpu, self.range)
    }
}

/// What a part sends home: the spans its blocks wrote, or why it failed.
#[derive(Debug)]
pub struct PartDone {
    token: u64,
    index: usize,
    result: Result<Spans, String>,
    /// Its range was launched there (false: it failed before, in its set-up).
    ran: bool,
    /// Where its time went, in words (the home core logs it).
    times: String,
}

/// Why a kernel is refused, in the words of `gpumux_cuda::split::SplitError::Refused`.
fn refused(kernel: &str, reasons: &[gpumux_cuda::split::Refusal]) -> ErrorReply {
    let e = gpumux_cuda::split::SplitError::Refused { kernel: kernel.to_owned(), reasons: reasons.to_vec() };
    err(ErrorKind::Invalid, e.to_string().replace("Splittable::Declared", "Splittable::Declared in its Split"))
}

/// Shadow merge of one span: each 4-byte word of `other` that differs from
/// `snapshot` replaces `home`'s (GPU-SPARC's shadow buffers; merge.rs's
/// `gmx_shadow_merge`, here on the host). A trailing part word is compared
/// byte by byte. Returns the bytes taken from `other`.
pub fn merge_shadow(home: &mut [u8], snapshot: &[u8], other: &[u8]) -> u64 {
    let n = home.len().min(snapshot.len()).min(other.len());
    let mut taken = 0u64;
    let mut w = 0;
    while w < n {
        let end = (w + 4).min(n);
        if other[w..end] != snapshot[w..end] {
            home[w..end].copy_from_slice(&other[w..end]);
            taken += (end - w) as u64;
        }
        w = end;
    }
    taken
}

/// More runs of changed words than this in one span, and the shadow merge
/// reads the home copy's span back and writes it whole instead of one
/// write per run (each a call to the device, an exchange with a device
/// process).
const MAX_RUNS: usize = 64;

/// The byte ranges of `other`'s 4-byte words (a trailing part word by its
/// bytes) that differ from `snapshot`, adjacent ones joined: what
/// [`merge_shadow`] would take, as spans to write into the home copy.
pub fn changed_runs(snapshot: &[u8], other: &[u8]) -> Vec<Range<usize>> {
    /// Blocks compared whole first (a `memcmp`): only a block that differs
    /// is looked at word by word (a multiple of 4, so words stay aligned).
    const BLOCK: usize = 4096;
    let n = snapshot.len().min(other.len());
    let mut runs: Vec<Range<usize>> = Vec::new();
    let mut b = 0;
    while b < n {
        let block_end = (b + BLOCK).min(n);
        if other[b..block_end] != snapshot[b..block_end] {
            // Whole words compared as `u32`s, a trailing part word by its bytes.
            let (o, s) = (&other[b..block_end], &snapshot[b..block_end]);
            let mut w = b;
            for (x, y) in o.chunks(4).zip(s.chunks(4)) {
                let end = w + x.len();
                let differs = match (<[u8; 4]>::try_from(x), <[u8; 4]>::try_from(y)) {
                    (Ok(x), Ok(y)) => u32::from_ne_bytes(x) != u32::from_ne_bytes(y),
                    _ => x != y,
                };
                if differs {
                    match runs.last_mut() {
                        Some(r) if r.end == w => r.end = end,
                        _ => runs.push(w..end),
                    }
                }
                w = end;
            }
        }
        b = block_end;
    }
    runs
}

impl Core {
    /// Several GPUs: every core's channel and SMs, by GPU.
    pub fn with_peers(mut self, peers: Vec<Sender<CoreMsg>>, sms: Vec<u32>) -> Core {
        self.split.peers = peers;
        self.split.sms = sms;
        self
    }

    /// Checks `split` for `kernel` of `client`: the analysis's refusal, or
    /// what the kernel does with each argument (`Role::Out`: only writes it,
    /// so its prior contents need not reach the other GPUs). `None`: every
    /// one may be read and written, for a kernel declared splittable: the
    /// analysis may have missed a write, through a helper or a pointer it
    /// cannot follow, and a buffer taken for an input would lose the other
    /// GPUs' writes.
    fn split_check(&self, client: u64, kernel: KernelId, split: &Split) -> Result<Option<Vec<Role>>, ErrorReply> {
        let s = self.session(client)?;
        let image = s
            .kernels
            .get(&kernel)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("kernel {} is not yours", kernel.0)))?;
        for (arg, m) in &split.merges {
            if let SplitMerge::Slices { granule_blocks: 0, .. } | SplitMerge::Slices { bytes_per_granule: 0, .. } = m {
                return Err(err(ErrorKind::Invalid, format!("argument {arg}: declared slices of 0 blocks or 0 bytes")));
            }
        }
        // Declared: the client vouches, and the analysis's answer is not read
        // (it parses the source, at every `LaunchSplit`).
        if split.splittable == Splittable::Declared {
            return Ok(None);
        }
        let source = s.modules.values().find(|m| m.kernels.contains(&kernel)).map(|m| m.source.as_str());
        match source.and_then(|src| gpumux_cuda::split::analyse(src, &image.name)) {
            Some(a) if !a.splittable() => Err(refused(&a.kernel, &a.refusals)),
            Some(a) => Ok(Some(
                a.params
                    .iter()
                    .map(|p| match (p.pointer && p.written, p.read) {
                        (false, _) => Role::In,
                        (true, false) => Role::Out,
                        (true, true) => Role::InOut,
                    })
                    .collect(),
            )),
            None => Err(err(
                ErrorKind::Invalid,
                format!(
                    "kernel `{}` is not split: its source cannot be read by the daemon's analysis; declare it \
                     splittable (Splittable::Declared in its Split) if its blocks write disjoint words",
                    image.name
                ),
            )),
        }
    }

    /// `SplitKernel`: every later launch of `kernel` is split (or not).
    pub(super) fn split_kernel(
        &mut self,
        client: u64,
        kernel: KernelId,
        split: Option<Split>,
    ) -> Result<Reply, ErrorReply> {
        let roles = match &split {
            Some(sp) => Some(self.split_check(client, kernel, sp)?),
            None => None,
        };
        let s = self.session_mut(client)?;
        if !s.kernels.contains_key(&kernel) {
            return Err(err(ErrorKind::NoSuchHandle, format!("kernel {} is not yours", kernel.0)));
        }
        match (split, roles) {
            (Some(sp), Some(w)) => s.split_kernels.insert(kernel, (sp, w)),
            _ => s.split_kernels.remove(&kernel),
        };
        Ok(Reply::Done)
    }

    /// A launch with a split: checked, planned, and queued on its stream as
    /// a marker and a hold (module doc); run whole where it cannot split.
    pub(super) fn launch_split(
        &mut self,
        client: u64,
        l: &gpumux_proto::Launch,
        split: &Split,
    ) -> Result<(), ErrorReply> {
        let roles = self.split_check(client, l.kernel, split)?;
        self.launch_split_checked(client, l, split, roles)
    }

    /// [`Core::launch_split`] of a kernel checked already (`roles`: what it
    /// does with each argument, `None`: it may read and write any).
    pub(super) fn launch_split_checked(
        &mut self,
        client: u64,
        l: &gpumux_proto::Launch,
        split: &Split,
        roles: Option<Vec<Role>>,
    ) -> Result<(), ErrorReply> {
        let s = self.session(client)?;
        let image = s
            .kernels
            .get(&l.kernel)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("kernel {} is not yours", l.kernel.0)))?;
        let c = validate::launch(s, image, self.backend.info(), l)?;
        let name = image.name.clone();
        let wanted = if split.gpus == 0 { u32::MAX } else { split.gpus };
        let gpus: Vec<u32> = std::iter::once(self.gpu)
            .chain((0..self.split.peers.len() as u32).filter(|&g| g != self.gpu))
            .take(wanted.min(self.split.peers.len().max(1) as u32) as usize)
            .collect();
        let whole = if gpus.len() < 2 {
            Some(format!(
                "this daemon serves {} GPU(s) and the split asks for {}",
                self.split.peers.len().max(1),
                split.gpus
            ))
        } else if !self.backend.runs_block_ranges() {
            Some(format!("{} cannot run part of a launch yet", self.backend.describe()))
        } else if c.blocks < 2 {
            Some("one block".into())
        } else {
            None
        };
        if let Some(why) = whole {
            tracing::info!("client {client}: `{name}` runs whole, not split: {why}");
            return self.launch_whole(client, l);
        }
        // What each buffer argument is to the merge.
        let mut uses = Vec::new();
        let mut args = Vec::new();
        for (i, a) in l.args.iter().enumerate() {
            let Arg::Buffer(slice) = a else { continue };
            let b = s
                .buffers
                .get(&slice.buffer)
                .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("buffer {} is not yours", slice.buffer.0)))?;
            let role = roles.as_ref().map_or(Role::InOut, |r| r.get(i).copied().unwrap_or(Role::InOut));
            let merge = match split.merges.iter().find(|(arg, _)| *arg as usize == i).map(|(_, m)| *m) {
                Some(SplitMerge::Slices { granule_blocks, bytes_per_granule, offset }) => {
                    Merge::Slices { slices: BlockSlices { granule_blocks, bytes_per_granule, offset }, verify: false }
                }
                _ => Merge::Shadow,
            };
            // A buffer the kernel reads and writes is replicated whole; one it
            // only writes is replicated whole for the shadow merge (which finds
            // the written words by comparing with the pre-launch contents) and,
            // with declared slices, only over each GPU's slices (module doc).
            uses.push(BufferUse { bytes: b.bytes.saturating_sub(slice.offset), role, merge });
            args.push((slice.buffer, slice.offset, b.addr, b.bytes));
        }
        let bad = |e: gpumux_cuda::split::SplitError| err(ErrorKind::Invalid, format!("`{name}` is not split: {e}"));
        let granule = merge::granule(&uses).map_err(bad)?;
        let sms: Vec<u32> = gpus.iter().map(|&g| self.split.sms.get(g as usize).copied().unwrap_or(1)).collect();
        let ranges = gpumux_cuda::split::partition(c.blocks as u32, &sms, granule).map_err(bad)?;
        let plan = merge::plan(ranges.clone(), &uses).map_err(bad)?;
        // One entry per distinct buffer, its arguments' spans made the buffer's.
        let mut buffers: Vec<SplitBuffer> = Vec::new();
        for ((id, offset, addr, bytes), (u, p)) in args.iter().zip(uses.iter().zip(&plan.buffers)) {
            let i = match buffers.iter().position(|b| b.id == *id) {
                Some(i) => i,
                None => {
                    buffers.push(SplitBuffer {
                        id: *id,
                        addr: *addr,
                        bytes: *bytes,
                        replicate: false,
                        slice_replica: false,
                        shadow: Vec::new(),
                        slices: vec![Vec::new(); gpus.len()],
                    });
                    buffers.len() - 1
                }
            };
            let b = &mut buffers[i];
            b.replicate |= p.replicate;
            b.slice_replica |= u.role == Role::Out && matches!(u.merge, Merge::Slices { .. });
            if p.shadow_merge.iter().any(|&m| m) {
                b.shadow.push(*offset..offset + u.bytes);
            }
            for (g, spans) in p.copy_back.iter().enumerate() {
                b.slices[g].extend(spans.iter().map(|r| r.start + offset..r.end + offset));
            }
        }
        let s = self.session(client)?;
        if s.in_flight.saturating_add(3) > s.limits.queued_ops {
            return Err(err(
                ErrorKind::Quota,
                format!(
                    "{} operations queued or running, your limit is {} (a split launch takes 3): sync first",
                    s.in_flight, s.limits.queued_ops
                ),
            ));
        }
        let token = self.split.next_token;
        self.split.next_token += 1;
        let marker = self.submit_op(client, l.stream, StreamOp::Sync, None, OpKind::SplitReached { token })?;
        let hold = match self.submit_op(client, l.stream, StreamOp::Hold, None, OpKind::SplitHold) {
            Ok(h) => h,
            Err(e) => {
                // The marker then starts nothing.
                if let Some(m) = self.ops.get_mut(&marker) {
                    m.kind = OpKind::Wait;
                }
                return Err(e);
            }
        };
        tracing::debug!("client {client}: `{name}` split over GPUs {gpus:?} as blocks {ranges:?}");
        self.split.pending.insert(
            token,
            PendingSplit {
                client,
                stream: l.stream,
                hold: Some(hold),
                kernel: name,
                launch: l.clone(),
                gpus,
                ranges,
                buffers,
                snapshots: HashMap::new(),
                region: None,
                own_stream: None,
                ranges_left: 0,
                back: Vec::new(),
                error: None,
                replicated: 0,
                reached: None,
                sending: Duration::ZERO,
                part_times: Vec::new(),
            },
        );
        Ok(())
    }

    /// Handles the split operations' ends that the last drain saw.
    pub(super) fn split_steps(&mut self) {
        while !self.split.todo.is_empty() {
            for step in std::mem::take(&mut self.split.todo) {
                match step {
                    Step::Reached { token, completed: true } => self.split_reached(token),
                    Step::Reached { token, completed: false } => {
                        self.split.pending.remove(&token);
                    }
                    Step::RangeEnded { client, completed, failed, .. } if client & PART_BIT != 0 => {
                        self.part_ended(client, completed, failed)
                    }
                    Step::RangeEnded { token, completed, failed, .. } => {
                        let why = failed.or_else(|| (!completed).then(|| "it was stopped".to_string()));
                        self.range_ended(token, 0, why.map(Err).unwrap_or(Ok(Vec::new())));
                    }
                }
            }
        }
    }

    /// The stream reached a split launch: its bytes go to the other GPUs,
    /// and its ranges start.
    fn split_reached(&mut self, token: u64) {
        let Some(p) = self.split.pending.get_mut(&token) else { return };
        let reached = Some(Instant::now());
        p.reached = reached;
        let client = p.client;
        let open = self.sessions.get(&client).is_some_and(|s| s.phase == Phase::Open);
        if !open {
            self.split.pending.remove(&token);
            return;
        }
        let mut whole: Option<String> = None;
        let mut buffers = std::mem::take(&mut p.buffers);
        for b in &mut buffers {
            match self.current_addr(client, b) {
                Ok(a) => b.addr = a,
                Err(why) => {
                    whole = Some(why);
                    break;
                }
            }
        }
        let Some(p) = self.split.pending.get_mut(&token) else { return };
        p.buffers = buffers;
        // Every byte the split moves has its place in one region shared by
        // the GPUs' devices: a buffer replicated whole once (every other GPU
        // writes it in from there, and the shadow merge compares with it),
        // each other GPU's slices of a write-only output, and each other
        // GPU's spans to send back. The devices copy straight between their
        // buffers and the region; the daemon copies none of it.
        let n = p.gpus.len();
        let runs = |g: usize| g > 0 && !p.ranges[g].is_empty();
        let mut end = 0u64;
        let mut place = |len: u64| {
            end += len;
            end - len
        };
        let mut whole_at: Vec<Option<u64>> = Vec::with_capacity(p.buffers.len());
        let mut replicas: Vec<Vec<Replica>> = Vec::with_capacity(p.buffers.len());
        let mut backs: Vec<Vec<Back>> = Vec::with_capacity(p.buffers.len());
        for b in &p.buffers {
            let mut rep: Vec<Replica> = vec![Vec::new(); n];
            let at = (b.replicate || !b.shadow.is_empty()).then(|| place(b.bytes));
            for g in (0..n).filter(|&g| runs(g)) {
                match at {
                    Some(at) => rep[g].push((0, at, b.bytes)),
                    None if b.slice_replica => {
                        // Its slices only: the rest of its copy never comes back.
                        for s in clip(&b.slices[g], b.bytes) {
                            rep[g].push((s.start, place(s.end - s.start), s.end - s.start));
                        }
                    }
                    None => {}
                }
            }
            let back: Vec<Back> = (0..n)
                .map(|g| {
                    if runs(g) {
                        clip(&b.back(g), b.bytes).map(|s| (s.clone(), place(s.end - s.start))).collect()
                    } else {
                        Vec::new()
                    }
                })
                .collect();
            whole_at.push(at);
            replicas.push(rep);
            backs.push(back);
        }
        let region = match self.split_region(end) {
            Ok(r) => Some(r),
            Err(why) => {
                whole.get_or_insert(why);
                None
            }
        };
        let Some(p) = self.split.pending.get_mut(&token) else { return };
        if let (None, Some(region)) = (&whole, &region) {
            // The bytes that leave: read once into the region.
            'read: for (i, b) in p.buffers.iter().enumerate() {
                let mut reads: Vec<(u64, u64, u64)> = Vec::new();
                if let Some(at) = whole_at[i] {
                    reads.push((0, at, b.bytes));
                } else {
                    reads.extend(replicas[i].iter().flatten().copied());
                }
                for (offset, at, len) in reads {
                    let r = self.backend.read_to_region(b.addr, offset, region, at, len);
                    let why = match r {
                        Some(Ok(())) => continue,
                        Some(Err(e)) => format!("buffer {}: {e}", b.id.0),
                        None => format!("{} has no read-back", self.backend.describe()),
                    };
                    whole = Some(why);
                    break 'read;
                }
            }
        }
        p.region = region;
        let mut own: Vec<Range<u32>> = vec![p.ranges[0].clone()];
        if let Some(why) = whole {
            // Nothing was sent: the home GPU runs every range.
            tracing::warn!("client {client}: `{}` runs whole on GPU {}: {why}", p.kernel, self.gpu);
            own = p.ranges.iter().filter(|r| !r.is_empty()).cloned().collect();
        } else {
            for (i, at) in whole_at.iter().enumerate() {
                if let (Some(at), false) = (at, p.buffers[i].shadow.is_empty()) {
                    p.snapshots.insert(i, *at);
                }
            }
            let Some(region) = p.region.clone() else { return };
            let (name, limits, priority, weight, module) = match self.sessions.get(&client) {
                Some(s) => {
                    let m = s.modules.values().find(|m| m.kernels.contains(&p.launch.kernel));
                    (
                        s.name.clone(),
                        s.limits.clone(),
                        s.priority,
                        s.weight,
                        m.map(|m| (m.name.clone(), m.source.clone(), m.options.clone())).unwrap_or_default(),
                    )
                }
                None => return,
            };
            for g in 1..p.gpus.len() {
                if p.ranges[g].is_empty() {
                    continue;
                }
                let gpu = p.gpus[g];
                let buffers: Vec<_> = p
                    .buffers
                    .iter()
                    .zip(replicas.iter().zip(&backs))
                    .map(|(b, (r, k))| PartBuffer { id: b.id, bytes: b.bytes, data: r[g].clone(), back: k[g].clone() })
                    .collect();
                let sent_bytes: u64 = buffers.iter().flat_map(|b| &b.data).map(|(_, _, len)| len).sum();
                let part = Part {
                    token,
                    home_gpu: self.gpu,
                    home: self.split.peers[self.gpu as usize].clone(),
                    index: g,
                    client,
                    name: name.clone(),
                    limits: limits.clone(),
                    priority,
                    weight,
                    module: module.clone(),
                    kernel: p.kernel.clone(),
                    launch: p.launch.clone(),
                    range: p.ranges[g].clone(),
                    buffers,
                    region: region.clone(),
                };
                let sent = self
                    .split
                    .peers
                    .get(gpu as usize)
                    .is_some_and(|tx| tx.send(CoreMsg::SplitPart(Box::new(part))).is_ok());
                if sent {
                    p.ranges_left += 1;
                    p.replicated += sent_bytes;
                } else {
                    tracing::warn!("client {client}: GPU {gpu} does not serve; GPU {} runs its blocks", self.gpu);
                    own.push(p.ranges[g].clone());
                }
            }
        }
        if let (Some(p), Some(t)) = (self.split.pending.get_mut(&token), reached) {
            p.sending = t.elapsed();
        }
        if let Err(e) = self.run_own_ranges(token, own) {
            self.own_ranges_failed(token, e.message);
        }
    }

    /// A region of at least `bytes` bytes for a split: the smallest kept one
    /// that holds them, or a new one (a power of two from 1 MiB, so that
    /// later splits of about the same size reuse it).
    fn split_region(&mut self, bytes: u64) -> Result<Arc<ShmRegion>, String> {
        if let Some(r) = self.split.pool.take(bytes) {
            return Ok(r);
        }
        let size = bytes.max(1 << 20).checked_next_power_of_two().and_then(|n| usize::try_from(n).ok());
        let size = size.ok_or_else(|| format!("a split region of {bytes} bytes"))?;
        crate::backend::pieces::staging_region(size).map_err(|e| e.to_string())
    }

    /// Releases the split regions kept unused for the pool's idle limit
    /// (the core's loop asks at every turn; `split_pool.rs`).
    pub(super) fn expire_split_regions(&mut self) {
        if self.split.pool.next_expiry().is_some_and(|at| at <= Instant::now()) {
            let gone = self.split.pool.expire(Instant::now());
            self.release_split_regions(gone, "unused for a while");
        }
    }

    /// Unregisters `gone` from this GPU's device and has every other core
    /// do the same (each registered a region when a part of its used it), so
    /// that its memory goes back to the host; logged.
    fn release_split_regions(&mut self, gone: Vec<Arc<ShmRegion>>, why: &str) {
        for r in gone {
            self.backend.unregister_host(&r);
            for (g, peer) in self.split.peers.iter().enumerate() {
                if g != self.gpu as usize {
                    let _ = peer.send(CoreMsg::SplitRegionGone(r.clone()));
                }
            }
            tracing::info!(
                "GPU {}: a split region of {} MiB released ({why}); {} kept, {} MiB",
                self.gpu,
                r.len() >> 20,
                self.split.pool.len(),
                self.split.pool.bytes() >> 20
            );
        }
    }

    /// `run_own_ranges` failed before it counted its ranges (no stream for
    /// them): the split fails, and finishes when the parts out have ended
    /// (`range_ended` would count one range too many off `ranges_left`).
    fn own_ranges_failed(&mut self, token: u64, why: String) {
        let Some(p) = self.split.pending.get_mut(&token) else { return };
        p.error.get_or_insert(format!("GPU {}: {why}", self.gpu));
        if p.ranges_left == 0 {
            self.split_finish(token);
        }
    }

    /// Runs `ranges` of split `token` on this GPU, on a stream of the client's
    /// made for the split (its own stream is held until the merge).
    fn run_own_ranges(&mut self, token: u64, ranges: Vec<Range<u32>>) -> Result<(), ErrorReply> {
        let Some(p) = self.split.pending.get(&token) else { return Ok(()) };
        let (client, mut launch, n) = (p.client, p.launch.clone(), ranges.len());
        // Its buffers by the addresses found when the stream reached it: one
        // the client freed since is still there (its device free waits for
        // the split, as for any launch of it), though no longer its handle.
        for a in &mut launch.args {
            if let Arg::Buffer(slice) = a {
                if let Some(b) = p.buffers.iter().find(|b| b.id == slice.buffer) {
                    *a = Arg::U64(b.addr + slice.offset);
                }
            }
        }
        let stream = match p.own_stream {
            Some(s) => s,
            None => self.split_stream(client)?,
        };
        if let Some(p) = self.split.pending.get_mut(&token) {
            p.own_stream = Some(stream);
            p.ranges_left += n;
        }
        for r in ranges {
            if let Err(e) = self.submit_range(client, stream, &launch, r, token) {
                // Counted above: this one will not end by itself.
                self.range_ended(token, 0, Err(e.message));
            }
        }
        Ok(())
    }

    /// A stream of `client`'s for a split's ranges, in the engine like its
    /// others: the client's weight is split over it too (`add_stream`).
    fn split_stream(&mut self, client: u64) -> Result<StreamId, ErrorReply> {
        // A part session's own process number, apart from the clients' (low numbers).
        let pid = if client & PART_BIT != 0 { u32::MAX - (client as u32 & 0xFFFF) } else { client as u32 };
        self.add_stream(client, pid, " (split)")
    }

    /// Submits blocks `range` of `launch` (with the whole launch's grid) on
    /// `stream` of `client` (a client's or a part session's).
    fn submit_range(
        &mut self,
        client: u64,
        stream: StreamId,
        launch: &gpumux_proto::Launch,
        range: Range<u32>,
        token: u64,
    ) -> Result<OpId, ErrorReply> {
        let s = self.session(client)?;
        let image = s
            .kernels
            .get(&launch.kernel)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("kernel {} is not here", launch.kernel.0)))?;
        let c = validate::launch(s, image, self.backend.info(), launch)?;
        let shape = KernelShape::new(range.len() as u64, c.threads, image.regs_per_thread).with_smem_per_block(c.smem);
        let desc = KernelDesc::new(image.name.clone(), shape)
            .with_idempotent(false)
            .with_sim_timing(SimTiming::new(c.block_time_ns));
        let work = OpWork::Kernel {
            code: image.code,
            grid: launch.grid,
            block: launch.block,
            shared_bytes: launch.shared_bytes,
            params: c.params,
            after: None,
            range: Some([u64::from(range.start), u64::from(range.end)]),
        };
        let op = StreamOp::Kernel { desc: Arc::new(desc), time_key: self.next_op };
        self.submit_op(client, stream, op, Some(work), OpKind::SplitRange { token })
    }

    /// A range of split `token` ended: on this GPU (`index` 0, no bytes) or
    /// another (its spans). The last one merges and releases the stream.
    fn range_ended(&mut self, token: u64, index: usize, result: Result<Spans, String>) {
        let Some(p) = self.split.pending.get_mut(&token) else { return };
        match result {
            Ok(spans) => p.back.extend(spans.into_iter().map(|(b, r, d)| (index, b, r, d))),
            Err(why) => {
                let gpu = p.gpus.get(index).copied().unwrap_or(self.gpu);
                p.error.get_or_insert(format!("GPU {gpu}: {why}"));
            }
        }
        p.ranges_left = p.ranges_left.saturating_sub(1);
        if p.ranges_left == 0 {
            self.split_finish(token);
        }
    }

    /// Every range ended: merge, then let the stream go on.
    fn split_finish(&mut self, token: u64) {
        let Some(mut p) = self.split.pending.remove(&token) else { return };
        let client = p.client;
        let merged_at = Instant::now();
        let mut taken = 0u64;
        let mut back_bytes = 0u64;
        if p.error.is_none() {
            if let Err(why) = self.merge_home(&mut p, &mut taken, &mut back_bytes) {
                p.error = Some(format!("the merge on GPU {}: {why}", self.gpu));
            }
        }
        // Every part has ended (or never started): no device copies through
        // the region any more.
        if let Some(r) = p.region.take() {
            let gone = self.split.pool.give_back(r, Instant::now());
            self.release_split_regions(gone, "past the pool's bound");
        }
        // The split's own stream closes as a client's does (its ranges have
        // all ended, so nothing is pending on it), and the client's weight
        // goes back to its other streams.
        let own_error = p.own_stream.and_then(|st| {
            let e = self.sessions.get_mut(&client)?.streams.get_mut(&st).and_then(|x| {
                x.closing = true;
                x.error.take()
            });
            self.close_stream_if_idle(client, st);
            e
        });
        let error = p
            .error
            .clone()
            .map(|e| ErrorReply::new(ErrorKind::Device, format!("split launch of `{}`: {e}", p.kernel)))
            .or(own_error);
        if let Some(s) = self.sessions.get_mut(&client) {
            if let (Some(e), Some(st)) = (error, s.streams.get_mut(&p.stream)) {
                st.error.get_or_insert(e);
            }
        }
        let ms = |t: Option<Instant>| t.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1e3);
        tracing::info!(
            "client {client}: `{}` split over GPUs {:?} as blocks {:?}: {} bytes replicated, {} back, {} merged; \
             {:.2} ms from the stream reaching it: read back and sent {:.2} ms ({}), the merge {:.2} ms{}",
            p.kernel,
            p.gpus,
            p.ranges,
            p.replicated,
            back_bytes,
            taken,
            ms(p.reached),
            p.sending.as_secs_f64() * 1e3,
            p.part_times.join("; "),
            merged_at.elapsed().as_secs_f64() * 1e3,
            p.error.as_ref().map(|e| format!(" (failed: {e})")).unwrap_or_default()
        );
        if let (Some(hold), Some(slot)) =
            (p.hold, self.sessions.get(&client).and_then(|s| s.streams.get(&p.stream)).map(|st| st.slot))
        {
            if let Err(e) = self.engine.release(self.backend.now(), slot, hold) {
                tracing::error!("client {client}: releasing a split launch's hold: {e}");
            }
        }
    }

    /// Puts what the other GPUs wrote into the home copies, writing only
    /// what changes there: declared slices as they came, and for a shadow
    /// merge the runs of words that differ from the snapshot (or, where
    /// they are many, the span read back, merged on the host and written
    /// whole).
    fn merge_home(&mut self, p: &mut PendingSplit, taken: &mut u64, back_bytes: &mut u64) -> Result<(), String> {
        let Some(region) = p.region.clone() else { return Ok(()) };
        let bytes =
            |at: u64, len: u64| crate::backend::pieces::region_bytes(&region, at, len).map_err(|e| e.to_string());
        for (i, b) in p.buffers.iter().enumerate() {
            let from: Vec<_> = p.back.iter().filter(|(_, bi, _, _)| *bi == i).collect();
            if from.is_empty() {
                continue;
            }
            let addr = self.current_addr(p.client, b)?;
            let b = &SplitBuffer { addr, ..b.clone() };
            let snapshot = p.snapshots.get(&i);
            for (_, _, span, at) in from {
                let len = span.end - span.start;
                *back_bytes += len;
                if span.end > b.bytes {
                    return Err(format!("buffer {}: span {span:?} of {} bytes", b.id.0, b.bytes));
                }
                let shadow = b.shadow.iter().any(|s| s.start <= span.start && span.end <= s.end);
                let backend = self.backend.as_mut();
                let write = |backend: &mut dyn Backend, offset: u64, at: u64, len: u64| match backend
                    .write_from_region(addr, offset, &region, at, len)
                {
                    Some(r) => r.map_err(|e| e.to_string()),
                    None => Err(format!("{} has no write-in", backend.describe())),
                };
                match (shadow, snapshot) {
                    (true, Some(&snap_at)) => {
                        let (snap, data) = (bytes(snap_at + span.start, len)?, bytes(*at, len)?);
                        let runs = changed_runs(snap, data);
                        if runs.len() <= MAX_RUNS {
                            for r in runs {
                                write(backend, span.start + r.start as u64, at + r.start as u64, r.len() as u64)?;
                                *taken += r.len() as u64;
                            }
                        } else {
                            let mut home = read_span(backend, b, span.clone())?;
                            *taken += merge_shadow(&mut home, snap, data);
                            write_span(backend, addr, span.start, &home)?;
                        }
                    }
                    _ => {
                        write(backend, span.start, *at, len)?;
                        *taken += len;
                    }
                }
            }
        }
        Ok(())
    }

    /// Where buffer `b` of `client` is now: moved by the daemon since the
    /// launch was checked perhaps (evicted and restored, `core/swap.rs`);
    /// freed by the client since, its device free waits for the split, so
    /// the address it had still holds it. Evicted now: an error.
    fn current_addr(&self, client: u64, b: &SplitBuffer) -> Result<DevAddr, String> {
        match self.sessions.get(&client).and_then(|s| s.buffers.get(&b.id)) {
            Some(x) if x.evicted => Err(format!("buffer {} is in host memory (evicted)", b.id.0)),
            Some(x) => Ok(x.addr),
            None => Ok(b.addr),
        }
    }

    /// Another GPU's range arrived from its core.
    pub(super) fn part_done(&mut self, d: PartDone) {
        let Some(p) = self.split.pending.get_mut(&d.token) else { return };
        p.part_times.push(d.times);
        if let (false, Err(why)) = (d.ran, &d.result) {
            // A GPU that could not take its part (no memory for the
            // buffers, a module that does not load there): its blocks run
            // here, on the split's stream, and the launch still completes.
            let (gpu, range) = (p.gpus[d.index], p.ranges[d.index].clone());
            tracing::warn!(
                "client {}: GPU {gpu} could not run blocks {range:?} of `{}` ({why}); GPU {} runs them",
                p.client,
                p.kernel,
                self.gpu
            );
            let token = d.token;
            if let Err(e) = self.run_own_ranges(token, vec![range]) {
                self.own_ranges_failed(token, e.message);
            }
            self.range_ended(token, d.index, Ok(Vec::new()));
            return;
        }
        self.range_ended(d.token, d.index, d.result);
    }

    /// Runs a part of another core's split (module doc).
    pub(super) fn run_part(&mut self, part: Part) {
        let key = PART_BIT | (u64::from(part.home_gpu) << 40) | part.token;
        let (token, index, home) = (part.token, part.index, part.home.clone());
        if let Err(why) = self.start_part(key, part) {
            let done = PartDone { token, index, result: Err(why), ran: false, times: String::new() };
            let _ = home.send(CoreMsg::SplitDone(Box::new(done)));
            self.end_part_session(key);
        }
    }

    fn start_part(&mut self, key: u64, part: Part) -> Result<(), String> {
        let began = Instant::now();
        let (out, _) = std::sync::mpsc::channel();
        let mut s = Session::new(key, Peer { pid: 0, uid: 0, gid: 0 }, part.limits.clone(), out);
        s.out = None;
        s.phase = Phase::Open;
        // Its blocks run at the client's priority and weight, as at home.
        (s.priority, s.weight) = (part.priority, part.weight);
        s.name = format!("{}#{} (split from GPU {})", part.name, part.client, part.home_gpu);
        self.sessions.insert(key, s);
        let (mname, source, options) = &part.module;
        let image = self.backend.load_module(mname, source, options).map_err(|e| format!("loading `{mname}`: {e}"))?;
        let codes: Vec<_> = image.kernels.iter().map(|k| k.code).collect();
        let Some(k) = image.kernels.iter().find(|k| k.name == part.kernel).cloned() else {
            self.backend.unload_module(&codes);
            return Err(format!("module `{mname}` has no kernel `{}`", part.kernel));
        };
        // The other kernels of the module: unloaded with the session.
        let mut back = Vec::new();
        {
            let Some(s) = self.sessions.get_mut(&key) else { return Err("the part's session is gone".into()) };
            let mut handles = Vec::new();
            for (j, img) in image.kernels.into_iter().enumerate() {
                let id = if img.name == k.name { part.launch.kernel } else { KernelId(u64::MAX - j as u64) };
                handles.push(id);
                s.kernels.insert(id, img);
            }
            s.modules.insert(
                ModuleId(1),
                LoadedModule { name: mname.clone(), source: String::new(), options: Vec::new(), kernels: handles },
            );
        }
        for (i, PartBuffer { id, bytes, data, back: spans }) in part.buffers.iter().enumerate() {
            let addr = self.backend.alloc(*bytes).map_err(|e| format!("buffer {} of {bytes} bytes: {e}", id.0))?;
            if let Some(s) = self.sessions.get_mut(&key) {
                s.buffers.insert(*id, Buffer { addr, bytes: *bytes, evicted: false, zeros: false });
                s.memory_used += bytes;
            }
            for &(offset, at, len) in data {
                match self.backend.write_from_region(addr, offset, &part.region, at, len) {
                    Some(r) => r.map_err(|e| format!("writing buffer {} in: {e}", id.0))?,
                    None => return Err(format!("{} has no write-in", self.backend.describe())),
                }
            }
            if !spans.is_empty() {
                back.push((i, *id, spans.clone()));
            }
        }
        let stream = self.split_stream(key).map_err(|e| e.message)?;
        self.submit_range(key, stream, &part.launch, part.range.clone(), part.token).map_err(|e| e.message)?;
        let (setup, queued) = (began.elapsed(), Instant::now());
        let running = RunningPart {
            token: part.token,
            home: part.home,
            index: part.index,
            back,
            region: part.region,
            setup,
            queued,
        };
        self.split.parts.insert(key, running);
        Ok(())
    }

    /// A part's range ended here: its spans go home, its session goes.
    fn part_ended(&mut self, key: u64, completed: bool, failed: Option<String>) {
        let Some(rp) = self.split.parts.remove(&key) else { return };
        let ran = rp.queued.elapsed();
        let reading = Instant::now();
        let result = match (completed, failed) {
            (_, Some(why)) => Err(why),
            (false, None) => Err("it was stopped".to_string()),
            (true, None) => self.read_part(key, &rp.back, &rp.region),
        };
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let times = format!(
            "GPU {}: set up {:.2} ms, its range {:.2} ms, read back {:.2} ms",
            self.gpu,
            ms(rp.setup),
            ms(ran),
            ms(reading.elapsed())
        );
        // A home gone (its client left, its core stopped) wants nothing.
        let done = PartDone { token: rp.token, index: rp.index, result, ran: true, times };
        let _ = rp.home.send(CoreMsg::SplitDone(Box::new(done)));
        self.end_part_session(key);
    }

    /// Copies the spans the merge takes (a GPU's declared slices, not its
    /// whole copy; its whole copy for a shadow merge) into the split's region.
    fn read_part(
        &mut self,
        key: u64,
        back: &[(usize, BufferId, Back)],
        region: &Arc<ShmRegion>,
    ) -> Result<Spans, String> {
        let mut out = Vec::new();
        for (i, id, spans) in back {
            let b = self
                .sessions
                .get(&key)
                .and_then(|s| s.buffers.get(id))
                .copied()
                .ok_or("a buffer of the part is gone")?;
            for (span, at) in spans {
                match self.backend.read_to_region(b.addr, span.start, region, *at, span.end - span.start) {
                    Some(r) => r.map_err(|e| format!("reading buffer {} back: {e}", id.0))?,
                    None => return Err(format!("{} has no read-back", self.backend.describe())),
                }
                out.push((*i, span.clone(), *at));
            }
        }
        Ok(out)
    }

    /// A part session leaves like a client: its streams out of the engine,
    /// its memory and module freed once nothing of it runs.
    fn end_part_session(&mut self, key: u64) {
        self.split.parts.remove(&key);
        self.disconnect(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use gpumux_proto::{BufferSlice, Launch, ServerFrame};
    use std::sync::mpsc::{channel, Receiver};

    const SCALE: &str = "__global__ void scale(float* x, unsigned n) {\n  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) x[i] *= 2.0f;\n}\n";
    /// Writes its output without reading it.
    const FILL: &str = "__global__ void fill(float* x, unsigned n) {\n  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) x[i] = 2.0f * i;\n}\n";
    const HIST: &str = "__global__ void hist(const unsigned* v, unsigned* h, unsigned n) {\n  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n  if (i < n) atomicAdd(&h[v[i] % 64], 1u);\n}\n";
    /// 256 blocks of 64 threads over 64 KiB of floats.
    const BLOCKS: u32 = 256;
    const BYTES: u64 = BLOCKS as u64 * 64 * 4;

    /// Two cores on simulated H100s that know each other, as `daemon.rs` makes them.
    fn two_cores() -> (Core, Receiver<CoreMsg>, Core, Receiver<CoreMsg>) {
        let (tx0, rx0) = channel();
        let (tx1, rx1) = channel();
        let core = |gpu: u32| {
            let mut c = Core::new(Box::new(SimBackend::with_info(gpumux_sim::presets::h100())), None)
                .expect("a core on sim:h100")
                .with_peers(vec![tx0.clone(), tx1.clone()], vec![132, 132]);
            c.gpu = gpu;
            c
        };
        (core(0), rx0, core(1), rx1)
    }

    fn request(core: &mut Core, client: u64, id: u64, request: Request) {
        core.inbound(client, Inbound::Request { id, request, fd: None });
    }

    /// Pumps `core` until `f` finds what it waits for in `frames`.
    fn until<T>(core: &mut Core, frames: &Receiver<ServerFrame>, mut f: impl FnMut(&ServerFrame) -> Option<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(Instant::now() < deadline, "timed out");
            core.pump().expect("pump");
            if let Some(t) = frames.try_iter().find_map(|fr| f(&fr)) {
                return t;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Pumps `core` until a message arrives on `rx`.
    fn until_msg(core: &mut Core, rx: &Receiver<CoreMsg>) -> CoreMsg {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(Instant::now() < deadline, "no message between cores");
            core.pump().expect("pump");
            if let Ok(m) = rx.try_recv() {
                return m;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Client 1 on `core`: a buffer holding `data`, `source`'s kernels loaded.
    fn client(core: &mut Core, source: &str, data: &[u8]) -> (Receiver<ServerFrame>, BufferId, Vec<KernelId>) {
        let (tx, frames) = channel();
        core.connect(1, Peer { pid: 1, uid: 1000, gid: 1000 }, ClientLimits::default(), tx);
        let hello = Request::hello("t", 0);
        request(core, 1, 1, hello);
        request(core, 1, 2, Request::Alloc { bytes: data.len() as u64 });
        let module = Request::LoadModule { name: "m.cu".into(), source: source.into(), options: vec![] };
        request(core, 1, 3, module);
        let kernels = until(core, &frames, |f| match f {
            ServerFrame::Reply { id: 3, result: Ok(Reply::Module { kernels, .. }) } => {
                Some(kernels.iter().map(|k| k.kernel).collect::<Vec<_>>())
            }
            _ => None,
        });
        let (&buffer, b) = core.sessions[&1].buffers.iter().next().expect("the buffer");
        let addr = b.addr;
        core.backend.write_in(addr, data).expect("sim writes in").expect("written");
        (frames, buffer, kernels)
    }

    fn scale_launch(kernel: KernelId, buffer: BufferId) -> Launch {
        Launch {
            kernel,
            grid: [BLOCKS, 1, 1],
            block: [64, 1, 1],
            shared_bytes: 0,
            args: vec![Arg::Buffer(BufferSlice { buffer, offset: 0 }), Arg::U32(BLOCKS * 64)],
            stream: StreamId(0),
            block_time_ns: Some(20_000_000),
        }
    }

    fn checked() -> Split {
        Split { splittable: Splittable::IfChecked, gpus: 0, merges: Vec::new() }
    }

    /// `len` bytes of a part's region from `at`.
    fn in_region(part: &Part, at: u64, len: u64) -> Vec<u8> {
        crate::backend::pieces::region_bytes(&part.region, at, len).expect("in the region").to_vec()
    }

    /// The spans a part sends back of its first buffer.
    fn back_spans(part: &Part) -> Vec<Range<u64>> {
        part.buffers[0].back.iter().map(|(r, _)| r.clone()).collect()
    }

    fn bytes_of(core: &mut Core, client: u64, buffer: BufferId) -> Vec<u8> {
        let b = core.sessions[&client].buffers[&buffer];
        core.backend.read_back(b.addr, b.bytes).expect("sim reads back").expect("read")
    }

    fn synced(id: u64) -> impl FnMut(&ServerFrame) -> Option<Result<Reply, ErrorReply>> {
        move |f| match f {
            ServerFrame::Reply { id: i, result } if *i == id => Some(result.clone()),
            _ => None,
        }
    }

    /// The whole path on two simulated GPUs: the part sent to GPU 1 with the
    /// replicated bytes and blocks 128..256; what each GPU "wrote" (set
    /// through the device's bytes, since the simulator computes nothing)
    /// merged at home; a sync behind the launch answered only after the
    /// merge; nothing of the part left on GPU 1.
    #[test]
    fn a_split_launch_replicates_runs_a_range_on_each_gpu_and_merges_both_gpus_writes_in_stream_order() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let data: Vec<u8> = (0..BYTES as u32).map(|i| (i * 31 % 251) as u8).collect();
        let (frames, buffer, k) = client(&mut home, SCALE, &data);
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        request(&mut home, 1, 11, Request::SyncStream(StreamId(0)));
        let CoreMsg::SplitPart(part) = until_msg(&mut home, &rx1) else { panic!("not a part") };
        assert_eq!(part.range, 128..256, "equal GPUs, equal halves");
        assert_eq!(part.buffers.len(), 1);
        let [(0, at, BYTES)] = part.buffers[0].data[..] else { panic!("not replicated whole: {:?}", part.buffers[0]) };
        assert!(in_region(&part, at, BYTES) == data, "the buffer is replicated as it was");
        assert_eq!(back_spans(&part), vec![0..BYTES], "a shadow merge brings the whole buffer back");
        // The home GPU's blocks write the first half, GPU 1's the second.
        let half = (BYTES / 2) as usize;
        let b = home.sessions[&1].buffers[&buffer];
        let mut mine = data.clone();
        mine[..half].iter_mut().for_each(|x| *x = x.wrapping_add(1));
        home.backend.write_in(b.addr, &mine).expect("sim").expect("written");
        other.handle(CoreMsg::SplitPart(part));
        let key = *other.split.parts.keys().next().expect("the part runs on GPU 1");
        let theirs_addr = other.sessions[&key].buffers[&buffer].addr;
        let mut theirs = data.clone();
        theirs[half..].iter_mut().for_each(|x| *x = x.wrapping_add(2));
        other.backend.write_in(theirs_addr, &theirs).expect("sim").expect("written");
        // The sync waits for GPU 1's range and the merge.
        let done = until_msg(&mut other, &rx0);
        assert!(frames.try_iter().all(|f| !matches!(f, ServerFrame::Reply { id: 11, .. })), "synced before the merge");
        assert!(matches!(&done, CoreMsg::SplitDone(d) if d.result.is_ok()), "{done:?}");
        home.handle(done);
        assert_eq!(until(&mut home, &frames, synced(11)), Ok(Reply::Done));
        let merged = bytes_of(&mut home, 1, buffer);
        assert!(merged[..half] == mine[..half], "the home GPU's writes stay");
        assert!(merged[half..] == theirs[half..], "GPU 1's writes are merged in");
        // GPU 1 gave everything back.
        for _ in 0..50 {
            other.pump().expect("pump");
        }
        assert_eq!(other.sessions(), 0, "the part's session is gone");
        assert_eq!(other.status().memory_used, 0);
        assert_eq!(other.backend.kernels_loaded(), 0, "the part's module is unloaded");
        assert_eq!(home.sessions[&1].streams.len(), 1, "the split's own stream is gone");
    }

    /// Splits one after another reuse one pooled region; once it has been
    /// unused for the pool's idle limit (here none) the home core releases
    /// it and tells the other core, which unregisters it too, and nothing
    /// holds its memory any more (it used to be kept for ever, and each
    /// other GPU's device kept it registered).
    #[test]
    fn pooled_split_regions_are_reused_then_released_on_every_gpu() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        home.split.pool = super::super::split_pool::RegionPool::new(Duration::ZERO, 1 << 30);
        let data: Vec<u8> = (0..BYTES as u32).map(|i| i as u8).collect();
        let (frames, buffer, k) = client(&mut home, SCALE, &data);
        let mut regions: Vec<std::sync::Weak<ShmRegion>> = Vec::new();
        for id in [10, 20, 30] {
            request(&mut home, 1, id, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
            request(&mut home, 1, id + 1, Request::SyncStream(StreamId(0)));
            let CoreMsg::SplitPart(part) = until_msg(&mut home, &rx1) else { panic!("not a part") };
            regions.push(Arc::downgrade(&part.region));
            other.handle(CoreMsg::SplitPart(part));
            let done = until_msg(&mut other, &rx0);
            home.handle(done);
            assert_eq!(until(&mut home, &frames, synced(id + 1)), Ok(Reply::Done));
        }
        assert!(regions.iter().all(|r| r.ptr_eq(&regions[0])), "one region for splits one after another");
        assert_eq!(home.split.pool.len(), 1);
        home.expire_split_regions();
        assert_eq!(home.split.pool.len(), 0, "released once unused");
        let gone = rx1.try_iter().find_map(|m| match m {
            CoreMsg::SplitRegionGone(r) => Some(r),
            _ => None,
        });
        let r = gone.expect("GPU 1 was told");
        assert!(Arc::as_ptr(&r) == regions[0].as_ptr(), "the region released is the split's");
        other.handle(CoreMsg::SplitRegionGone(r));
        assert!(regions[0].upgrade().is_none(), "nothing holds the region's memory any more");
    }

    /// The client's weight summed over its streams, in the engine.
    fn weight_of(core: &Core, client: u64) -> f64 {
        core.sessions[&client].streams.values().map(|st| core.engine.process(st.slot).expect("live").weight).sum()
    }

    /// The split's own stream shares the client's weight with its others
    /// (it does not add a stream's worth to it), and gives it back when it goes.
    #[test]
    fn a_split_keeps_the_clients_weight_over_its_streams() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let (frames, buffer, k) = client(&mut home, SCALE, &vec![1u8; BYTES as usize]);
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        let part = until_msg(&mut home, &rx1);
        assert_eq!(home.sessions[&1].streams.len(), 2, "the split's own stream runs");
        assert!((weight_of(&home, 1) - 1.0).abs() < 1e-9, "weight {} while the split runs", weight_of(&home, 1));
        other.handle(part);
        let done = until_msg(&mut other, &rx0);
        home.handle(done);
        request(&mut home, 1, 11, Request::SyncStream(StreamId(0)));
        assert_eq!(until(&mut home, &frames, synced(11)), Ok(Reply::Done));
        assert_eq!(home.sessions[&1].streams.len(), 1, "the split's own stream is gone");
        assert!((weight_of(&home, 1) - 1.0).abs() < 1e-9, "weight {} after the split", weight_of(&home, 1));
    }

    /// An urgent, heavy client's blocks on GPU 1 run at its priority and
    /// weight there, not at a new session's 0 and 1.
    #[test]
    fn a_part_runs_at_the_clients_priority_and_weight() {
        let (mut home, _rx0, mut other, rx1) = two_cores();
        let (_frames, buffer, k) = client(&mut home, SCALE, &vec![1u8; BYTES as usize]);
        let s = home.sessions.get_mut(&1).expect("client 1");
        (s.priority, s.weight) = (5, 3.0);
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        let part = until_msg(&mut home, &rx1);
        other.handle(part);
        let key = *other.split.parts.keys().next().expect("the part runs on GPU 1");
        let s = &other.sessions[&key];
        assert_eq!((s.priority, s.weight), (5, 3.0));
        let st = s.streams.values().next().expect("the part's stream");
        let info = other.engine.process(st.slot).expect("live");
        assert_eq!((info.priority, info.weight), (5, 3.0), "in the engine too");
    }

    /// No stream for the home GPU's range: the split fails, but only once
    /// GPU 1's part, still out, has ended (the range never counted is not
    /// counted off).
    #[test]
    fn a_split_whose_own_range_cannot_start_waits_for_the_part_out() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let (frames, buffer, k) = client(&mut home, SCALE, &vec![1u8; BYTES as usize]);
        home.sessions.get_mut(&1).expect("client 1").next_stream = u32::MAX;
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        request(&mut home, 1, 11, Request::SyncStream(StreamId(0)));
        let part = until_msg(&mut home, &rx1);
        assert_eq!(home.split.pending.len(), 1, "the split waits for GPU 1's part");
        assert!(frames.try_iter().all(|f| !matches!(f, ServerFrame::Reply { id: 11, .. })), "synced before the part");
        other.handle(part);
        let done = until_msg(&mut other, &rx0);
        home.handle(done);
        let r = until(&mut home, &frames, synced(11));
        assert!(r.as_ref().is_err_and(|e| e.message.contains("no stream ids left")), "{r:?}");
        assert!(home.split.pending.is_empty());
    }

    /// Declared slices: GPU 1 sends back only its blocks' bytes, copied in as they are.
    #[test]
    fn declared_slices_bring_back_only_each_gpus_bytes() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let data = vec![5u8; BYTES as usize];
        let (frames, buffer, k) = client(&mut home, SCALE, &data);
        let slices = SplitMerge::Slices { granule_blocks: 1, bytes_per_granule: 256, offset: 0 };
        let split = Split { splittable: Splittable::IfChecked, gpus: 2, merges: vec![(0, slices)] };
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split });
        let CoreMsg::SplitPart(part) = until_msg(&mut home, &rx1) else { panic!("not a part") };
        assert_eq!(back_spans(&part), vec![128 * 256..BYTES], "blocks 128.. write bytes 32768..");
        other.handle(CoreMsg::SplitPart(part));
        let key = *other.split.parts.keys().next().expect("the part runs");
        let addr = other.sessions[&key].buffers[&buffer].addr;
        let theirs: Vec<u8> = (0..BYTES).map(|i| if i >= 128 * 256 { 9 } else { 7 }).collect();
        other.backend.write_in(addr, &theirs).expect("sim").expect("written");
        let done = until_msg(&mut other, &rx0);
        home.handle(done);
        request(&mut home, 1, 11, Request::SyncStream(StreamId(0)));
        assert_eq!(until(&mut home, &frames, synced(11)), Ok(Reply::Done));
        let merged = bytes_of(&mut home, 1, buffer);
        assert!(merged[..128 * 256].iter().all(|&b| b == 5), "outside GPU 1's slices nothing came back");
        assert!(merged[128 * 256..].iter().all(|&b| b == 9), "GPU 1's slices came back");
    }

    /// A kernel that only writes its output (`fill`), merged by declared
    /// slices: GPU 1 gets only its slices' bytes (not the whole buffer),
    /// sends back only them, and the home copy ends as one GPU would leave
    /// it: the home GPU's writes, GPU 1's, and bytes of GPU 1's slice it
    /// left alone as they were.
    #[test]
    fn a_write_only_output_with_declared_slices_sends_only_gpu_1s_slices_both_ways() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let data: Vec<u8> = (0..BYTES as u32).map(|i| (i * 31 % 251) as u8).collect();
        let (frames, buffer, k) = client(&mut home, FILL, &data);
        let slices = SplitMerge::Slices { granule_blocks: 1, bytes_per_granule: 256, offset: 0 };
        let split = Split { splittable: Splittable::IfChecked, gpus: 2, merges: vec![(0, slices)] };
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split });
        let CoreMsg::SplitPart(part) = until_msg(&mut home, &rx1) else { panic!("not a part") };
        let half = 128 * 256;
        let [(offset, at, len)] = part.buffers[0].data[..] else { panic!("{:?}", part.buffers[0]) };
        assert_eq!((offset, len), (half, BYTES - half), "only GPU 1's slices are replicated");
        assert!(in_region(&part, at, len) == data[half as usize..]);
        // The home GPU writes its half; GPU 1 all of its half but its last 16 bytes.
        let b = home.sessions[&1].buffers[&buffer];
        let mut mine = data.clone();
        mine[..half as usize].fill(1);
        home.backend.write_in(b.addr, &mine).expect("sim").expect("written");
        other.handle(CoreMsg::SplitPart(part));
        let key = *other.split.parts.keys().next().expect("the part runs");
        let addr = other.sessions[&key].buffers[&buffer].addr;
        let theirs: Vec<u8> = (0..BYTES as usize - half as usize - 16).map(|_| 9).collect();
        other.backend.write_span(addr, half, &theirs).expect("sim").expect("written");
        let done = until_msg(&mut other, &rx0);
        match &done {
            CoreMsg::SplitDone(d) => {
                let spans: Vec<_> = d.result.as_ref().expect("ran").iter().map(|(_, r, _)| r.clone()).collect();
                assert_eq!(spans, vec![half..BYTES], "only the slices come back");
            }
            other => panic!("{other:?}"),
        }
        home.handle(done);
        request(&mut home, 1, 11, Request::SyncStream(StreamId(0)));
        assert_eq!(until(&mut home, &frames, synced(11)), Ok(Reply::Done));
        let merged = bytes_of(&mut home, 1, buffer);
        let mut want = mine.clone();
        want[half as usize..BYTES as usize - 16].fill(9);
        assert!(merged == want, "home's half, GPU 1's writes, and the 16 bytes it left as they were");
    }

    /// A shadow merge of a write-only output still replicates it whole (the
    /// merge finds GPU 1's writes by comparing its copy with the pre-launch
    /// contents), and a copy whose changed words are many short runs is
    /// merged right (read back, merged on the host, written whole).
    #[test]
    fn a_shadow_merge_of_many_short_runs_is_bitwise_what_one_gpu_leaves() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let data: Vec<u8> = (0..BYTES as u32).map(|i| (i * 17 % 253) as u8).collect();
        let (frames, buffer, k) = client(&mut home, FILL, &data);
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        let CoreMsg::SplitPart(part) = until_msg(&mut home, &rx1) else { panic!("not a part") };
        let sent: Vec<(u64, u64)> = part.buffers[0].data.iter().map(|&(o, _, len)| (o, len)).collect();
        assert_eq!(sent, vec![(0, BYTES)], "replicated whole for the shadow merge");
        let half = (BYTES / 2) as usize;
        let b = home.sessions[&1].buffers[&buffer];
        let mut mine = data.clone();
        mine[..half].iter_mut().for_each(|x| *x = x.wrapping_add(3));
        home.backend.write_in(b.addr, &mine).expect("sim").expect("written");
        other.handle(CoreMsg::SplitPart(part));
        let key = *other.split.parts.keys().next().expect("the part runs");
        let addr = other.sessions[&key].buffers[&buffer].addr;
        // GPU 1 changes every other word of its half: thousands of runs.
        let mut theirs = data.clone();
        for w in (half..BYTES as usize).step_by(8) {
            theirs[w] = theirs[w].wrapping_add(1);
        }
        other.backend.write_in(addr, &theirs).expect("sim").expect("written");
        assert!(changed_runs(&data, &theirs).len() > MAX_RUNS);
        home.handle(until_msg(&mut other, &rx0));
        request(&mut home, 1, 11, Request::SyncStream(StreamId(0)));
        assert_eq!(until(&mut home, &frames, synced(11)), Ok(Reply::Done));
        let mut want = mine.clone();
        want[half..].copy_from_slice(&theirs[half..]);
        assert!(bytes_of(&mut home, 1, buffer) == want);
    }

    #[test]
    fn a_kernel_with_global_atomics_is_refused_with_its_reasons_unless_declared() {
        let (mut home, _rx0, _other, _rx1) = two_cores();
        let (frames, buffer, k) = client(&mut home, HIST, &[0u8; 1024]);
        let mut l = scale_launch(k[0], buffer);
        l.args = vec![
            Arg::Buffer(BufferSlice { buffer, offset: 0 }),
            Arg::Buffer(BufferSlice { buffer, offset: 512 }),
            Arg::U32(128),
        ];
        request(&mut home, 1, 10, Request::SplitKernel { kernel: k[0], split: Some(checked()) });
        let r = until(&mut home, &frames, synced(10));
        let e = r.expect_err("refused");
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(
            e.message.contains("kernel `hist` is not split: line 3: atomicAdd on global memory (`h`)"),
            "{}",
            e.message
        );
        request(&mut home, 1, 11, Request::LaunchSplit { launch: l.clone(), split: checked() });
        let r = until(&mut home, &frames, synced(11));
        assert!(r.as_ref().is_err_and(|e| e.message.contains("atomicAdd")), "{r:?}");
        let declared = Split { splittable: Splittable::Declared, gpus: 0, merges: Vec::new() };
        request(&mut home, 1, 12, Request::SplitKernel { kernel: k[0], split: Some(declared) });
        assert_eq!(until(&mut home, &frames, synced(12)), Ok(Reply::Done));
    }

    /// A client that leaves while GPU 1 runs its part: the part ends, its
    /// answer finds no one, and neither GPU keeps anything of it.
    #[test]
    fn a_client_gone_mid_split_leaves_nothing_on_either_gpu() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let (_frames, buffer, k) = client(&mut home, SCALE, &vec![1u8; BYTES as usize]);
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        let part = until_msg(&mut home, &rx1);
        other.handle(part);
        home.disconnect(1);
        let done = until_msg(&mut other, &rx0);
        home.handle(done);
        for _ in 0..200 {
            home.pump().expect("pump");
            other.pump().expect("pump");
            if home.sessions() == 0 && other.sessions() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!((home.sessions(), other.sessions()), (0, 0));
        assert_eq!((home.status().memory_used, other.status().memory_used), (0, 0));
        assert!(home.split.pending.is_empty() && other.split.parts.is_empty());
    }

    /// A buffer freed while its split runs: its device memory waits for the
    /// split (as for any launch of it), the merge writes into it, and it is
    /// freed after; nothing is left on either GPU.
    #[test]
    fn a_buffer_freed_during_its_split_is_freed_after_the_merge() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let (frames, buffer, k) = client(&mut home, SCALE, &vec![2u8; BYTES as usize]);
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        request(&mut home, 1, 11, Request::Free(buffer));
        assert_eq!(until(&mut home, &frames, synced(11)), Ok(Reply::Done));
        let part = until_msg(&mut home, &rx1);
        other.handle(part);
        let done = until_msg(&mut other, &rx0);
        assert!(matches!(&done, CoreMsg::SplitDone(d) if d.result.is_ok()), "{done:?}");
        home.handle(done);
        request(&mut home, 1, 12, Request::SyncStream(StreamId(0)));
        assert_eq!(until(&mut home, &frames, synced(12)), Ok(Reply::Done), "no error from the merge");
        for _ in 0..50 {
            home.pump().expect("pump");
            other.pump().expect("pump");
        }
        assert_eq!((home.status().memory_used, other.status().memory_used), (0, 0));
    }

    /// GPU 1 without the memory for the buffers: its part fails in its
    /// set-up, the home GPU runs those blocks too, and the launch completes
    /// without an error.
    #[test]
    fn a_gpu_that_cannot_take_its_part_leaves_its_blocks_to_the_home_gpu() {
        let (tx0, rx0) = channel();
        let (tx1, rx1) = channel();
        let peers = vec![tx0, tx1];
        let mut small = gpumux_sim::presets::h100();
        small.mem_bytes = 4096;
        let mut home = Core::new(Box::new(SimBackend::with_info(gpumux_sim::presets::h100())), None)
            .expect("a core")
            .with_peers(peers.clone(), vec![132, 132]);
        let mut other =
            Core::new(Box::new(SimBackend::with_info(small)), None).expect("a core").with_peers(peers, vec![132, 132]);
        other.gpu = 1;
        let (frames, buffer, k) = client(&mut home, SCALE, &vec![4u8; BYTES as usize]);
        request(&mut home, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        let part = until_msg(&mut home, &rx1);
        other.handle(part);
        let done = until_msg(&mut other, &rx0);
        assert!(matches!(&done, CoreMsg::SplitDone(d) if !d.ran && d.result.is_err()), "{done:?}");
        home.handle(done);
        request(&mut home, 1, 11, Request::SyncStream(StreamId(0)));
        assert_eq!(until(&mut home, &frames, synced(11)), Ok(Reply::Done), "the home GPU ran GPU 1's blocks");
        assert_eq!(bytes_of(&mut home, 1, buffer), vec![4u8; BYTES as usize]);
        assert_eq!(home.sessions[&1].streams.len(), 1, "one split stream, gone");
        assert_eq!((other.sessions(), other.status().memory_used), (0, 0));
    }

    /// `SplitKernel`: a plain `Launch` of the kernel is split from then on,
    /// and runs whole again after `SplitKernel` with `None`.
    #[test]
    fn a_kernel_split_once_has_its_plain_launches_split() {
        let (mut home, rx0, mut other, rx1) = two_cores();
        let (frames, buffer, k) = client(&mut home, SCALE, &vec![6u8; BYTES as usize]);
        request(&mut home, 1, 10, Request::SplitKernel { kernel: k[0], split: Some(checked()) });
        assert_eq!(until(&mut home, &frames, synced(10)), Ok(Reply::Done));
        request(&mut home, 1, 11, Request::Launch(scale_launch(k[0], buffer)));
        let CoreMsg::SplitPart(part) = until_msg(&mut home, &rx1) else { panic!("not a part") };
        assert_eq!(part.range, 128..256);
        other.handle(CoreMsg::SplitPart(part));
        let done = until_msg(&mut other, &rx0);
        home.handle(done);
        request(&mut home, 1, 12, Request::SplitKernel { kernel: k[0], split: None });
        request(&mut home, 1, 13, Request::Launch(scale_launch(k[0], buffer)));
        request(&mut home, 1, 14, Request::SyncStream(StreamId(0)));
        assert_eq!(until(&mut home, &frames, synced(14)), Ok(Reply::Done));
        assert!(rx1.try_recv().is_err(), "the second launch ran whole");
        assert_eq!(home.sessions[&1].counters.kernels_done, 1, "one whole launch (split ranges are not counted)");
    }

    /// One GPU: the launch runs whole, and the stream goes on.
    #[test]
    fn a_daemon_of_one_gpu_runs_a_split_launch_whole() {
        let mut core = Core::new(Box::new(SimBackend::with_info(gpumux_sim::presets::h100())), None).expect("a core");
        let (frames, buffer, k) = client(&mut core, SCALE, &vec![3u8; BYTES as usize]);
        request(&mut core, 1, 10, Request::LaunchSplit { launch: scale_launch(k[0], buffer), split: checked() });
        request(&mut core, 1, 11, Request::SyncStream(StreamId(0)));
        assert_eq!(until(&mut core, &frames, synced(11)), Ok(Reply::Done));
        assert!(core.split.pending.is_empty(), "nothing was split");
        assert_eq!(core.sessions[&1].counters.kernels_done, 1, "one whole launch ran");
    }

    #[test]
    fn the_shadow_merge_takes_every_word_the_other_gpu_changed_and_nothing_else() {
        let snapshot: Vec<u8> = (0..64u8).collect();
        // Home wrote words 0..4; the other GPU wrote words 8..12, once with the old value.
        let mut home = snapshot.clone();
        home[..16].fill(0xAA);
        let mut other = snapshot.clone();
        other[32..48].fill(0xBB);
        other[44..48].copy_from_slice(&snapshot[44..48]);
        let taken = merge_shadow(&mut home, &snapshot, &other);
        assert_eq!(taken, 12, "three words changed on the other GPU");
        assert!(home[..16].iter().all(|&b| b == 0xAA), "home's own writes stay");
        assert!(home[32..44].iter().all(|&b| b == 0xBB), "the other GPU's writes arrive");
        assert_eq!(&home[16..32], &snapshot[16..32]);
        assert_eq!(&home[44..], &snapshot[44..], "a word written with its old value is still right");
    }

    /// The runs are exactly the words the shadow merge takes: writing them
    /// into the home copy gives the merge's bytes.
    #[test]
    fn changed_runs_write_what_the_shadow_merge_takes() {
        let snapshot: Vec<u8> = (0..203u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut other = snapshot.clone();
        for w in [0usize, 1, 2, 9, 20, 21, 50] {
            other[4 * w] ^= 0x5A;
        }
        other[202] ^= 1; // in the trailing part word
        let mut home = snapshot.clone();
        home[100..120].fill(0xEE); // the home GPU's own writes, untouched by the other's
        let mut merged = home.clone();
        let taken = merge_shadow(&mut merged, &snapshot, &other);
        let runs = changed_runs(&snapshot, &other);
        assert_eq!(runs, vec![0..12, 36..40, 80..88, 200..203], "adjacent words joined, the part word by its bytes");
        // A run across the blocks compared whole is one run.
        let big = vec![0u8; 3 * 4096 + 6];
        let mut changed = big.clone();
        changed[4000..4200].fill(1);
        changed[3 * 4096 + 5] = 1;
        assert_eq!(changed_runs(&big, &changed), vec![4000..4200, 3 * 4096 + 4..3 * 4096 + 6]);
        for r in &runs {
            home[r.clone()].copy_from_slice(&other[r.clone()]);
        }
        assert_eq!(home, merged);
        assert_eq!(taken, runs.iter().map(|r| r.len() as u64).sum::<u64>());
    }

    #[test]
    fn a_trailing_part_word_is_merged_by_its_bytes() {
        let snapshot = vec![0u8; 6];
        let mut home = snapshot.clone();
        let other = vec![0, 0, 0, 0, 0, 7];
        assert_eq!(merge_shadow(&mut home, &snapshot, &other), 2);
        assert_eq!(home, other);
    }
}

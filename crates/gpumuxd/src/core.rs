//! The core: one thread owns the engine, the backend and every client's
//! state. Requests come in over a channel ([`CoreMsg`]); replies go out to
//! each client's writer thread; the core never blocks on a socket.
//!
//! [`Core`] itself does no I/O and reads no channel: [`Core::connect`],
//! [`Core::inbound`], [`Core::disconnect`] and [`Core::pump`] are what
//! [`Core::run`] calls and what the tests and the fuzz target call directly.
//! Replies follow the engine's completions in the order the engine reports
//! them, so the core is as deterministic as the device under it.
//!
//! Here: the core's state, its loop and client connections. Beside it:
//! `requests.rs` (each request checked, carried out and answered),
//! `host.rs` (host regions: a client's memory the device copies from directly),
//! `device.rs` (commands out, events in, completions back, the stage log)
//! and `recovery.rs` (a device failure: a lost context rebuilt and every
//! client put back).

use crate::backend::{
    Backend, DevAddr, Failure, HostSpan, LoadError, Loaded, MemError, MemInfo, ModuleImage, OpFailed, OpWork,
    Registered, Wake,
};
use crate::config::ClientLimits;
use crate::conn::Inbound;
use crate::latency::{KernelStamps, SUMMARY_AFTER};
use crate::load::LoadClock;
use crate::session::{Buffer, EventState, LoadedModule, Peer, Phase, Session, Stream};
use crate::shm::ShmRegion;
use crate::spin::{ConnSpin, URGENT_WINDOW};
use crate::validate::{self, err};
use gpumux_engine::device::{Command, CopyDirection, Event};
use gpumux_engine::ids::{CopyId, LaunchId, OpId, ProcessId};
use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::policies;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use gpumux_engine::{Engine, EngineError, OpOutcome, ProcessInfo, StreamOp};
use gpumux_proto::{
    BufferId, ClientStatus, ErrorKind, ErrorReply, EventId, KernelEntry, KernelId, LostWork, ModuleId, Notice, Reply,
    Request, ServerFrame, Status, StreamId, Welcome, MAGIC, MAX_NAME_BYTES, MAX_OPTIONS, MAX_SOURCE_BYTES, VERSION,
};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod beside;
mod cadence;
mod copy_2d;
mod device;
pub mod handover;
mod host;
pub(crate) mod id_map;
mod inbox;
mod load_parts;
mod poll_hold;
mod pump_requests;
mod record;
mod recovery;
mod requests;
mod round_clock;
mod slow_waits;
pub mod split;
mod split_pool;
mod stream_order;
mod swap;

use load_parts::{count_call, CallTimes, LOAD_EXCHANGES, LOAD_MESSAGES, LOAD_PARTS};
pub use record::RecordError;

/// The policy when none is named: preemptive priority queues between
/// priority levels, the SMs split evenly among the clients of one level
/// (`ppq-even`), freeing SMs by draining. Clients ask for priorities, so the
/// policy must honour them and preempt; clients of one level run side by
/// side instead of taking turns kernel by kernel (co-run STP, issue 14);
/// draining is the one mechanism both devices have (a real GPU cannot save
/// a block's context in software). docs/daemon-measured.md, "The default policy".
pub const DEFAULT_POLICY: &str = "ppq-even-drain";

/// How long the core sleeps at most with nothing to do (it wakes on any request anyway).
const IDLE_WAIT: Duration = Duration::from_secs(1);
/// A `Spin` device is polled this often while work is on it, by default
/// (`gpumuxd --poll-us`): a launch's end is seen on average half of this
/// after it happened, plus the poll (a read of host memory on a CUDA device;
/// a round trip of a few µs to a device process).
pub const SPIN_WAIT: Duration = Duration::from_micros(5);
/// While the device is busy, or for this long after the last request, the
/// core polls its channel without sleeping: a request then reaches the
/// engine within a µs instead of a futex wake-up later (several µs, tens at
/// the tail). One core is busy while clients are active, none when idle.
const SPIN_AFTER_ACTIVITY: Duration = Duration::from_micros(500);
/// A turn of the core's loop (requests handled, then the device pumped) longer
/// than this is logged (info) with where its time went: requests wait for it.
const SLOW_ROUND: Duration = Duration::from_micros(500);
/// How long the core handles queued messages before it looks at the device
/// again (the rest wait in the inbox, in turn): one client's flood of
/// requests may delay the device's news by about this much, not by the
/// flood's length.
const ROUND_MESSAGES: Duration = Duration::from_micros(300);

/// What one [`Core::pump`] did.
#[derive(Debug, Default)]
pub struct PumpStats {
    /// Command/event exchanges with the device.
    pub rounds: u32,
    /// Events the device reported.
    pub events: u32,
    /// Commands sent to the device.
    pub commands: u32,
    /// The longest single poll or submit.
    pub slowest_call: Duration,
    /// Time in the engine (its commands, with the policy's turns, and events).
    pub engine: Duration,
    /// Time in the device's `submit` of retreats.
    pub retreat_calls: Duration,
    /// Time in the device's `submit` of launches.
    pub launch_calls: Duration,
    /// Time in the device's `poll` (waiting for its answer; requests
    /// handled meanwhile not included).
    pub poll_calls: Duration,
    /// Client requests handled while a poll's answer was on its way.
    pub requests: u32,
    /// Of `engine`: on the device's events, and giving commands.
    pub events_engine: Duration,
    /// See `events_engine`.
    pub commands_engine: Duration,
    /// Time completing operations (replies, counters).
    pub completions: Duration,
    /// Launch commands answered in the turn that made them (ends known ahead).
    pub answered_in_turn: u32,
    /// Client requests taken between rounds and turns (of `requests`).
    pub requests_between: u32,
}

/// Rounds of command/event exchange in one pump before the core lets requests in.
const MAX_ROUNDS: usize = 10_000;

/// Why the core stopped.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// The engine failed (a policy or engine bug).
    #[error("the scheduling engine failed")]
    Engine(#[from] EngineError),
    /// No such policy.
    #[error(transparent)]
    Policy(#[from] policies::PolicyError),
    /// The device failed in a way the daemon cannot recover from.
    #[error("the device failed")]
    Device(#[source] gpumux_engine::DeviceError),
    /// A context could not be rebuilt after a fault.
    #[error("the device context could not be rebuilt after a fault")]
    Rebuild(#[source] MemError),
}

/// What the server tells the core.
#[derive(Debug)]
pub enum CoreMsg {
    /// A peer was admitted.
    Connected {
        /// Its number.
        client: u64,
        /// Its credentials.
        peer: Peer,
        /// Its limits.
        limits: ClientLimits,
        /// Its writer's channel.
        out: Sender<ServerFrame>,
        /// Its reader's and writer's poll window (set urgent by its priority).
        spin: ConnSpin,
        /// Its way out shared with the writer (rings written directly); `None`: the channel only.
        outbox: Option<std::sync::Arc<crate::outbox::Outbox>>,
    },
    /// A request or a broken rule from a client.
    Inbound {
        /// Whose.
        client: u64,
        /// What.
        inbound: Inbound,
        /// When its reader thread decoded it (how long it waits for the core is logged past `SLOW_ROUND`).
        read_at: Instant,
    },
    /// A client's socket closed.
    Disconnected {
        /// Whose.
        client: u64,
    },
    /// The daemon asks for this GPU's part of `Status` (several GPUs:
    /// `gpus.rs` merges every core's).
    Status {
        /// Where the part goes.
        reply: Sender<Status>,
    },
    /// Several GPUs, `--rebalance`: hand `client` over to another core if it
    /// is idle and its buffers fit in `room` bytes (`core/handover.rs`).
    /// Queued behind the client's own messages, so none is overtaken.
    HandOver {
        /// Whose.
        client: u64,
        /// The other GPU's free memory.
        room: u64,
        /// The client's state, or why it stays.
        reply: Sender<Result<handover::Handover, handover::NotNow>>,
    },
    /// A client another core handed over: this core serves it from now on.
    Adopt(Box<handover::Handover>),
    /// A block range of another core's split launch, to run here (`core/split.rs`).
    SplitPart(Box<split::Part>),
    /// A range this core's split launch sent to another core ended there.
    SplitDone(Box<split::PartDone>),
    /// A region of another core's splits left its pool: this GPU's device
    /// unregisters it too, if a part of one registered it (`core/split_pool.rs`).
    SplitRegionGone(Arc<ShmRegion>),
    /// SIGINT/SIGTERM: tell every client and stop.
    Shutdown,
}

/// What an engine operation is to the core.
#[derive(Debug)]
enum OpKind {
    /// A kernel; its description is the engine's (shared: its name was
    /// copied a second time per launch for this, issue 35's callgrind).
    Kernel {
        desc: Arc<gpumux_engine::kernel::KernelDesc>,
    },
    /// A copy or memset; `reply` is the request to answer when it is done.
    Copy {
        reply: Option<u64>,
    },
    Sync {
        reply: u64,
    },
    Event(EventId),
    /// A stream's wait for another's event (`StreamWaitEvent`).
    Wait,
    /// The marker before a host function (`HostFunc`): `reply` is answered
    /// when it completes, with the token of `hold`, the stream's hold until
    /// the client's `EndHostFunc` (core/stream_order.rs).
    HostFunc {
        reply: u64,
        hold: Option<OpId>,
    },
    /// A host function's hold.
    Hold,
    /// A restore's gate: the stream's work behind it waits for its
    /// client's evicted buffers (`core/swap.rs`).
    Gate,
    /// A split launch's marker: the stream reached it (`core/split.rs`).
    SplitReached {
        token: u64,
    },
    /// A split launch's hold on its stream, released after the merge.
    SplitHold,
    /// One block range of a split launch, on this GPU.
    SplitRange {
        token: u64,
    },
}

#[derive(Debug)]
struct OpEntry {
    client: u64,
    stream: StreamId,
    kind: OpKind,
    /// The engine reported its end.
    ended: bool,
    /// The device ended it without doing its work, and why (`OpFailed`).
    failed: Option<String>,
    /// Device launches of it not yet ended.
    launches: u32,
    /// A device copy of it not yet done.
    copying: bool,
    /// When it was queued, first launched (and on how many SMs), and how
    /// many launches it took: logged for a slow urgent kernel ([`SLOW_URGENT`]).
    queued: Nanos,
    first_launch: Option<(Nanos, u32)>,
    launched: u32,
    /// Its client's priority when it was queued.
    priority: i32,
    /// When it went through each stage (a kernel's; see `latency`).
    stamps: KernelStamps,
}

impl OpEntry {
    /// An operation just queued at `now` for `client`'s `stream`, its request
    /// having waited `waited` ns for the core: not launched, not ended.
    fn queued(client: u64, stream: StreamId, kind: OpKind, priority: i32, now: Nanos, waited: Nanos) -> OpEntry {
        OpEntry {
            client,
            stream,
            kind,
            ended: false,
            failed: None,
            launches: 0,
            copying: false,
            queued: now,
            first_launch: None,
            launched: 0,
            priority,
            stamps: KernelStamps { waited, queued: now, ..KernelStamps::default() },
        }
    }
}

/// A kernel of a stream of priority above 0 that takes longer than this from
/// its request to its end is logged (info) with its timeline: how long it
/// waited for its first launch, and how long it then ran. Urgent kernels are
/// short, so this says where a priority tail comes from without tracing
/// every operation.
const SLOW_URGENT: Nanos = 1_000_000;

/// Something to release once operations are off the device.
#[derive(Debug)]
enum Release {
    Buffer(DevAddr),
    Region(Arc<ShmRegion>),
    /// A detached host region (`AttachHost`).
    Host(Arc<ShmRegion>),
}

#[derive(Debug)]
struct Deferred {
    waiting_for: Vec<OpId>,
    release: Release,
}

/// The core's state (module doc).
pub struct Core {
    backend: Box<dyn Backend>,
    engine: Engine,
    policy: String,
    sessions: BTreeMap<u64, Session>,
    ops: id_map::IdMap<OpId, OpEntry>,
    /// The inbox's [`inbox::FairInbox::changes`] when a pump last found no
    /// message in it to take (`Core::next_for_pump`): unchanged since, the
    /// inbox has none still, and the scan is skipped.
    pump_missed_inbox_at: Option<u64>,
    launches: id_map::IdMap<LaunchId, (OpId, SmSet)>,
    copies: id_map::IdMap<CopyId, OpId>,
    deferred: Vec<Deferred>,
    /// The id the engine gives the next submitted operation (it counts
    /// successful submits from 0), used as the kernel's `time_key`.
    next_op: u64,
    started: Instant,
    rebuilds: u32,
    events: Vec<Event>,
    /// How long the request being handled waited between its reader thread
    /// and the core, ns (0 outside `handle`): a kernel's `wait` stage.
    request_waited: Nanos,
    /// How often a busy device is polled ([`SPIN_WAIT`] unless set).
    poll_every: Duration,
    /// A client of priority above 0 is connected (`update_urgent`).
    urgent_connected: bool,
    /// The clients' cadence windows, as far as the core polls for them ([`cadence`]).
    cadence: cadence::CoreCadence,
    /// The window the device process was last asked to poll for (`sync_device_spin`).
    device_spin: Duration,
    /// The engine's and the device calls' time since `serve` last took it
    /// (a cell: frames to clients are sent through `&self`).
    calls: Cell<CallTimes>,
    /// Where the device rounds' time goes ([`round_clock`]).
    round_clock: round_clock::RoundClock,
    /// Requests that waited long for the core, logged once a second.
    slow_waits: slow_waits::SlowWaits,
    /// Messages taken from the readers' channel and not handled yet, one
    /// queue per client, served in turn ([`inbox`]): those of a busy round
    /// past [`ROUND_MESSAGES`], and those a poll's wait could not handle
    /// (`Core::while_polling`).
    inbox: inbox::FairInbox,
    /// `Backend::take_failed`'s buffer, kept to spare an allocation per poll.
    failed_scratch: Vec<OpFailed>,
    /// Module loads under way (`Backend::start_load`), by token.
    loads: HashMap<u64, PendingLoad>,
    /// Regions being pinned (`Backend::start_register`), by token.
    pins: HashMap<u64, PendingPin>,
    /// The next pin's token.
    next_pin: u64,
    /// The next load's token.
    next_load: u64,
    /// `gpumuxd --record`: what the clients did, for `gpumux replay` (`record.rs`).
    record: record::Recorder,
    /// Oversubscription: evicted bytes, the host limit, restores under way.
    swap: swap::Swap,
    /// This GPU's index among the daemon's (0 with one GPU).
    gpu: u32,
    /// Where this core publishes its load for placement (several GPUs), and when it last did.
    board: Option<(Arc<crate::gpus::GpuBoard>, Instant)>,
    /// Split launches under way, and parts of other GPUs' (`core/split.rs`).
    split: split::Splits,
}

/// A core publishes its load for placement at most this often: a client
/// placed on a view this old is placed as well as on a fresh one.
const PUBLISH_EVERY: Duration = Duration::from_millis(1);

/// Module loads one client may have compiling at once: each holds its source
/// (up to 4 MiB) until its compile ends, and a client that sent thousands
/// without waiting would queue them all ahead of everyone's (the compile
/// threads take them in order). The client library waits for each.
const MAX_LOADS_UNDER_WAY: usize = 8;
/// Regions one client may have being pinned at once (the same reasoning:
/// each holds a mapping, and pins are made one at a time).
const MAX_PINS_UNDER_WAY: usize = 4;

/// What a region being pinned is for.
#[derive(Clone, Copy, Debug)]
enum PinFor {
    /// The client's shared (staging) region (`AttachShm`).
    Shared,
    /// A host region of `bytes` (`AttachHost`), counted against its limit already.
    Host { bytes: u64 },
}

/// A client's `AttachShm` or `AttachHost` whose region is being pinned.
struct PendingPin {
    client: u64,
    /// The request's id, answered when the region is pinned.
    id: u64,
    region: Arc<ShmRegion>,
    what: PinFor,
    since: Instant,
}

/// A client's `LoadModule` whose module is compiling.
struct PendingLoad {
    client: u64,
    /// The request's id, answered when the module is loaded.
    id: u64,
    name: String,
    source: String,
    options: Vec<String>,
    since: Instant,
}

/// Round trips a client keeps memory it got, by default (core/swap.rs, "Kept").
pub use swap::KEEP_FACTOR as DEFAULT_SWAP_KEEP;

/// Host memory evicted buffers may take by default: half of the host's
/// physical memory (the rest is the system's and the clients'), or 16 GiB
/// where the system does not say.
pub fn default_swap_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    match (u64::try_from(pages), u64::try_from(size)) {
        (Ok(p), Ok(s)) if p > 0 && s > 0 => p.saturating_mul(s) / 2,
        _ => 16 << 30,
    }
}

fn new_engine(backend: &dyn Backend, policy: &str) -> Result<Engine, CoreError> {
    // On a device that frees a retreat's SMs in the command, an urgent
    // kernel's launch goes out in the same turn as the retreat that makes
    // room for it: one exchange with the device on its path instead of two.
    let engine = Engine::new(backend.info().clone(), policies::by_name(policy)?)?;
    Ok(engine.with_retreats_freeing_at_once(backend.frees_retreats_at_once()))
}

/// The next message within `limit`, polling without sleeping ([`SPIN_AFTER_ACTIVITY`]).
fn spin_recv(rx: &Receiver<CoreMsg>, limit: Duration) -> Result<CoreMsg, RecvTimeoutError> {
    let start = Instant::now();
    let mut looks = 0u32;
    loop {
        match rx.try_recv() {
            Ok(m) => return Ok(m),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) if start.elapsed() >= limit => return Err(RecvTimeoutError::Timeout),
            Err(TryRecvError::Empty) => gpumux_ring::relax(looks),
        }
        looks = looks.saturating_add(1);
    }
}

impl Core {
    /// A core serving `backend` with `policy` ([`DEFAULT_POLICY`] if `None`).
    pub fn new(backend: Box<dyn Backend>, policy: Option<&str>) -> Result<Core, CoreError> {
        let name = policy.unwrap_or(DEFAULT_POLICY);
        let engine = new_engine(backend.as_ref(), name)?;
        Ok(Core {
            policy: engine.policy_name(),
            backend,
            engine,
            sessions: BTreeMap::new(),
            ops: Default::default(),
            pump_missed_inbox_at: None,
            launches: Default::default(),
            copies: Default::default(),
            deferred: Vec::new(),
            next_op: 0,
            started: Instant::now(),
            rebuilds: 0,
            events: Vec::new(),
            request_waited: 0,
            poll_every: SPIN_WAIT,
            urgent_connected: false,
            cadence: cadence::CoreCadence::default(),
            device_spin: Duration::ZERO,
            calls: Cell::new(CallTimes::default()),
            round_clock: round_clock::RoundClock::default(),
            slow_waits: slow_waits::SlowWaits::default(),
            inbox: inbox::FairInbox::default(),
            failed_scratch: Vec::new(),
            loads: HashMap::new(),
            next_load: 0,
            pins: HashMap::new(),
            next_pin: 0,
            record: record::Recorder::off(),
            swap: swap::Swap::new(default_swap_memory()),
            gpu: 0,
            board: None,
            split: split::Splits::default(),
        })
    }

    /// Records what the clients do to `path` (appended; `gpumuxd --record`,
    /// format: [`crate::recording`]).
    pub fn with_recording(mut self, path: &std::path::Path) -> Result<Core, RecordError> {
        let (device, policy) = (self.backend.describe(), self.policy.clone());
        let sms = self.backend.info().num_sms as u32;
        self.record = record::Recorder::to_file(path, device, policy, sms, self.backend.now())?;
        Ok(self)
    }

    /// Lets evicted buffers take at most `bytes` of host memory in all
    /// (`swap_memory`; 0: no buffer is ever evicted).
    pub fn with_swap_memory(mut self, bytes: u64) -> Core {
        self.swap.limit = bytes;
        self
    }

    /// Oversubscription on (the default) or off (`gpumuxd --oversubscribe
    /// off`; core/swap.rs, "Off"): off, no buffer is ever born evicted or
    /// evicted, an allocation the device refuses is refused with its
    /// numbers, and no restore gate or move is looked for per request.
    pub fn with_oversubscribe(mut self, on: bool) -> Core {
        self.swap.on = on;
        self
    }

    /// A client that got its memory keeps it for `factor` round trips of it
    /// over the host link (core/swap.rs, "Kept"; default [`DEFAULT_SWAP_KEEP`]).
    pub fn with_swap_keep(mut self, factor: f64) -> Core {
        self.swap.keep_factor = factor.max(0.0);
        self
    }

    /// Polls a busy device every `every` instead of [`SPIN_WAIT`] (at least 1 µs).
    pub fn with_poll_interval(mut self, every: Duration) -> Core {
        self.poll_every = every.max(Duration::from_micros(1));
        self
    }

    /// The policy's name.
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// The device in words.
    pub fn device(&self) -> String {
        self.backend.describe()
    }

    /// Clients the core holds, gone ones whose work is still on the device included.
    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// This core serves GPU `gpu` of several, and publishes its load on `board`.
    pub fn with_gpu(mut self, gpu: u32, board: Arc<crate::gpus::GpuBoard>) -> Core {
        self.gpu = gpu;
        self.board = Some((board, Instant::now()));
        self
    }

    /// Publishes the load placement reads, at most every [`PUBLISH_EVERY`].
    fn publish_load(&mut self, now: Instant) {
        if let Some((board, last)) = &mut self.board {
            if now.saturating_duration_since(*last) >= PUBLISH_EVERY {
                *last = now;
                let memory: u64 =
                    self.sessions.values().map(|s| s.buffers.values().map(|b| b.bytes).sum::<u64>()).sum();
                board.publish(self.ops.len(), memory);
            }
        }
    }

    /// Serves messages until [`CoreMsg::Shutdown`] or every sender is gone.
    pub fn run(mut self, rx: Receiver<CoreMsg>) -> Result<(), CoreError> {
        let mut load = LoadClock::new(&LOAD_PARTS);
        let result = self.serve(rx, &mut load);
        if let Some(line) = self.slow_waits.due(Instant::now(), true) {
            tracing::info!("{line}");
        }
        if let Some(load) = load.summary() {
            // With several GPUs, whose core (one line each at the end).
            let whose = if self.board.is_some() { format!("GPU {} core", self.gpu) } else { "core".to_string() };
            tracing::info!("{whose}: {load}");
            if let Some(rounds) = self.round_clock.summary() {
                tracing::info!("{whose} rounds: {rounds}");
            }
        }
        result
    }

    /// [`Core::run`]'s loop; `load` counts where its time goes.
    fn serve(&mut self, rx: Receiver<CoreMsg>, load: &mut LoadClock) -> Result<(), CoreError> {
        let mut active = Instant::now();
        loop {
            self.record.tick();
            // One clock read for the looks before the wait (the load board,
            // the timers, the cadence, the activity window), four before: a
            // read is a vDSO call, ~20-25 ns and more in a VM, and the core
            // turns once or more per launch (issue 35).
            let top = Instant::now();
            self.publish_load(top);
            self.expire_split_regions();
            let wait = self.wait_at(top);
            let cadence = self.cadence.awake(top);
            self.sync_device_spin(cadence);
            let spin = wait <= self.poll_every
                || cadence
                || top.saturating_duration_since(active)
                    < crate::spin::window_for(SPIN_AFTER_ACTIVITY, self.urgent_connected);
            let got = match self.inbox.pop() {
                Some(msg) => Ok(msg),
                None if spin => spin_recv(&rx, wait.min(self.poll_every)),
                None => rx.recv_timeout(wait),
            };
            // A full sleep that ended pumps whatever the device says: that is
            // how a device process that died while idle is noticed (at least
            // once a second, `IDLE_WAIT`).
            let slept = !spin && matches!(got, Err(RecvTimeoutError::Timeout));
            let busy_from = Instant::now();
            let mut handled = 0u32;
            // The last clock read of the messages' handling, its end: the
            // round's check below is the handling's time and the slow waits'
            // look (a read each before).
            let mut handled_to = busy_from;
            match got {
                Ok(msg) => {
                    active = busy_from;
                    handled += 1;
                    if !self.handle(msg) {
                        self.shutdown();
                        return Ok(());
                    }
                    // Take what is queued, one message per client in turn,
                    // for at most ROUND_MESSAGES before the device gets a look.
                    loop {
                        while let Ok(msg) = rx.try_recv() {
                            self.inbox.push(msg);
                        }
                        handled_to = Instant::now();
                        if handled_to.saturating_duration_since(busy_from) >= ROUND_MESSAGES {
                            break;
                        }
                        let Some(msg) = self.inbox.pop() else { break };
                        handled += 1;
                        if !self.handle(msg) {
                            self.shutdown();
                            return Ok(());
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.shutdown();
                    return Ok(());
                }
            }
            let handling = handled_to.saturating_duration_since(busy_from);
            if handled > 0 || slept {
                if let Some(line) = self.slow_waits.due(handled_to, slept) {
                    tracing::info!("{line}");
                }
            }
            let in_handling = self.calls.take();
            if handled > 0 {
                in_handling.add_to(load, LOAD_MESSAGES, u64::from(handled), handling);
            }
            // A request may have made work; else the device is pumped only
            // when it asked to be (busy, or a timer due). Pumping an idle
            // device process costs a round trip on its link that requests
            // would wait behind, every few µs while the core spins.
            if handled == 0 && !slept && !self.device_due(handled_to) {
                continue;
            }
            let pump = self.pump_with(Some(&rx))?;
            let busy = busy_from.elapsed();
            // A pump that brought nothing (a poll and no news) is the core
            // waiting; the pumps counted include their polls' round trips.
            let in_pump = self.calls.take();
            if pump.events + pump.commands + pump.requests > 0 {
                in_pump.add_to(load, LOAD_EXCHANGES, u64::from(pump.rounds), busy - handling);
            }
            if let Some(lap) = load.lap() {
                tracing::debug!(target: "gpumuxd::load", "core: {lap}");
                if let Some(rounds) = self.round_clock.lap() {
                    tracing::debug!(target: "gpumuxd::load", "core rounds: {rounds}");
                }
                if let Some(link) = self.backend.exchange_lap() {
                    tracing::debug!(target: "gpumuxd::load", "core's device link: {link}");
                }
            }
            if busy > SLOW_ROUND {
                // A slow request says so itself (`inbound`): this line is news
                // (info) when the device exchange was the slow part.
                let line = format!(
                    "core busy {:.0} µs without reading requests: {handled} message(s) in {:.0} µs, then {} \
                     device round(s) in {:.0} µs ({} event(s), {} command(s); slowest device call {:.0} µs)",
                    busy.as_secs_f64() * 1e6,
                    handling.as_secs_f64() * 1e6,
                    pump.rounds,
                    (busy - handling).as_secs_f64() * 1e6,
                    pump.events,
                    pump.commands,
                    pump.slowest_call.as_secs_f64() * 1e6
                );
                if busy - handling > SLOW_ROUND {
                    tracing::info!("{line}");
                } else {
                    tracing::debug!("{line}");
                }
            }
        }
    }

    /// Takes one message; false for shutdown.
    pub fn handle(&mut self, msg: CoreMsg) -> bool {
        match msg {
            CoreMsg::Connected { client, peer, limits, out, spin, outbox } => {
                self.connect(client, peer, limits, out);
                if let Some(s) = self.sessions.get_mut(&client) {
                    s.spin = spin;
                    s.outbox = outbox;
                }
            }
            CoreMsg::Inbound { client, inbound, read_at } => {
                // One clock read for the wait and the start of the request's
                // turn (two before: issue 35's callgrind, ~20 reads a launch).
                let start = Instant::now();
                let waited = start.saturating_duration_since(read_at);
                if waited > SLOW_ROUND {
                    self.slow_waits.note(client, waited, start);
                }
                let what = match &inbound {
                    Inbound::Request { request, .. } => request.name(),
                    Inbound::Violation(_) => "a violation",
                    Inbound::Answered { .. } => "an answer",
                    Inbound::Refused { .. } => "a refused request",
                };
                // The session looked up once for both (issue 35's callgrind).
                if let Some(s) = self.sessions.get(&client) {
                    // Off the connection's backlog (its `outstanding` limit; `outbox`).
                    if let Some(outbox) = &s.outbox {
                        outbox.took_request(inbound.cost());
                    }
                    if let Inbound::Request { .. } = &inbound {
                        self.cadence.on_request(s.spin.cadence_window(), start);
                    }
                }
                self.request_waited = waited.as_nanos() as Nanos;
                self.inbound(client, inbound);
                self.request_waited = 0;
                let took = start.elapsed();
                if took > SLOW_ROUND {
                    tracing::info!(
                        "client {client}'s {what} took the core {:.0} µs (requests wait meanwhile)",
                        took.as_secs_f64() * 1e6
                    );
                }
            }
            CoreMsg::Disconnected { client } => self.disconnect(client),
            CoreMsg::Status { reply } => {
                let _ = reply.send(self.status());
            }
            CoreMsg::HandOver { client, room, reply } => {
                let _ = reply.send(self.hand_over(client, room));
            }
            CoreMsg::Adopt(h) => self.adopt(*h),
            CoreMsg::SplitPart(p) => self.run_part(*p),
            CoreMsg::SplitDone(d) => self.part_done(*d),
            CoreMsg::SplitRegionGone(r) => self.backend.unregister_host(&r),
            CoreMsg::Shutdown => return false,
        }
        true
    }

    /// Whether the device or the engine needs a look now, `at` a clock read just made.
    fn device_due(&self, at: Instant) -> bool {
        let device = match self.backend.next_wake() {
            Wake::Idle => false,
            Wake::After(d) => d.is_zero(),
            Wake::Spin => true,
        };
        // Commands the engine owes the device (a pump that ended at
        // MAX_ROUNDS leaves them): the device may be idle waiting for them.
        let now = self.backend.now_at(at);
        device
            || self.engine.has_commands_due()
            || self.engine.poll_timeout().is_some_and(|at| at <= now)
            || self.swap_due().is_some_and(|at| at <= now)
            || self.swap_look_due()
    }

    /// How long to sleep before the device or the engine needs a look.
    pub fn wait(&self) -> Duration {
        self.wait_at(Instant::now())
    }

    /// [`Core::wait`] at `now`, a clock read just made.
    fn wait_at(&self, now: Instant) -> Duration {
        let device = match self.backend.next_wake() {
            Wake::Idle => IDLE_WAIT,
            Wake::After(d) => d.min(IDLE_WAIT),
            Wake::Spin => self.poll_every,
        };
        // Commands the engine owes an idle device: as soon as a busy one's
        // next poll, not after a sleep of up to IDLE_WAIT.
        let device = if self.engine.has_commands_due() { device.min(self.poll_every) } else { device };
        // A restore waiting for room looks again each poll period; one whose
        // moves are under way, when they end.
        let device = if self.swap_waiting() { device.min(swap::SWAP_LOOK) } else { device };
        self.next_timer_at(now).map_or(device, |t| t.min(device))
    }

    /// How long until the engine's or the swap's next timer (a policy's
    /// slice end, a restore's gate), if one is set.
    pub(crate) fn next_timer(&self) -> Option<Duration> {
        self.next_timer_at(Instant::now())
    }

    /// [`Core::next_timer`] from `at`, a clock read just made.
    fn next_timer_at(&self, at: Instant) -> Option<Duration> {
        let now = self.backend.now_at(at);
        [self.engine.poll_timeout(), self.swap_due()]
            .into_iter()
            .flatten()
            .min()
            .map(|at| Duration::from_nanos(at.saturating_sub(now)))
    }

    // ------------------------------------------------------------ clients

    /// A peer was admitted with `limits`; its frames go to `out`.
    pub fn connect(&mut self, client: u64, peer: Peer, limits: ClientLimits, out: Sender<ServerFrame>) {
        self.sessions.insert(client, Session::new(client, peer, limits, out));
    }

    /// A client's socket closed: its work is retreated, its memory freed once off the device.
    pub fn disconnect(&mut self, client: u64) {
        let Some(s) = self.sessions.get_mut(&client) else { return };
        if s.phase == Phase::Gone {
            return;
        }
        s.phase = Phase::Gone;
        s.out = None;
        // Its restore stops here; its gates go with its streams.
        self.swap.restoring.remove(&client);
        s.spin.set_urgent(false);
        let now = self.backend.now();
        self.record.gone(client, now);
        let slots: Vec<_> = s.streams.values().map(|st| st.slot).collect();
        s.streams.clear();
        s.events.clear();
        for slot in slots {
            // The slot is live (streams leave the table when removed), so this cannot fail.
            if let Err(e) = self.engine.remove_process(now, slot) {
                tracing::error!("removing client {client}'s stream: {e}");
            }
        }
        self.drain_completions();
        self.reap(client);
        self.update_urgent();
    }

    /// Drops a gone client once none of its operations is tracked, freeing its memory.
    fn reap(&mut self, client: u64) {
        let done = self.sessions.get(&client).is_some_and(|s| s.phase == Phase::Gone && s.in_flight == 0);
        if !done {
            return;
        }
        let Some(s) = self.sessions.remove(&client) else { return };
        self.forget_evicted(client, s.memory_evicted);
        self.release_on_device(&s);
        tracing::info!(
            "client {client} ({}) is gone; its memory is freed and its {} module(s) unloaded ({} kernels loaded in all)",
            s.name,
            s.modules.len(),
            self.backend.kernels_loaded()
        );
        if s.counters.kernels_done >= SUMMARY_AFTER {
            tracing::info!(
                "client {client} ({}) ran {} kernels; where they spent their time in the daemon, p50 / p99 / max µs \
                 (docs/daemon.md, \"Where a launch's time goes\"): {}",
                s.name,
                s.counters.kernels_done,
                s.stages.summary()
            );
        }
    }

    /// Gives the device back what a session holds on it: its buffers, its
    /// registered regions and its modules (a reaped client; one moving to
    /// another GPU, `handover.rs`).
    fn release_on_device(&mut self, s: &Session) {
        let client = s.id;
        for b in s.buffers.values() {
            if let Err(e) = self.backend.free(b.addr) {
                tracing::error!("freeing client {client}'s buffer: {e}");
            }
        }
        for r in s.region.iter().chain(s.host_regions.values()) {
            self.backend.unregister_host(r);
        }
        // Its modules: a daemon that serves clients for months would
        // otherwise keep every module any of them ever loaded.
        for m in s.modules.values() {
            let codes: Vec<crate::backend::KernelCode> =
                m.kernels.iter().filter_map(|k| s.kernels.get(k)).map(|k| k.code).collect();
            self.backend.unload_module(&codes);
        }
    }

    fn reply(&self, client: u64, id: u64, result: Result<Reply, ErrorReply>) {
        if let Some(s) = self.sessions.get(&client) {
            // A staging copy's chunk says who else is busy (core/beside.rs).
            let result = self.chunk_reply(s, id, result);
            let t = Instant::now();
            s.send(ServerFrame::Reply { id, result });
            count_call(&self.calls, |c| &mut c.frames, t.elapsed());
        }
    }

    /// Sends an error and disconnects.
    fn refuse(&mut self, client: u64, id: u64, e: ErrorReply) {
        tracing::debug!("client {client}: {:?}: {}", e.kind, e.message);
        self.reply(client, id, Err(e));
        self.disconnect(client);
    }

    /// The table of clients.
    pub fn status(&self) -> Status {
        let mut rows: BTreeMap<u64, ClientStatus> = BTreeMap::new();
        for s in self.sessions.values().filter(|s| s.phase == Phase::Open) {
            rows.insert(
                s.id,
                ClientStatus {
                    client: s.id,
                    gpu: self.gpu,
                    pid: s.peer.pid,
                    uid: s.peer.uid,
                    gid: s.peer.gid,
                    name: s.name.clone(),
                    priority: s.priority,
                    weight: s.weight,
                    memory_used: s.memory_used,
                    memory_evicted: s.memory_evicted,
                    memory_quota: s.limits.memory.min(self.backend.info().mem_bytes),
                    host_memory_used: s.host_used,
                    host_memory_quota: s.limits.host_memory,
                    ops_queued: 0,
                    ops_running: 0,
                    sms_held: 0,
                    preemptions: s.counters.preemptions,
                    kernels_done: s.counters.kernels_done,
                },
            );
        }
        for e in self.ops.values() {
            if let Some(r) = rows.get_mut(&e.client) {
                if e.launches > 0 || e.copying {
                    r.ops_running += 1;
                } else if !e.ended {
                    r.ops_queued += 1;
                }
            }
        }
        for (op, sms) in self.launches.values() {
            if let Some(r) = self.ops.get(op).and_then(|e| rows.get_mut(&e.client)) {
                r.sms_held += sms.len();
            }
        }
        let memory_used = self.sessions.values().map(|s| s.buffers.values().map(|b| b.bytes).sum::<u64>()).sum();
        let gpu = gpumux_proto::GpuStatus {
            gpu: self.gpu,
            device: self.backend.describe(),
            sms: self.backend.info().num_sms as u32,
            sms_busy: self.sms_held(),
            memory_used,
            memory_total: self.backend.info().mem_bytes,
            clients: rows.len() as u32,
            ops: self.ops.len() as u32,
            context_rebuilds: self.rebuilds,
        };
        Status {
            device: self.backend.describe(),
            policy: self.policy.clone(),
            sms: self.backend.info().num_sms as u32,
            memory_used,
            memory_total: self.backend.info().mem_bytes,
            memory_evicted: self.swap.evicted,
            swap_memory: self.swap.limit,
            evictions: self.swap.evictions,
            restores: self.swap.restores,
            host_memory_used: self.host_memory_held(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            context_rebuilds: self.rebuilds,
            clients: rows.into_values().collect(),
            gpus: vec![gpu],
        }
    }

    /// The device's own account of its memory (for checks against [`Core::memory_held`]).
    pub fn device_memory(&mut self) -> Result<MemInfo, MemError> {
        self.backend.mem_info()
    }

    /// The device's memory, bytes.
    pub fn memory_total(&self) -> u64 {
        self.backend.info().mem_bytes
    }

    /// The device's SMs (how a split launch divides its blocks).
    pub fn sms(&self) -> u32 {
        u32::from(self.backend.info().num_sms)
    }

    /// SMs held by device launches now, over all clients (gone ones included).
    pub fn sms_held(&self) -> u32 {
        self.launches.values().map(|(_, s)| s.len()).sum()
    }

    /// Device rounds (command/event exchanges) of the pumps that did
    /// something, and the launch commands answered in the turn that made
    /// them from ends known ahead, so far.
    pub fn device_rounds(&self) -> (u64, u64) {
        let r = &self.round_clock.total;
        (r.rounds, r.answered_in_turn)
    }

    /// Launch commands the device's side answered from ends it saw ahead,
    /// without a round trip (`backend::ends_ahead`).
    pub fn ends_answered(&self) -> u64 {
        self.backend.ends_answered()
    }

    /// The device link's account since its last lap, in words (a device
    /// process's: its exchanges and the work it did between them, the
    /// debug log's `core's device link:` line), and a new lap; `None` for a
    /// device in this process or when nothing happened.
    pub fn device_link_lap(&mut self) -> Option<String> {
        self.backend.exchange_lap()
    }

    /// Device memory held by all sessions, gone ones included, and by frees
    /// waiting for their operations.
    pub fn memory_held(&self) -> u64 {
        self.sessions.values().map(|s| s.buffers.values().map(|b| b.bytes).sum::<u64>()).sum()
    }

    /// Tells every client the daemon stops, fails what they wait for, and lets them go.
    pub fn shutdown(&mut self) {
        let mut ops: Vec<_> = self.ops.iter().collect();
        ops.sort_by_key(|(op, _)| **op);
        for (_, e) in ops {
            let id = match &e.kind {
                OpKind::Copy { reply: Some(id) } | OpKind::Sync { reply: id } | OpKind::HostFunc { reply: id, .. } => {
                    Some(*id)
                }
                _ => None,
            };
            if let Some(id) = id {
                self.reply(e.client, id, Err(err(ErrorKind::ShuttingDown, "the daemon is shutting down")));
            }
        }
        for s in self.sessions.values_mut() {
            let waiters: Vec<u64> = s.events.values_mut().flat_map(|ev| std::mem::take(&mut ev.waiters)).collect();
            for id in waiters {
                s.send(ServerFrame::Reply {
                    id,
                    result: Err(err(ErrorKind::ShuttingDown, "the daemon is shutting down")),
                });
            }
            s.send(ServerFrame::Notice(Notice::ShuttingDown));
            s.out = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use gpumux_proto::BufferSlice;

    fn request(core: &mut Core, client: u64, id: u64, request: Request) {
        core.inbound(client, Inbound::Request { id, request, fd: None });
    }

    /// The engine queues a copy's command as soon as the copy reaches its
    /// stream's head; a client that leaves before the core sends it (its
    /// request and its hang-up in one batch) must not have that copy reach the
    /// device with its work already unbound (that stopped the daemon).
    #[test]
    fn a_client_gone_right_after_a_copy_request_leaves_the_device_consistent() {
        let backend = SimBackend::with_info(gpumux_sim::presets::h100());
        let mut core = Core::new(Box::new(backend), None).expect("a core on sim:h100");
        let (tx, _rx) = std::sync::mpsc::channel();
        core.connect(1, Peer { pid: 1, uid: 1000, gid: 1000 }, ClientLimits::default(), tx);
        let hello = Request::hello("t", 0);
        request(&mut core, 1, 1, hello);
        request(&mut core, 1, 2, Request::Alloc { bytes: 4096 });
        request(&mut core, 1, 3, Request::Alloc { bytes: 4096 });
        core.pump().expect("pump");
        let buffers: Vec<BufferId> = core.sessions[&1].buffers.keys().copied().collect();
        let (src, dst) = (BufferSlice { buffer: buffers[0], offset: 0 }, BufferSlice { buffer: buffers[1], offset: 0 });
        request(&mut core, 1, 4, Request::CopyDevice { src, dst, bytes: 4096, stream: StreamId(0) });
        core.disconnect(1);
        // The copy (4 KiB at memory bandwidth) is long done after 20 ms.
        let until = Instant::now() + Duration::from_millis(20);
        while Instant::now() < until {
            core.pump().expect("the device stays consistent");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(core.sessions(), 0, "the gone client was never reaped");
        assert_eq!(core.status().memory_used, 0);
    }

    /// Issue 36's huge-grids abuser: a client at its queued-ops limit that
    /// keeps launching is refused each launch for the quota before anything
    /// else is looked at (before, the launch was validated and its kernel
    /// described first: here its argument count is wrong, and it was
    /// answered `Invalid`), and each refusal is one turn of the core's
    /// inbox: another client's requests, queued behind 200 of them, are
    /// answered one per refusal, not after them.
    #[test]
    fn launches_over_the_quota_are_refused_first_and_in_turn_with_the_others() {
        let backend = SimBackend::with_info(gpumux_sim::presets::h100());
        let mut core = Core::new(Box::new(backend), None).expect("a core on sim:h100");
        // Both clients' frames in one channel: its order is the order the core answered in.
        let (tx, frames) = std::sync::mpsc::channel();
        let peer = Peer { pid: 1, uid: 1000, gid: 1000 };
        core.connect(1, peer, ClientLimits { queued_ops: 1, ..ClientLimits::default() }, tx.clone());
        core.connect(2, peer, ClientLimits::default(), tx);
        for client in [1, 2] {
            let hello = Request::hello("t", 0);
            request(&mut core, client, 1, hello);
        }
        let module =
            Request::LoadModule { name: "m.cu".into(), source: "__global__ void k() {}\n".into(), options: vec![] };
        request(&mut core, 1, 2, module);
        let deadline = Instant::now() + Duration::from_secs(10);
        let kernel = loop {
            assert!(Instant::now() < deadline, "the module never loaded");
            core.pump().expect("pump");
            let loaded = frames.try_iter().find_map(|f| match f {
                ServerFrame::Reply { id: 2, result: Ok(Reply::Module { kernels, .. }) } => Some(kernels[0].kernel),
                _ => None,
            });
            if let Some(k) = loaded {
                break k;
            }
            std::thread::sleep(Duration::from_micros(100));
        };
        let launch = |args: Vec<gpumux_proto::Arg>| {
            Request::Launch(gpumux_proto::Launch {
                kernel,
                grid: [1, 1, 1],
                block: [32, 1, 1],
                shared_bytes: 0,
                args,
                stream: StreamId(0),
                block_time_ns: Some(10_000_000_000),
            })
        };
        // Under the quota, the wrong argument count is what is refused.
        request(&mut core, 1, 4, launch(vec![gpumux_proto::Arg::U32(7)]));
        let invalid = frames.try_iter().find_map(|f| match f {
            ServerFrame::Reply { id: 4, result: Err(e) } => Some(e.kind),
            _ => None,
        });
        assert_eq!(invalid, Some(ErrorKind::Invalid), "a launch with an argument too many, under the quota");
        // One 10 s launch holds client 1's only slot.
        request(&mut core, 1, 3, launch(Vec::new()));
        core.pump().expect("pump");
        assert!(frames.try_iter().all(|f| !matches!(f, ServerFrame::Reply { id: 3, .. })), "the launch was accepted");

        let (msgs, rx) = std::sync::mpsc::channel();
        let inbound = |client: u64, id: u64, request: Request| CoreMsg::Inbound {
            client,
            inbound: Inbound::Request { id, request, fd: None },
            read_at: Instant::now(),
        };
        for id in 100..300 {
            msgs.send(inbound(1, id, launch(vec![gpumux_proto::Arg::U32(7)]))).expect("queued");
        }
        for id in 10..15 {
            msgs.send(inbound(2, id, Request::Status)).expect("queued");
        }
        drop(msgs);
        core.run(rx).expect("the core stops when its channel closes");
        let replies: Vec<(u64, Result<Reply, ErrorReply>)> = frames
            .try_iter()
            .filter_map(|f| match f {
                ServerFrame::Reply { id, result } => Some((id, result)),
                _ => None,
            })
            .collect();
        let refused: Vec<_> = replies.iter().filter(|(id, _)| *id >= 100).collect();
        assert_eq!(refused.len(), 200);
        for (id, r) in refused {
            match r {
                Err(e) => assert_eq!(e.kind, ErrorKind::Quota, "launch {id}: {}", e.message),
                Ok(r) => panic!("launch {id} over the quota answered {r:?}"),
            }
        }
        let statuses: Vec<usize> =
            replies.iter().enumerate().filter(|(_, (id, _))| *id < 100).map(|(i, _)| i).collect();
        assert_eq!(statuses.len(), 5);
        // Client 1's first launch, then one of each in turn: 1 2 1 2 ...
        assert_eq!(statuses, [2, 4, 6, 8, 10], "client 2's Status among client 1's refusals");
    }

    /// A client's modules are unloaded when it is reaped (a daemon serving
    /// clients for months would otherwise keep every module ever loaded),
    /// and a module another client loaded too (a cached image) stays for it.
    #[test]
    fn a_gone_clients_modules_are_unloaded_and_a_shared_one_stays_for_the_other() {
        let backend = SimBackend::with_info(gpumux_sim::presets::h100());
        let mut core = Core::new(Box::new(backend), None).expect("a core on sim:h100");
        let source = "__global__ void k(float* y) { y[blockIdx.x] = 1.0f; }\n__global__ void j() {}\n";
        let load = |core: &mut Core, client: u64, source: &str| {
            let (tx, rx) = std::sync::mpsc::channel();
            core.connect(client, Peer { pid: 1, uid: 1000, gid: 1000 }, ClientLimits::default(), tx);
            let hello = Request::hello("t", 0);
            request(core, client, 1, hello);
            let module = Request::LoadModule { name: "m.cu".into(), source: source.into(), options: Vec::new() };
            request(core, client, 2, module);
            // Answered once the device reports the load (transformed on a
            // thread of its own), in a pump.
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut loaded = false;
            while !loaded {
                assert!(Instant::now() < deadline, "client {client}'s module never loaded");
                core.pump().expect("pump");
                loaded =
                    rx.try_iter().any(|f| matches!(f, ServerFrame::Reply { id: 2, result: Ok(Reply::Module { .. }) }));
                std::thread::sleep(Duration::from_micros(100));
            }
            rx
        };
        let _one = load(&mut core, 1, source);
        let _two = load(&mut core, 2, source);
        let _three = load(&mut core, 3, "__global__ void other() {}\n");
        assert_eq!(core.backend.kernels_loaded(), 3, "two clients share one image of two kernels");
        core.disconnect(1);
        core.pump().expect("pump");
        assert_eq!(core.sessions(), 2);
        assert_eq!(core.backend.kernels_loaded(), 3, "client 2 still holds the shared image");
        core.disconnect(2);
        core.disconnect(3);
        core.pump().expect("pump");
        assert_eq!(core.sessions(), 0);
        assert_eq!(core.backend.kernels_loaded(), 0, "every module unloaded with its last client");
    }
}

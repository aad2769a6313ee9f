//! The core: one thread owns the engine, the backend and every client's
//! state. Requests come in over a channel ([`CoreMsg`]); replies go out to
//! each client's writer thread; the core never blocks on a socket.
//!
//! [`Core`] itself does no I/O and reads no channel: [`Core::connect`],
//! [`Core::inbound`], [`Core::disconnect`] and [`Core::pump`] are what
//! [`Core::run`] calls and what the tests and the fuzz target call directly.
//! Replies follow the engine's completions in the order the engine reports
//! them, so the core is as deterministic as the device under it.

use crate::backend::{Backend, DevAddr, Failure, HostSpan, LoadError, MemError, MemInfo, OpWork, Wake};
use crate::config::ClientLimits;
use crate::conn::Inbound;
use crate::latency::{KernelStamps, SUMMARY_AFTER};
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
use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The policy when none is named: preemptive priority queues between
/// priority levels, the SMs split evenly among the clients of one level
/// (`ppq-even`), freeing SMs by draining. Clients ask for priorities, so the
/// policy must honour them and preempt; clients of one level run side by
/// side instead of taking turns kernel by kernel (co-run STP, issue 14);
/// draining is the one mechanism both devices have (a real GPU cannot save
/// a block's context in software). docs/daemon.md, "The default policy".
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
    /// Time in the device's `poll`.
    pub poll_calls: Duration,
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
    },
    /// A request or a broken rule from a client.
    Inbound {
        /// Whose.
        client: u64,
        /// What.
        inbound: Inbound,
        /// When its reader thread decoded it (how long it waits for the core is logged past [`SLOW_ROUND`]).
        read_at: Instant,
    },
    /// A client's socket closed.
    Disconnected {
        /// Whose.
        client: u64,
    },
    /// SIGINT/SIGTERM: tell every client and stop.
    Shutdown,
}

/// What an engine operation is to the core.
#[derive(Debug)]
enum OpKind {
    Kernel {
        name: String,
    },
    /// A copy or memset; `reply` is the request to answer when it is done.
    Copy {
        reply: Option<u64>,
    },
    Sync {
        reply: u64,
    },
    Event(EventId),
}

#[derive(Debug)]
struct OpEntry {
    client: u64,
    stream: StreamId,
    kind: OpKind,
    /// The engine reported its end.
    ended: bool,
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
    ops: HashMap<OpId, OpEntry>,
    launches: HashMap<LaunchId, (OpId, SmSet)>,
    copies: HashMap<CopyId, OpId>,
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
}

fn new_engine(backend: &dyn Backend, policy: &str) -> Result<Engine, CoreError> {
    Ok(Engine::new(backend.info().clone(), policies::by_name(policy)?)?)
}

/// The next message within `limit`, polling without sleeping ([`SPIN_AFTER_ACTIVITY`]).
fn spin_recv(rx: &Receiver<CoreMsg>, limit: Duration) -> Result<CoreMsg, RecvTimeoutError> {
    let start = Instant::now();
    loop {
        match rx.try_recv() {
            Ok(m) => return Ok(m),
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) if start.elapsed() >= limit => return Err(RecvTimeoutError::Timeout),
            Err(TryRecvError::Empty) => std::thread::yield_now(),
        }
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
            ops: HashMap::new(),
            launches: HashMap::new(),
            copies: HashMap::new(),
            deferred: Vec::new(),
            next_op: 0,
            started: Instant::now(),
            rebuilds: 0,
            events: Vec::new(),
            request_waited: 0,
            poll_every: SPIN_WAIT,
            urgent_connected: false,
        })
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

    /// Serves messages until [`CoreMsg::Shutdown`] or every sender is gone.
    pub fn run(mut self, rx: Receiver<CoreMsg>) -> Result<(), CoreError> {
        let mut active = Instant::now();
        loop {
            let wait = self.wait();
            let spin = wait <= self.poll_every
                || active.elapsed() < crate::spin::window_for(SPIN_AFTER_ACTIVITY, self.urgent_connected);
            let got = if spin { spin_recv(&rx, wait.min(self.poll_every)) } else { rx.recv_timeout(wait) };
            // A full sleep that ended pumps whatever the device says: that is
            // how a device process that died while idle is noticed (at least
            // once a second, `IDLE_WAIT`).
            let slept = !spin && matches!(got, Err(RecvTimeoutError::Timeout));
            let busy_from = Instant::now();
            let mut handled = 0u32;
            match got {
                Ok(msg) => {
                    active = Instant::now();
                    handled += 1;
                    if !self.handle(msg) {
                        self.shutdown();
                        return Ok(());
                    }
                    // Take everything queued before touching the device again.
                    while let Ok(msg) = rx.try_recv() {
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
            let handling = busy_from.elapsed();
            // A request may have made work; else the device is pumped only
            // when it asked to be (busy, or a timer due). Pumping an idle
            // device process costs a round trip on its link that requests
            // would wait behind, every few µs while the core spins.
            if handled == 0 && !slept && !self.device_due() {
                continue;
            }
            let pump = self.pump()?;
            let busy = busy_from.elapsed();
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
            CoreMsg::Connected { client, peer, limits, out, spin } => {
                self.connect(client, peer, limits, out);
                if let Some(s) = self.sessions.get_mut(&client) {
                    s.spin = spin;
                }
            }
            CoreMsg::Inbound { client, inbound, read_at } => {
                let waited = read_at.elapsed();
                if waited > SLOW_ROUND {
                    tracing::info!(
                        "a request of client {client} waited {:.0} µs for the core",
                        waited.as_secs_f64() * 1e6
                    );
                }
                let what = match &inbound {
                    Inbound::Request { request, .. } => request.name(),
                    Inbound::Violation(_) => "a violation",
                };
                let start = Instant::now();
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
            CoreMsg::Shutdown => return false,
        }
        true
    }

    /// Whether the device or the engine needs a look now.
    fn device_due(&self) -> bool {
        let device = match self.backend.next_wake() {
            Wake::Idle => false,
            Wake::After(d) => d.is_zero(),
            Wake::Spin => true,
        };
        device || self.engine.poll_timeout().is_some_and(|at| at <= self.backend.now())
    }

    /// How long to sleep before the device or the engine needs a look.
    pub fn wait(&self) -> Duration {
        let device = match self.backend.next_wake() {
            Wake::Idle => IDLE_WAIT,
            Wake::After(d) => d.min(IDLE_WAIT),
            Wake::Spin => self.poll_every,
        };
        let timer = self.engine.poll_timeout().map(|at| Duration::from_nanos(at.saturating_sub(self.backend.now())));
        timer.map_or(device, |t| t.min(device))
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
        s.spin.set_urgent(false);
        let now = self.backend.now();
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
        for b in s.buffers.values() {
            if let Err(e) = self.backend.free(b.addr) {
                tracing::error!("freeing client {client}'s buffer: {e}");
            }
        }
        if let Some(r) = &s.region {
            self.backend.unregister_host(r);
        }
        tracing::info!("client {client} ({}) is gone; its memory is freed", s.name);
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

    fn send(&self, client: u64, frame: ServerFrame) {
        if let Some(s) = self.sessions.get(&client) {
            s.send(frame);
        }
    }

    fn reply(&self, client: u64, id: u64, result: Result<Reply, ErrorReply>) {
        self.send(client, ServerFrame::Reply { id, result });
    }

    /// Sends an error and disconnects.
    fn refuse(&mut self, client: u64, id: u64, e: ErrorReply) {
        tracing::debug!("client {client}: {:?}: {}", e.kind, e.message);
        self.reply(client, id, Err(e));
        self.disconnect(client);
    }

    /// A request (or a broken rule) from `client`.
    pub fn inbound(&mut self, client: u64, inbound: Inbound) {
        let phase = match self.sessions.get(&client) {
            Some(s) => s.phase,
            None => return,
        };
        if phase == Phase::Gone {
            return;
        }
        match inbound {
            Inbound::Violation(e) => self.refuse(client, 0, e),
            Inbound::Request { id, request: Request::Hello { magic, version, name, priority, weight }, .. } => {
                match self.hello(client, magic, version, name, priority, weight) {
                    Ok(w) => self.reply(client, id, Ok(Reply::Welcome(w))),
                    Err(e) => self.refuse(client, id, e),
                }
            }
            Inbound::Request { id, .. } if phase == Phase::AwaitingHello => {
                // The connection state machine lets nothing but Hello through first.
                self.refuse(client, id, err(ErrorKind::Protocol, "the first request must be Hello"))
            }
            Inbound::Request { id, request: Request::Goodbye, .. } => {
                self.reply(client, id, Ok(Reply::Done));
                self.disconnect(client);
            }
            Inbound::Request { id, request, fd } => {
                if let Some(result) = self.request(client, id, request, fd) {
                    self.reply(client, id, result);
                }
            }
        }
    }

    fn hello(
        &mut self,
        client: u64,
        magic: [u8; 4],
        version: u16,
        name: String,
        priority: i32,
        weight: f64,
    ) -> Result<Welcome, ErrorReply> {
        if magic != MAGIC {
            return Err(err(ErrorKind::Protocol, "Hello without the GMUX magic: not a gpumux client"));
        }
        if version != VERSION {
            return Err(err(
                ErrorKind::Version { daemon: VERSION, client: version },
                format!("the daemon speaks protocol version {VERSION}, the client {version}: use matching versions"),
            ));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(err(ErrorKind::Invalid, format!("a name of {} bytes, over {MAX_NAME_BYTES}", name.len())));
        }
        let device_memory = self.backend.info().mem_bytes;
        let sms = self.backend.info().num_sms as u32;
        let (device, policy) = (self.backend.describe(), self.policy.clone());
        let Some(s) = self.sessions.get_mut(&client) else {
            return Err(err(ErrorKind::Protocol, "unknown client"));
        };
        check_priority(&s.limits, priority)?;
        check_weight(&s.limits, weight)?;
        let info = ProcessInfo::new(ProcessId(client as u32), format!("{name}#{client}"))
            .with_priority(priority)
            .with_weight(weight);
        let slot = self.engine.add_process(info).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?;
        s.streams.insert(StreamId::DEFAULT, Stream { slot, pending: 0, closing: false, last_kernel: None });
        s.name = name;
        s.priority = priority;
        s.weight = weight;
        s.phase = Phase::Open;
        s.spin.set_urgent(priority > 0);
        tracing::info!("client {client} `{}` (pid {}, uid {}) connected", s.name, s.peer.pid, s.peer.uid);
        let limits = s.limits.to_proto(device_memory);
        self.update_urgent();
        Ok(Welcome { version: VERSION, client, device, policy, sms, limits })
    }

    /// Serves one request; `None` when the answer comes later (from a completion).
    fn request(
        &mut self,
        client: u64,
        id: u64,
        request: Request,
        fd: Option<OwnedFd>,
    ) -> Option<Result<Reply, ErrorReply>> {
        let r = match request {
            Request::Hello { .. } | Request::Goodbye => Err(err(ErrorKind::Protocol, "out of turn")),
            Request::SetPriority(p) => self.set_priority(client, p),
            Request::SetWeight(w) => self.set_weight(client, w),
            Request::AttachShm { bytes } => self.attach_shm(client, bytes, fd),
            Request::Alloc { bytes } => self.alloc(client, bytes),
            Request::Free(b) => self.free(client, b),
            Request::Memset { dst, value, bytes, stream } => self
                .session(client)
                .and_then(|s| validate::device_span(s, dst, bytes))
                .and_then(|dst| {
                    let work = OpWork::Memset { dst, value, bytes };
                    self.submit_copy(client, stream, CopyDirection::DeviceToDevice, bytes, work, None)
                })
                .map(|_| Reply::Done),
            Request::CopyDevice { src, dst, bytes, stream } => self
                .session(client)
                .and_then(|s| Ok((validate::device_span(s, src, bytes)?, validate::device_span(s, dst, bytes)?)))
                .and_then(|(src, dst)| {
                    let work = OpWork::DeviceCopy { src, dst, bytes };
                    self.submit_copy(client, stream, CopyDirection::DeviceToDevice, bytes, work, None)
                })
                .map(|_| Reply::Done),
            Request::CopyToDevice { dst, shm_offset, bytes, stream } => {
                let checked = self.session(client).and_then(|s| {
                    Ok((validate::device_span(s, dst, bytes)?, validate::shm_span(s, shm_offset, bytes)?))
                });
                return match checked.and_then(|(dst, region)| {
                    let work = OpWork::ToDevice { dst, src: HostSpan { region, offset: shm_offset }, bytes };
                    self.submit_copy(client, stream, CopyDirection::HostToDevice, bytes, work, Some(id))
                }) {
                    Ok(()) => None,
                    Err(e) => Some(Err(e)),
                };
            }
            Request::CopyToHost { src, shm_offset, bytes, stream } => {
                let checked = self.session(client).and_then(|s| {
                    Ok((validate::device_span(s, src, bytes)?, validate::shm_span(s, shm_offset, bytes)?))
                });
                return match checked.and_then(|(src, region)| {
                    let work = OpWork::ToHost { src, dst: HostSpan { region, offset: shm_offset }, bytes };
                    self.submit_copy(client, stream, CopyDirection::DeviceToHost, bytes, work, Some(id))
                }) {
                    Ok(()) => None,
                    Err(e) => Some(Err(e)),
                };
            }
            Request::LoadModule { name, source, options } => self.load_module(client, name, source, options),
            Request::Launch(l) => self.launch(client, &l),
            Request::CreateStream => self.create_stream(client),
            Request::DestroyStream(st) => self.destroy_stream(client, st),
            Request::SyncStream(st) => {
                return match self.submit_op(client, st, StreamOp::Sync, None, OpKind::Sync { reply: id }) {
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            Request::RecordEvent(st) => self.record_event(client, st),
            Request::QueryEvent(e) => self.event(client, e).map(|ev| Reply::Query(ev.op.is_none())),
            Request::WaitEvent(e) => {
                return match self.sessions.get_mut(&client).and_then(|s| s.events.get_mut(&e)) {
                    Some(ev) if ev.op.is_none() => Some(Ok(Reply::Done)),
                    Some(ev) => {
                        ev.waiters.push(id);
                        None
                    }
                    None => Some(Err(no_event(e))),
                }
            }
            Request::DestroyEvent(e) => match self.sessions.get_mut(&client).and_then(|s| s.events.remove(&e)) {
                Some(ev) => {
                    for w in ev.waiters {
                        self.reply(client, w, Err(err(ErrorKind::Invalid, format!("event {} was destroyed", e.0))));
                    }
                    Ok(Reply::Done)
                }
                None => Err(no_event(e)),
            },
            Request::Status => Ok(Reply::Status(self.status())),
        };
        Some(r)
    }

    fn session(&self, client: u64) -> Result<&Session, ErrorReply> {
        self.sessions.get(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))
    }

    fn session_mut(&mut self, client: u64) -> Result<&mut Session, ErrorReply> {
        self.sessions.get_mut(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))
    }

    fn event(&self, client: u64, e: EventId) -> Result<&EventState, ErrorReply> {
        self.session(client)?.events.get(&e).ok_or_else(|| no_event(e))
    }

    fn set_priority(&mut self, client: u64, p: i32) -> Result<Reply, ErrorReply> {
        let s = self.sessions.get_mut(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))?;
        check_priority(&s.limits, p)?;
        s.priority = p;
        s.spin.set_urgent(p > 0);
        for st in s.streams.values() {
            self.engine.set_priority(st.slot, p).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?;
        }
        self.update_urgent();
        Ok(Reply::Done)
    }

    /// Whether an urgent client (priority above 0) is connected changed:
    /// the core and the device process poll [`URGENT_WINDOW`] after traffic
    /// while one is (`crate::spin`).
    fn update_urgent(&mut self) {
        let any = self.sessions.values().any(|s| s.phase == Phase::Open && s.priority > 0);
        if any != self.urgent_connected {
            self.urgent_connected = any;
            // ZERO: the device process's own window (`--spin-us` included).
            self.backend.spin_for(if any { crate::spin::window_for(URGENT_WINDOW, true) } else { Duration::ZERO });
        }
    }

    fn set_weight(&mut self, client: u64, w: f64) -> Result<Reply, ErrorReply> {
        let s = self.sessions.get_mut(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))?;
        check_weight(&s.limits, w)?;
        s.weight = w;
        let per_stream = s.stream_weight();
        for st in s.streams.values() {
            self.engine.set_weight(st.slot, per_stream).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?;
        }
        Ok(Reply::Done)
    }

    fn attach_shm(&mut self, client: u64, bytes: u64, fd: Option<OwnedFd>) -> Result<Reply, ErrorReply> {
        let limit = self.session(client)?.limits.shm;
        let fd =
            fd.ok_or_else(|| err(ErrorKind::Invalid, "AttachShm came without a memfd (send it with SCM_RIGHTS)"))?;
        if bytes > limit {
            return Err(err(
                ErrorKind::Quota,
                format!("a shared region of {bytes} bytes is over your limit of {limit} bytes"),
            ));
        }
        let region = Arc::new(ShmRegion::map(fd, bytes).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?);
        self.backend.register_host(&region).map_err(|e| err(ErrorKind::Device, e.to_string()))?;
        let waiting_for = self.client_ops(client);
        let old = self.session_mut(client)?.region.replace(region);
        if let Some(old) = old {
            self.defer(waiting_for, Release::Region(old));
        }
        Ok(Reply::Done)
    }

    fn alloc(&mut self, client: u64, bytes: u64) -> Result<Reply, ErrorReply> {
        let s = self.session(client)?;
        if bytes == 0 {
            return Err(err(ErrorKind::Invalid, "an allocation of 0 bytes"));
        }
        // Beyond the quota, the device's own memory is the limit (OutOfMemory).
        let quota = s.limits.memory;
        if s.memory_used.checked_add(bytes).is_none_or(|total| total > quota) {
            return Err(err(
                ErrorKind::Quota,
                format!(
                    "allocating {bytes} bytes would bring your device memory to {} bytes, over your quota of {quota} bytes (you hold {} bytes)",
                    s.memory_used as u128 + bytes as u128,
                    s.memory_used
                ),
            ));
        }
        let addr = self.backend.alloc(bytes).map_err(|e| match e {
            MemError::OutOfMemory { .. } => err(ErrorKind::OutOfMemory, e.to_string()),
            MemError::Device(m) => err(ErrorKind::Device, m),
        })?;
        let s = self.session_mut(client)?;
        let id = BufferId(s.next_handle());
        s.buffers.insert(id, Buffer { addr, bytes });
        s.memory_used += bytes;
        Ok(Reply::Buffer(id))
    }

    fn free(&mut self, client: u64, b: BufferId) -> Result<Reply, ErrorReply> {
        let waiting_for = self.client_ops(client);
        let s = self.session_mut(client)?;
        let buf = s
            .buffers
            .remove(&b)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("buffer {} is not yours (or was freed)", b.0)))?;
        s.memory_used -= buf.bytes;
        self.defer(waiting_for, Release::Buffer(buf.addr));
        Ok(Reply::Done)
    }

    /// The client's operations tracked now (what a release must wait for).
    fn client_ops(&self, client: u64) -> Vec<OpId> {
        let mut v: Vec<OpId> = self.ops.iter().filter(|(_, e)| e.client == client).map(|(op, _)| *op).collect();
        v.sort_unstable();
        v
    }

    fn defer(&mut self, waiting_for: Vec<OpId>, release: Release) {
        self.deferred.push(Deferred { waiting_for, release });
        self.release_ready();
    }

    fn release_ready(&mut self) {
        let ops = &self.ops;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| d.waiting_for.iter().all(|op| !ops.contains_key(op)));
        self.deferred = waiting;
        for d in ready {
            match d.release {
                Release::Buffer(addr) => {
                    if let Err(e) = self.backend.free(addr) {
                        tracing::error!("freeing a buffer: {e}");
                    }
                }
                Release::Region(r) => self.backend.unregister_host(&r),
            }
        }
    }

    fn load_module(
        &mut self,
        client: u64,
        name: String,
        source: String,
        options: Vec<String>,
    ) -> Result<Reply, ErrorReply> {
        if name.len() > MAX_NAME_BYTES || source.len() > MAX_SOURCE_BYTES || options.len() > MAX_OPTIONS {
            return Err(err(ErrorKind::Invalid, "module name, source or options over the protocol's limits"));
        }
        if options.iter().any(|o| o.len() > MAX_NAME_BYTES) {
            return Err(err(ErrorKind::Invalid, format!("a compile option over {MAX_NAME_BYTES} bytes")));
        }
        self.session(client)?;
        let image = self.backend.load_module(&name, &source, &options).map_err(|e| load_error(&name, e))?;
        let s = self.session_mut(client)?;
        let module = ModuleId(s.next_handle());
        let mut entries = Vec::new();
        let mut handles = Vec::new();
        for k in image.kernels {
            let kid = KernelId(s.next_handle());
            entries.push(KernelEntry { name: k.name.clone(), kernel: kid, param_sizes: k.param_sizes.clone() });
            handles.push(kid);
            s.kernels.insert(kid, k);
        }
        s.modules.insert(module, LoadedModule { name, source, options, kernels: handles });
        Ok(Reply::Module { module, kernels: entries, log: image.log, cached: image.cached })
    }

    fn launch(&mut self, client: u64, l: &gpumux_proto::Launch) -> Result<Reply, ErrorReply> {
        let s = self.session(client)?;
        let image = s
            .kernels
            .get(&l.kernel)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("kernel {} is not yours", l.kernel.0)))?;
        let c = validate::launch(s, image, self.backend.info(), l)?;
        let shape = KernelShape::new(c.blocks, c.threads, image.regs_per_thread).with_smem_per_block(c.smem);
        // A client's kernel may write in place: a dropped block must not rerun.
        let desc = KernelDesc::new(image.name.clone(), shape)
            .with_idempotent(false)
            .with_sim_timing(SimTiming::new(c.block_time_ns));
        let work = OpWork::Kernel {
            code: image.code,
            grid: l.grid,
            block: l.block,
            shared_bytes: l.shared_bytes,
            params: c.params,
            after: None,
        };
        let name = image.name.clone();
        let op = StreamOp::Kernel { desc: Arc::new(desc), time_key: self.next_op };
        self.submit_op(client, l.stream, op, Some(work), OpKind::Kernel { name })?;
        Ok(Reply::Done)
    }

    fn submit_copy(
        &mut self,
        client: u64,
        stream: StreamId,
        direction: CopyDirection,
        bytes: u64,
        work: OpWork,
        reply: Option<u64>,
    ) -> Result<(), ErrorReply> {
        self.submit_op(client, stream, StreamOp::Copy { direction, bytes }, Some(work), OpKind::Copy { reply })
            .map(|_| ())
    }

    /// Submits an operation to a client's stream after the queued-ops check,
    /// binding its work before the engine can start it.
    fn submit_op(
        &mut self,
        client: u64,
        stream: StreamId,
        op: StreamOp,
        work: Option<OpWork>,
        kind: OpKind,
    ) -> Result<OpId, ErrorReply> {
        let now = self.backend.now();
        let s = self.session(client)?;
        let st = s.streams.get(&stream).filter(|st| !st.closing).ok_or_else(|| {
            err(ErrorKind::NoSuchHandle, format!("stream {} is not yours (or was destroyed)", stream.0))
        })?;
        if s.in_flight >= s.limits.queued_ops {
            return Err(err(
                ErrorKind::Quota,
                format!(
                    "{} operations queued or running, your limit is {}: sync first",
                    s.in_flight, s.limits.queued_ops
                ),
            ));
        }
        let (slot, priority, last_kernel) = (st.slot, s.priority, st.last_kernel);
        let is_kernel = matches!(op, StreamOp::Kernel { .. });
        let id = self.engine.submit(now, slot, op).map_err(|e| match e {
            EngineError::DoesNotFit(d) => err(ErrorKind::Invalid, d.to_string()),
            other => err(ErrorKind::Invalid, other.to_string()),
        })?;
        self.next_op = id.0 + 1;
        if let Some(mut w) = work {
            if let OpWork::Kernel { after, .. } = &mut w {
                *after = last_kernel;
            }
            self.backend.bind(id, w);
        }
        self.ops.insert(
            id,
            OpEntry {
                client,
                stream,
                kind,
                ended: false,
                launches: 0,
                copying: false,
                queued: now,
                first_launch: None,
                launched: 0,
                priority,
                stamps: KernelStamps {
                    waited: self.request_waited,
                    queued: now,
                    commanded: None,
                    launched: None,
                    ended: None,
                },
            },
        );
        if let Ok(s) = self.session_mut(client) {
            s.in_flight += 1;
            if let Some(st) = s.streams.get_mut(&stream) {
                st.pending += 1;
                st.last_kernel = is_kernel.then_some(id);
            }
        }
        Ok(id)
    }

    fn create_stream(&mut self, client: u64) -> Result<Reply, ErrorReply> {
        let s = self.session_mut(client)?;
        if s.streams.len() >= s.limits.queued_ops as usize {
            return Err(err(ErrorKind::Quota, "as many streams as your queued-ops limit"));
        }
        let id = s.next_stream().ok_or_else(|| err(ErrorKind::Quota, "no stream ids left"))?;
        let info = ProcessInfo::new(ProcessId(client as u32), format!("{}#{client}.{}", s.name, id.0))
            .with_priority(s.priority)
            .with_weight(0.0);
        let slot = self.engine.add_process(info).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?;
        let s = self.session_mut(client)?;
        s.streams.insert(id, Stream { slot, pending: 0, closing: false, last_kernel: None });
        self.reweigh(client);
        Ok(Reply::Stream(id))
    }

    /// Splits a client's weight evenly among its streams again.
    fn reweigh(&mut self, client: u64) {
        let Some(s) = self.sessions.get(&client) else { return };
        let w = s.stream_weight();
        for st in s.streams.values() {
            if let Err(e) = self.engine.set_weight(st.slot, w) {
                tracing::error!("re-weighing client {client}: {e}");
            }
        }
    }

    fn destroy_stream(&mut self, client: u64, stream: StreamId) -> Result<Reply, ErrorReply> {
        if stream == StreamId::DEFAULT {
            return Err(err(ErrorKind::Invalid, "stream 0 lives as long as the connection"));
        }
        let s = self.session_mut(client)?;
        let st = s
            .streams
            .get_mut(&stream)
            .filter(|st| !st.closing)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("stream {} is not yours", stream.0)))?;
        st.closing = true;
        self.close_stream_if_idle(client, stream);
        Ok(Reply::Done)
    }

    fn close_stream_if_idle(&mut self, client: u64, stream: StreamId) {
        let Some(s) = self.sessions.get_mut(&client) else { return };
        let Some(st) = s.streams.get(&stream).copied() else { return };
        if !st.closing || st.pending > 0 {
            return;
        }
        s.streams.remove(&stream);
        if let Err(e) = self.engine.remove_process(self.backend.now(), st.slot) {
            tracing::error!("removing client {client}'s stream {}: {e}", stream.0);
        }
        self.reweigh(client);
    }

    fn record_event(&mut self, client: u64, stream: StreamId) -> Result<Reply, ErrorReply> {
        let e = EventId(self.session_mut(client)?.next_handle());
        let op = self.submit_op(client, stream, StreamOp::Sync, None, OpKind::Event(e))?;
        self.session_mut(client)?.events.insert(e, EventState { op: Some(op), waiters: Vec::new() });
        Ok(Reply::Event(e))
    }

    /// The table of clients.
    pub fn status(&self) -> Status {
        let mut rows: BTreeMap<u64, ClientStatus> = BTreeMap::new();
        for s in self.sessions.values().filter(|s| s.phase == Phase::Open) {
            rows.insert(
                s.id,
                ClientStatus {
                    client: s.id,
                    pid: s.peer.pid,
                    uid: s.peer.uid,
                    gid: s.peer.gid,
                    name: s.name.clone(),
                    priority: s.priority,
                    weight: s.weight,
                    memory_used: s.memory_used,
                    memory_quota: s.limits.memory.min(self.backend.info().mem_bytes),
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
        Status {
            device: self.backend.describe(),
            policy: self.policy.clone(),
            sms: self.backend.info().num_sms as u32,
            memory_used,
            memory_total: self.backend.info().mem_bytes,
            uptime_s: self.started.elapsed().as_secs_f64(),
            context_rebuilds: self.rebuilds,
            clients: rows.into_values().collect(),
        }
    }

    /// The device's own account of its memory (for checks against [`Core::memory_held`]).
    pub fn device_memory(&mut self) -> Result<MemInfo, MemError> {
        self.backend.mem_info()
    }

    /// SMs held by device launches now, over all clients (gone ones included).
    pub fn sms_held(&self) -> u32 {
        self.launches.values().map(|(_, s)| s.len()).sum()
    }

    /// Device memory held by all sessions, gone ones included, and by frees
    /// waiting for their operations.
    pub fn memory_held(&self) -> u64 {
        self.sessions.values().map(|s| s.buffers.values().map(|b| b.bytes).sum::<u64>()).sum()
    }

    // ------------------------------------------------------------- device

    /// Exchanges commands, events and completions with the engine and the
    /// device until nothing is left to do at this instant.
    pub fn pump(&mut self) -> Result<PumpStats, CoreError> {
        let mut stats = PumpStats::default();
        if let Some(at) = self.engine.poll_timeout() {
            let now = self.backend.now();
            if at <= now {
                self.engine.handle_timeout(now);
            }
        }
        for _ in 0..MAX_ROUNDS {
            stats.rounds += 1;
            self.drain_completions();
            let sent = self.drain_commands(&mut stats)?;
            let mut events = std::mem::take(&mut self.events);
            events.clear();
            let call = Instant::now();
            let polled = self.backend.poll(&mut events);
            stats.slowest_call = stats.slowest_call.max(call.elapsed());
            stats.poll_calls += call.elapsed();
            stats.events += events.len() as u32;
            let t = match polled {
                Ok(t) => t,
                Err(f) => {
                    self.events = events;
                    self.failure(f)?;
                    continue;
                }
            };
            if events.is_empty() && !sent {
                self.events = events;
                break;
            }
            let engine = Instant::now();
            for e in events.drain(..) {
                self.track_event(&e);
                self.engine.handle_event(t, e)?;
            }
            stats.engine += engine.elapsed();
            self.events = events;
        }
        self.drain_completions();
        if !stats.retreat_calls.is_zero() {
            // Where a preemption's turn went (an urgent kernel's `decide`: docs/daemon.md).
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            tracing::debug!(
                "a turn with a retreat: engine {:.1} µs, retreat calls {:.1} µs, launch calls {:.1} µs, \
                 polls {:.1} µs ({} events), {} rounds",
                us(stats.engine),
                us(stats.retreat_calls),
                us(stats.launch_calls),
                us(stats.poll_calls),
                stats.events,
                stats.rounds
            );
        }
        Ok(stats)
    }

    /// Sends the engine's commands to the device; true if any went.
    fn drain_commands(&mut self, stats: &mut PumpStats) -> Result<bool, CoreError> {
        let mut sent = false;
        loop {
            let engine = Instant::now();
            let next = self.engine.poll_command()?;
            stats.engine += engine.elapsed();
            let Some(cmd) = next else { break };
            sent = true;
            if let Command::Copy { copy, op, .. } = cmd {
                if !self.ops.contains_key(&op) {
                    // The engine starts a copy when it reaches its stream's
                    // head, queuing the command; a client gone before the
                    // command got here had the copy dropped and its work
                    // unbound. It moves no bytes; the engine has its end.
                    self.engine.handle_event(self.backend.now(), Event::CopyDone { copy })?;
                    continue;
                }
            }
            self.track_command(&cmd);
            stats.commands += 1;
            let launched_op = if let Command::Launch { op, .. } = &cmd { Some(*op) } else { None };
            let retreat = matches!(cmd, Command::Retreat { .. });
            let call = Instant::now();
            let submitted = self.backend.submit(cmd);
            stats.slowest_call = stats.slowest_call.max(call.elapsed());
            if retreat {
                stats.retreat_calls += call.elapsed();
            } else if launched_op.is_some() {
                stats.launch_calls += call.elapsed();
            }
            if let Some(e) = launched_op.and_then(|op| self.ops.get_mut(&op)) {
                e.stamps.launched.get_or_insert(self.backend.now());
            }
            if let Err(f) = submitted {
                self.failure(f)?;
                return Ok(true);
            }
        }
        Ok(sent)
    }

    fn track_command(&mut self, cmd: &Command) {
        match cmd {
            Command::Launch { launch, op, sms, .. } => {
                self.launches.insert(*launch, (*op, *sms));
                let now = self.backend.now();
                if let Some(e) = self.ops.get_mut(op) {
                    e.launches += 1;
                    e.launched += 1;
                    e.first_launch.get_or_insert((now, sms.len()));
                    e.stamps.commanded.get_or_insert(now);
                }
            }
            Command::Grow { launch, sms } => {
                if let Some((_, held)) = self.launches.get_mut(launch) {
                    *held = held.union(sms);
                }
            }
            Command::Retreat { launch, .. } => {
                let client = self.launches.get(launch).and_then(|(op, _)| self.ops.get(op)).map(|e| e.client);
                if let Some(s) = client.and_then(|c| self.sessions.get_mut(&c)) {
                    s.counters.preemptions += 1;
                }
            }
            Command::Copy { copy, op, .. } => {
                self.copies.insert(*copy, *op);
                if let Some(e) = self.ops.get_mut(op) {
                    e.copying = true;
                }
            }
        }
    }

    fn track_event(&mut self, event: &Event) {
        match event {
            Event::SmReleased { launch, sm, .. } => {
                if let Some((_, held)) = self.launches.get_mut(launch) {
                    held.remove(*sm);
                }
            }
            Event::LaunchEnded { launch, .. } => {
                if let Some((op, _)) = self.launches.remove(launch) {
                    if let Some(e) = self.ops.get_mut(&op) {
                        e.launches = e.launches.saturating_sub(1);
                        e.stamps.ended = Some(self.backend.now());
                    }
                    self.maybe_finish(op);
                }
            }
            Event::CopyDone { copy } => {
                if let Some(op) = self.copies.remove(copy) {
                    if let Some(e) = self.ops.get_mut(&op) {
                        e.copying = false;
                    }
                    self.maybe_finish(op);
                }
            }
        }
    }

    /// Turns the engine's completions into replies.
    fn drain_completions(&mut self) {
        while let Some(c) = self.engine.poll_completion() {
            let Some(e) = self.ops.get_mut(&c.op) else { continue };
            e.ended = true;
            let (client, stream) = (e.client, e.stream);
            let completed = c.outcome == OpOutcome::Completed;
            // What to do, decided while `e` is borrowed, done after.
            let (kernel_done, reply, event) = match &e.kind {
                OpKind::Kernel { .. } => (completed, None, None),
                OpKind::Copy { reply } => (false, reply.filter(|_| completed), None),
                OpKind::Sync { reply } => (false, Some(*reply).filter(|_| completed), None),
                OpKind::Event(ev) => (false, None, Some(*ev).filter(|_| completed)),
            };
            if kernel_done || reply.is_some() {
                let now = self.backend.now();
                if let Some(s) = self.sessions.get_mut(&client) {
                    if kernel_done {
                        s.counters.kernels_done += 1;
                        s.stages.kernel(&e.stamps, now);
                    } else if matches!(e.kind, OpKind::Sync { .. }) {
                        s.stages.sync(e.queued, now);
                    }
                }
            }
            if let Some(id) = reply {
                self.reply(client, id, Ok(Reply::Done));
            }
            if let Some(ev) = event {
                let waiters = self
                    .sessions
                    .get_mut(&client)
                    .and_then(|s| s.events.get_mut(&ev))
                    .map(|st| {
                        st.op = None;
                        std::mem::take(&mut st.waiters)
                    })
                    .unwrap_or_default();
                for w in waiters {
                    self.reply(client, w, Ok(Reply::Done));
                }
            }
            if let Some(st) = self.sessions.get_mut(&client).and_then(|s| s.streams.get_mut(&stream)) {
                st.pending = st.pending.saturating_sub(1);
            }
            self.close_stream_if_idle(client, stream);
            self.maybe_finish(c.op);
        }
    }

    /// Forgets an operation that the engine ended and the device let go of.
    fn maybe_finish(&mut self, op: OpId) {
        let Some(e) = self.ops.get(&op) else { return };
        if !e.ended || e.launches > 0 || e.copying {
            return;
        }
        let client = e.client;
        if let Some(e) = self.ops.remove(&op) {
            self.log_if_slow_urgent(op, &e);
        }
        self.backend.unbind(op);
        if let Some(s) = self.sessions.get_mut(&client) {
            s.in_flight = s.in_flight.saturating_sub(1);
        }
        self.release_ready();
        self.reap(client);
    }

    /// Logs an urgent kernel that took longer than [`SLOW_URGENT`] (see there).
    fn log_if_slow_urgent(&self, op: OpId, e: &OpEntry) {
        if e.priority <= 0 || !matches!(e.kind, OpKind::Kernel { .. }) {
            return;
        }
        let now = self.backend.now();
        let total = now.saturating_sub(e.queued);
        if total <= SLOW_URGENT {
            return;
        }
        let us = |ns: Nanos| ns as f64 / 1e3;
        let name = self.sessions.get(&e.client).map_or("?", |s| s.name.as_str());
        match e.first_launch {
            Some((at, sms)) => tracing::info!(
                "slow urgent kernel: client {} ({name}) {op} at priority {}: {:.0} µs from request to end: \
                 {:.0} µs before its first launch (on {sms} SMs), {:.0} µs from there to its end, {} launch(es); \
                 device launches in flight now: {}",
                e.client,
                e.priority,
                us(total),
                us(at.saturating_sub(e.queued)),
                us(now.saturating_sub(at)),
                e.launched,
                self.launches.len()
            ),
            None => tracing::info!(
                "slow urgent kernel: client {} ({name}) {op} at priority {}: {:.0} µs, never launched",
                e.client,
                e.priority,
                us(total)
            ),
        }
    }

    fn failure(&mut self, f: Failure) -> Result<(), CoreError> {
        match f {
            Failure::Fatal(e) => Err(CoreError::Device(e)),
            Failure::ContextLost { suspects, what } => self.context_lost(&suspects, &what),
        }
    }

    /// A kernel broke the context: tell every client what of its was lost,
    /// fail what it waits for, and rebuild everything on a fresh context.
    fn context_lost(&mut self, suspects: &[OpId], what: &str) -> Result<(), CoreError> {
        self.rebuilds += 1;
        tracing::warn!("the device context was lost ({what}); rebuilding it");
        let culprits: HashSet<u64> = suspects.iter().filter_map(|op| self.ops.get(op)).map(|e| e.client).collect();
        let mut ops: Vec<(OpId, OpEntry)> = self.ops.drain().collect();
        ops.sort_by_key(|(op, _)| *op);
        let mut lost: BTreeMap<u64, LostWork> = BTreeMap::new();
        for (_, e) in &ops {
            let l = lost.entry(e.client).or_default();
            match &e.kind {
                OpKind::Kernel { name } if !e.ended || e.launches > 0 => l.launches.push(name.clone()),
                OpKind::Copy { .. } if !e.ended || e.copying => l.copies += 1,
                _ => {}
            }
        }
        // Notices first, then the failed waits, so a client reads why before what.
        for s in self.sessions.values().filter(|s| s.phase == Phase::Open) {
            let mut work = lost.get(&s.id).cloned().unwrap_or_default();
            work.buffers = s.buffers.keys().copied().collect();
            s.send(ServerFrame::Notice(Notice::ContextLost {
                caused_by_you: culprits.contains(&s.id),
                what: what.to_string(),
                lost: work,
            }));
        }
        for (_, e) in &ops {
            let kind = if culprits.contains(&e.client) { ErrorKind::KernelFault } else { ErrorKind::ContextLost };
            let launches = lost.get(&e.client).map(|l| l.launches.join(", ")).unwrap_or_default();
            let message = if kind == ErrorKind::KernelFault && culprits.len() == 1 {
                format!("your kernel broke the device context ({what}); lost launches: [{launches}]; buffers must be re-filled")
            } else if kind == ErrorKind::KernelFault {
                // The driver names no kernel: every client with one running is a suspect.
                format!(
                    "the device context broke while your kernel ran beside kernels of {} other client(s); \
                     the driver does not say which faulted ({what}); lost launches: [{launches}]; buffers must be re-filled",
                    culprits.len() - 1
                )
            } else {
                format!("another client's kernel broke the device context ({what}); your lost launches: [{launches}]; buffers must be re-filled")
            };
            match &e.kind {
                OpKind::Copy { reply: Some(id) } | OpKind::Sync { reply: id } if !e.ended => {
                    self.reply(e.client, *id, Err(err(kind, message)))
                }
                OpKind::Event(ev) => {
                    let waiters = self
                        .sessions
                        .get_mut(&e.client)
                        .and_then(|s| s.events.get_mut(ev))
                        .map(|st| {
                            st.op = None;
                            std::mem::take(&mut st.waiters)
                        })
                        .unwrap_or_default();
                    for w in waiters {
                        self.reply(e.client, w, Err(err(kind.clone(), message.clone())));
                    }
                }
                _ => {}
            }
        }
        self.launches.clear();
        self.copies.clear();
        // Their memory went with the context.
        self.deferred.clear();
        self.sessions.retain(|_, s| s.phase != Phase::Gone);
        self.backend.rebuild().map_err(CoreError::Rebuild)?;
        self.engine = new_engine(self.backend.as_ref(), &self.policy)?;
        self.next_op = 0;
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        for id in ids {
            self.restore(id)?;
        }
        Ok(())
    }

    /// Puts a client back on a fresh context: its streams, buffers (same
    /// handles, new addresses, contents undefined), region and modules.
    fn restore(&mut self, client: u64) -> Result<(), CoreError> {
        let Some(mut s) = self.sessions.remove(&client) else { return Ok(()) };
        s.in_flight = 0;
        s.streams.retain(|_, st| !st.closing);
        let per_stream = s.stream_weight();
        for (sid, st) in s.streams.iter_mut() {
            let info = ProcessInfo::new(ProcessId(client as u32), format!("{}#{client}.{}", s.name, sid.0))
                .with_priority(s.priority)
                .with_weight(per_stream);
            st.slot = self.engine.add_process(info)?;
            st.pending = 0;
        }
        let mut dropped = Vec::new();
        for (id, b) in s.buffers.iter_mut() {
            match self.backend.alloc(b.bytes) {
                Ok(addr) => b.addr = addr,
                Err(e) => {
                    tracing::error!("client {client}'s buffer {} cannot be re-allocated: {e}", id.0);
                    dropped.push(*id);
                }
            }
        }
        for id in dropped {
            if let Some(b) = s.buffers.remove(&id) {
                s.memory_used -= b.bytes;
            }
        }
        if let Some(r) = &s.region {
            if let Err(e) = self.backend.register_host(r) {
                tracing::error!("client {client}'s shared region cannot be registered again: {e}");
                s.region = None;
            }
        }
        for m in s.modules.values() {
            match self.backend.load_module(&m.name, &m.source, &m.options) {
                Ok(image) => {
                    for (kid, k) in m.kernels.iter().zip(image.kernels) {
                        s.kernels.insert(*kid, k);
                    }
                }
                Err(e) => {
                    tracing::error!("client {client}'s module `{}` does not reload: {e}", m.name);
                    for kid in &m.kernels {
                        s.kernels.remove(kid);
                    }
                }
            }
        }
        self.sessions.insert(client, s);
        Ok(())
    }

    /// Tells every client the daemon stops, fails what they wait for, and lets them go.
    pub fn shutdown(&mut self) {
        let mut ops: Vec<_> = self.ops.iter().collect();
        ops.sort_by_key(|(op, _)| **op);
        for (_, e) in ops {
            let id = match &e.kind {
                OpKind::Copy { reply: Some(id) } | OpKind::Sync { reply: id } => Some(*id),
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

fn check_priority(limits: &ClientLimits, p: i32) -> Result<(), ErrorReply> {
    if p > limits.max_priority {
        return Err(err(
            ErrorKind::NotPermitted,
            format!("priority {p} is over your limit of {}", limits.max_priority),
        ));
    }
    Ok(())
}

fn check_weight(limits: &ClientLimits, w: f64) -> Result<(), ErrorReply> {
    if !(w.is_finite() && w > 0.0) {
        return Err(err(ErrorKind::Invalid, format!("a weight must be a number > 0, not {w}")));
    }
    if w > limits.max_weight {
        return Err(err(ErrorKind::NotPermitted, format!("weight {w} is over your limit of {}", limits.max_weight)));
    }
    Ok(())
}

fn no_event(e: EventId) -> ErrorReply {
    err(ErrorKind::NoSuchHandle, format!("event {} is not yours (or was destroyed)", e.0))
}

fn load_error(name: &str, e: LoadError) -> ErrorReply {
    match e {
        LoadError::Transform { line, message } => err(ErrorKind::Transform { line }, format!("{name}: {message}")),
        LoadError::Compile { log } => err(ErrorKind::Compile, format!("{name} does not compile:\n{log}")),
        LoadError::Device(m) => err(ErrorKind::Device, m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use gpumux_proto::{BufferSlice, MAGIC, VERSION};

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
        let hello = Request::Hello { magic: MAGIC, version: VERSION, name: "t".into(), priority: 0, weight: 1.0 };
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
}

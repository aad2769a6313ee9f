//! Several GPUs behind one daemon (issue 38; docs/multi-gpu.md): one core
//! per GPU, and each connection routed to one of them.
//!
//! A core (core.rs) owns one GPU whole: its engine and policy, its SMs and
//! memory, its device process. Serving N GPUs is N cores side by side, each
//! on its own thread, none aware of the others, so that a fault on one GPU
//! (a context rebuilt, a device process restarted) is that core's business
//! only, and nothing in a core had to learn about GPU indices.
//!
//! What is shared lives here:
//! * [`device_specs`]: `cuda:all`, `cuda:0,1` and `sim:h100x2` as one spec per GPU;
//! * [`GpuBoard`]: what a core publishes of its load (ops, memory) and what
//!   placement counts (clients), read without asking the core;
//! * [`Route`]: a connection's way to its core, held by its reader thread.
//!   With several GPUs it keeps the connection's `Connected` until the
//!   client's first message (its `Hello`, with any pin) and then places it
//!   ([`crate::placement`]); from then on it forwards to that core alone.
//!   A `Status` is the one request it answers from every core at once
//!   ([`Gpus::status`]).
//!
//! With `--rebalance`, a route also moves its client, idle, to a GPU left
//! with no client ([`Route::send`], `core/handover.rs`): the old core hands
//! the client's state over, the new one adopts it, and the route forwards
//! to the new one from then on. A launch split over GPUs goes to the
//! client's core like any request; that core sends the other cores their
//! parts itself (`core/split.rs`).

use crate::core::CoreMsg;
use crate::placement::{place, GpuLoad, Placement};
use gpumux_proto::{ClientClass, ErrorKind, ErrorReply, GpuStatus, Reply, Request, Status};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Most GPUs one `sim:NAMExN` device may have.
pub const MAX_SIM_GPUS: u32 = 16;

/// How long a `Status` waits for each core's part.
const STATUS_WAIT: Duration = Duration::from_secs(2);

/// A device spec the multi-GPU forms of which are malformed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// `cuda:all` on a machine whose driver sees no GPU.
    #[error("`{0}`: the CUDA driver sees no GPU (serve sim:h100x2 to try several GPUs without one)")]
    NoGpus(String),
    /// One GPU named twice.
    #[error("`{spec}` names GPU {gpu} twice")]
    Twice {
        /// The spec.
        spec: String,
        /// The GPU.
        gpu: u32,
    },
    /// `sim:NAMExN` with N out of range.
    #[error("`{spec}`: a simulated device has 1 to {MAX_SIM_GPUS} GPUs, not {n}")]
    SimCount {
        /// The spec.
        spec: String,
        /// The count asked for.
        n: u32,
    },
}

/// One spec per GPU: `cuda:all[,OPTS]` (every GPU the driver sees, counted
/// by `gpu_count`), `cuda:0,1[,OPTS]` (the leading numbers are GPUs, the
/// words after them options for each), `sim:NAMExN[,OPTS]` (N simulated
/// GPUs of preset NAME). Anything else is one GPU, its spec unchanged (and
/// checked where it is opened).
pub fn device_specs(spec: &str, gpu_count: impl FnOnce() -> i32) -> Result<Vec<String>, SpecError> {
    if let Some(rest) = spec.strip_prefix("cuda:") {
        let mut parts = rest.split(',');
        let first = parts.next().unwrap_or_default();
        let mut gpus: Vec<u32> = Vec::new();
        let mut options: Vec<&str> = Vec::new();
        if first == "all" {
            let n = gpu_count();
            if n <= 0 {
                return Err(SpecError::NoGpus(spec.to_string()));
            }
            gpus.extend(0..n as u32);
        } else {
            let Ok(g) = first.parse::<u32>() else { return Ok(vec![spec.to_string()]) };
            gpus.push(g);
        }
        for p in parts {
            match p.parse::<u32>() {
                Ok(g) if options.is_empty() => {
                    if gpus.contains(&g) {
                        return Err(SpecError::Twice { spec: spec.to_string(), gpu: g });
                    }
                    gpus.push(g);
                }
                // A number after an option: left to the spec's own parser to refuse.
                _ => options.push(p),
            }
        }
        let tail: String = options.iter().map(|o| format!(",{o}")).collect();
        return Ok(gpus.iter().map(|g| format!("cuda:{g}{tail}")).collect());
    }
    if let Some(rest) = spec.strip_prefix("sim:") {
        let (name, tail) = rest.split_once(',').map_or((rest, ""), |(n, t)| (n, t));
        let tail = if tail.is_empty() { String::new() } else { format!(",{tail}") };
        if let Some((preset, n)) = name.rsplit_once('x').and_then(|(p, n)| Some((p, n.parse::<u32>().ok()?))) {
            if !preset.is_empty() {
                if n == 0 || n > MAX_SIM_GPUS {
                    return Err(SpecError::SimCount { spec: spec.to_string(), n });
                }
                return Ok((0..n).map(|_| format!("sim:{preset}{tail}")).collect());
            }
        }
    }
    Ok(vec![spec.to_string()])
}

/// One GPU's load, as placement and `Status` read it without asking its core.
#[derive(Debug, Default)]
pub struct GpuBoard {
    /// Clients placed on it and still connected (kept by [`Route`]).
    clients: AtomicU32,
    /// Of those, the ones that declared themselves memory-bound, and
    /// compute-bound (`Hello::class`; the `pairs` placement reads them).
    memory_bound: AtomicU32,
    compute_bound: AtomicU32,
    /// Operations its core tracks (published by the core).
    ops: AtomicU32,
    /// Device memory its clients hold, bytes (published by the core).
    memory_used: AtomicU64,
    /// Its device memory, bytes.
    memory_total: AtomicU64,
    /// Its core has stopped (the device failed for good).
    down: AtomicBool,
    /// Since when its core has been rebuilding its device (a lost context,
    /// a device process started afresh), a wait that `Status` outlasts:
    /// [`GpuBoard::restarting`]. `None` the rest of the time.
    restarting: Mutex<Option<Instant>>,
    /// Context rebuilds its core has begun, for a `Status` row it cannot answer.
    rebuilds: AtomicU32,
    /// The device, in words (for `Status` once its core has stopped).
    device: Mutex<String>,
}

impl GpuBoard {
    /// A board for a GPU of `memory_total` bytes described as `device`.
    pub fn new(device: String, memory_total: u64) -> GpuBoard {
        let b = GpuBoard { device: Mutex::new(device), ..GpuBoard::default() };
        b.memory_total.store(memory_total, Ordering::Relaxed);
        b
    }

    /// The core's news: operations it tracks, memory its clients hold.
    pub fn publish(&self, ops: usize, memory_used: u64) {
        self.ops.store(u32::try_from(ops).unwrap_or(u32::MAX), Ordering::Relaxed);
        self.memory_used.store(memory_used, Ordering::Relaxed);
    }

    /// Its core stopped: placement skips it from now on.
    pub fn set_down(&self) {
        self.down.store(true, Ordering::SeqCst);
    }

    /// Its core begins rebuild number `rebuilds` of its device, until the
    /// guard is dropped: meanwhile a `Status` it cannot answer shows the GPU
    /// as restarting, with how long so far, not as stopped.
    pub fn restarting(self: &Arc<Self>, rebuilds: u32) -> Restarting {
        self.rebuilds.store(rebuilds, Ordering::Relaxed);
        *self.restarting.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        Restarting(Arc::clone(self))
    }

    /// How long its core has been rebuilding its device, if it is.
    fn restarting_for(&self) -> Option<Duration> {
        self.restarting.lock().unwrap_or_else(PoisonError::into_inner).map(|since| since.elapsed())
    }

    /// Counts a client of `class` in (`add`) or out.
    fn count(&self, class: Option<ClientClass>, add: bool) {
        let of_class = match class {
            Some(ClientClass::Memory) => Some(&self.memory_bound),
            Some(ClientClass::Compute) => Some(&self.compute_bound),
            None => None,
        };
        for n in std::iter::once(&self.clients).chain(of_class) {
            if add {
                n.fetch_add(1, Ordering::Relaxed);
            } else {
                n.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// What placement reads.
    pub fn load(&self) -> GpuLoad {
        let total = self.memory_total.load(Ordering::Relaxed);
        GpuLoad {
            up: !self.down.load(Ordering::SeqCst),
            clients: self.clients.load(Ordering::Relaxed),
            memory_bound: self.memory_bound.load(Ordering::Relaxed),
            compute_bound: self.compute_bound.load(Ordering::Relaxed),
            ops: self.ops.load(Ordering::Relaxed),
            memory_free: total.saturating_sub(self.memory_used.load(Ordering::Relaxed)),
        }
    }
}

/// A GPU's core rebuilding its device ([`GpuBoard::restarting`]); dropped
/// when the rebuild ends, whichever way.
pub struct Restarting(Arc<GpuBoard>);

impl Drop for Restarting {
    fn drop(&mut self) {
        *self.0.restarting.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// The daemon's GPUs: each one's core and board, and the placement policy.
pub struct Gpus {
    cores: Vec<Sender<CoreMsg>>,
    boards: Vec<Arc<GpuBoard>>,
    placement: Placement,
    /// One placement at a time: reading the loads and counting the client in
    /// are one step, so clients connecting together spread.
    placing: Mutex<()>,
    /// `--rebalance`: an idle client moves to a GPU left with no client, or
    /// a declared one to where it pairs ([`Route::send`], [`crate::placement::rebalance_to`]).
    rebalance: bool,
}

impl Gpus {
    /// GPU i is served by `cores[i]`, its load on `boards[i]`.
    pub fn new(cores: Vec<Sender<CoreMsg>>, boards: Vec<Arc<GpuBoard>>, placement: Placement) -> Gpus {
        debug_assert_eq!(cores.len(), boards.len());
        Gpus { cores, boards, placement, placing: Mutex::new(()), rebalance: false }
    }

    /// Moves idle clients to GPUs left with no client, and declared ones to
    /// where they pair (`--rebalance`; off by default).
    pub fn with_rebalance(mut self, on: bool) -> Gpus {
        self.rebalance = on;
        self
    }

    /// Reserves a move for a client on `from`: the GPU it should go to
    /// ([`crate::placement::rebalance_to`]), counted there at once so that
    /// two clients do not both go, with that GPU's free memory.
    fn reserve_move(&self, from: usize, class: Option<ClientClass>) -> Option<(usize, u64)> {
        let loads = || -> Vec<GpuLoad> { self.boards.iter().map(|b| b.load()).collect() };
        // Asked at every request: the lock only when a move looks due.
        crate::placement::rebalance_to(&loads(), from, class)?;
        let _one = self.placing.lock().unwrap_or_else(PoisonError::into_inner);
        let loads = loads();
        let to = crate::placement::rebalance_to(&loads, from, class)?;
        self.boards[to].count(class, true);
        Some((to, loads[to].memory_free))
    }

    /// How many GPUs.
    pub fn len(&self) -> usize {
        self.cores.len()
    }

    /// Whether there are none (never, once the daemon runs).
    pub fn is_empty(&self) -> bool {
        self.cores.is_empty()
    }

    /// Every core's channel (shutdown goes to all).
    pub fn cores(&self) -> &[Sender<CoreMsg>] {
        &self.cores
    }

    /// Places a client pinned to `pin` (if any), of `class` (if declared),
    /// and counts it on its GPU.
    fn place(&self, pin: Option<u32>, class: Option<ClientClass>) -> Result<usize, ErrorReply> {
        let _one = self.placing.lock().unwrap_or_else(PoisonError::into_inner);
        let loads: Vec<GpuLoad> = self.boards.iter().map(|b| b.load()).collect();
        let g = place(self.placement, &loads, pin, class)
            .map_err(|e| ErrorReply::new(ErrorKind::Invalid, e.to_string()))?;
        self.boards[g].count(class, true);
        Ok(g)
    }

    /// Every GPU's part of `Status`, merged: each core answers for its own
    /// clients; a GPU whose core does not answer within `STATUS_WAIT` is a
    /// row of what its board knows (`Gpus::unanswered_row`).
    pub fn status(&self) -> Status {
        self.status_within(STATUS_WAIT)
    }

    /// [`Gpus::status`], waiting `wait` for each core.
    fn status_within(&self, wait: Duration) -> Status {
        let mut parts = Vec::with_capacity(self.len());
        let mut unanswered = Vec::new();
        for (i, core) in self.cores.iter().enumerate() {
            let (tx, rx) = channel();
            let part = core.send(CoreMsg::Status { reply: tx }).ok().and_then(|()| rx.recv_timeout(wait).ok());
            match part {
                Some(s) => parts.push(s),
                None => unanswered.push(self.unanswered_row(i, wait)),
            }
        }
        let mut merged = merge_status(parts);
        merged.gpus.extend(unanswered);
        merged.gpus.sort_by_key(|g| g.gpu);
        merged
    }

    /// The row of GPU `gpu`, whose core did not answer within `wait`: stopped
    /// (its core ended), restarting its device (a rebuild holds its core:
    /// for how long so far, and the rebuilds counted with this one), or busy.
    /// Its clients are the ones placed there; nothing else is known.
    fn unanswered_row(&self, gpu: usize, wait: Duration) -> GpuStatus {
        let b = &self.boards[gpu];
        let device = b.device.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let (state, clients, context_rebuilds) = if b.down.load(Ordering::SeqCst) {
            ("stopped".to_string(), 0, 0)
        } else if let Some(t) = b.restarting_for() {
            let n = b.rebuilds.load(Ordering::Relaxed);
            (format!("restarting its device, {:.1} s so far", t.as_secs_f64()), b.clients.load(Ordering::Relaxed), n)
        } else {
            let busy = format!("busy: no answer in {:.1} s", wait.as_secs_f64());
            (busy, b.clients.load(Ordering::Relaxed), b.rebuilds.load(Ordering::Relaxed))
        };
        GpuStatus {
            gpu: gpu as u32,
            device: format!("{device} ({state})"),
            sms: 0,
            sms_busy: 0,
            memory_used: 0,
            memory_total: b.memory_total.load(Ordering::Relaxed),
            clients,
            ops: 0,
            context_rebuilds,
        }
    }
}

/// Several GPUs' `Status` as one: the clients of all, one row per GPU, and
/// totals. Empty: a status of no GPU.
pub fn merge_status(parts: Vec<Status>) -> Status {
    let mut it = parts.into_iter();
    let Some(mut all) = it.next() else {
        return Status {
            device: "no GPU".into(),
            policy: String::new(),
            sms: 0,
            memory_used: 0,
            memory_total: 0,
            memory_evicted: 0,
            swap_memory: 0,
            evictions: 0,
            restores: 0,
            host_memory_used: 0,
            uptime_s: 0.0,
            context_rebuilds: 0,
            clients: Vec::new(),
            gpus: Vec::new(),
        };
    };
    let mut devices = vec![all.device.clone()];
    for s in it {
        devices.push(s.device);
        all.sms += s.sms;
        all.memory_used += s.memory_used;
        all.memory_total += s.memory_total;
        all.memory_evicted += s.memory_evicted;
        all.swap_memory += s.swap_memory;
        all.evictions += s.evictions;
        all.restores += s.restores;
        all.host_memory_used += s.host_memory_used;
        all.uptime_s = all.uptime_s.max(s.uptime_s);
        all.context_rebuilds += s.context_rebuilds;
        all.clients.extend(s.clients);
        all.gpus.extend(s.gpus);
    }
    if devices.len() > 1 {
        all.device = format!("{} GPUs: {}", devices.len(), devices.join("; "));
    }
    all.clients.sort_by_key(|c| c.client);
    all.gpus.sort_by_key(|g| g.gpu);
    all
}

/// A connection's way to its core (module doc); owned by its reader thread.
pub struct Route {
    gpus: Arc<Gpus>,
    client: u64,
    /// The connection's `Connected`, held until its first message places it.
    pending: Option<CoreMsg>,
    /// Its GPU, once placed.
    gpu: Option<usize>,
    /// It pinned itself (`Hello::gpu`): it never moves.
    pinned: bool,
    /// The class it declared (`Hello::class`), counted on its GPU's board.
    class: Option<ClientClass>,
}

impl Route {
    /// A route for the connection `connected` announces (a
    /// [`CoreMsg::Connected`]). With one GPU it goes to that GPU's core now,
    /// as it always did; with several it waits for the client's `Hello`.
    /// False: the core is gone.
    pub fn new(gpus: &Arc<Gpus>, client: u64, connected: CoreMsg) -> (Route, bool) {
        let mut route = Route { gpus: gpus.clone(), client, pending: None, gpu: None, pinned: false, class: None };
        if gpus.len() == 1 {
            route.gpu = Some(0);
            gpus.boards[0].count(None, true);
            let sent = gpus.cores[0].send(connected).is_ok();
            return (route, sent);
        }
        route.pending = Some(connected);
        (route, true)
    }

    /// The GPU the client was placed on, if it was.
    pub fn gpu(&self) -> Option<usize> {
        self.gpu
    }

    /// The channel to the client's core, once placed.
    pub fn core(&self) -> Option<&Sender<CoreMsg>> {
        self.gpu.map(|g| &self.gpus.cores[g])
    }

    /// Sends `msg` to the client's core, placing the client first if it is
    /// not yet (its `Hello`'s pin, else the placement policy). False: the
    /// core is gone.
    pub fn send(&mut self, msg: CoreMsg) -> bool {
        let msg = match self.gpu {
            Some(from) => {
                if self.gpus.rebalance && !self.pinned && moves_with(&msg) {
                    self.try_move(from);
                }
                self.answer_here(msg)
            }
            None => match self.place(msg) {
                Placed::Send(msg) => msg,
                // Gone before saying anything: no core ever heard of it.
                Placed::Left => return true,
                Placed::Nowhere => return false,
            },
        };
        match self.core() {
            Some(core) => core.send(msg).is_ok(),
            None => false,
        }
    }

    /// With several GPUs, a `Status` is every core's, gathered here (the
    /// reader thread waits, not a core); the client's core only sends it.
    /// A pin in a `Hello` that came placed (one GPU) is checked here too.
    fn answer_here(&self, msg: CoreMsg) -> CoreMsg {
        match msg {
            CoreMsg::Inbound {
                client,
                inbound: crate::conn::Inbound::Request { id, request: Request::Status, .. },
                read_at,
            } if self.gpus.len() > 1 => {
                let result = Ok(Reply::Status(self.gpus.status()));
                CoreMsg::Inbound { client, inbound: crate::conn::Inbound::Answered { id, result }, read_at }
            }
            CoreMsg::Inbound {
                client,
                inbound: crate::conn::Inbound::Request { id, request: Request::Hello { gpu: Some(pin), .. }, .. },
                read_at,
            } if pin as usize >= self.gpus.len() => {
                let error = ErrorReply::new(
                    ErrorKind::Invalid,
                    crate::placement::PlaceError::NoSuchGpu { asked: pin, serving: "0".into() }.to_string(),
                );
                CoreMsg::Inbound { client, inbound: crate::conn::Inbound::Refused { id, error }, read_at }
            }
            other => other,
        }
    }

    /// Places the client on its first message, and sends its `Connected`
    /// there; what is left to send (module doc).
    fn place(&mut self, msg: CoreMsg) -> Placed {
        let Some(pending) = self.pending.take() else { return Placed::Nowhere };
        if matches!(msg, CoreMsg::Disconnected { .. }) {
            return Placed::Left;
        }
        let (pin, class, hello_id) = match &msg {
            CoreMsg::Inbound {
                inbound: crate::conn::Inbound::Request { id, request: Request::Hello { gpu, class, .. }, .. },
                ..
            } => (*gpu, *class, Some(*id)),
            _ => (None, None, None),
        };
        self.pinned = pin.is_some();
        self.class = class;
        let (gpu, msg) = match self.gpus.place(pin, class) {
            Ok(g) => (g, msg),
            Err(error) => {
                // Refused by a core that takes clients: it answers and lets go.
                let Ok(g) = self.gpus.place(None, class) else { return Placed::Nowhere };
                tracing::info!("client {}: {}", self.client, error.message);
                let refused = crate::conn::Inbound::Refused { id: hello_id.unwrap_or(0), error };
                (g, CoreMsg::Inbound { client: self.client, inbound: refused, read_at: std::time::Instant::now() })
            }
        };
        self.gpu = Some(gpu);
        match class {
            Some(c) => tracing::debug!("client {} ({} bound) placed on GPU {gpu}", self.client, c.name()),
            None => tracing::debug!("client {} placed on GPU {gpu}", self.client),
        }
        // A send that fails is seen on the message's own send.
        let _ = self.gpus.cores[gpu].send(pending);
        Placed::Send(msg)
    }
}

impl Route {
    /// `--rebalance`: moves the client from GPU `from` to a GPU left with no
    /// client, if there is one and its core hands the client over (idle,
    /// fitting: `core/handover.rs`); else it stays. The reader thread waits
    /// for the old core's answer, so no request of the client passes it.
    fn try_move(&mut self, from: usize) {
        let Some((to, room)) = self.gpus.reserve_move(from, self.class) else { return };
        let (tx, rx) = channel();
        let asked = self.gpus.cores[from].send(CoreMsg::HandOver { client: self.client, room, reply: tx }).is_ok();
        // The old core always answers, unless it stopped (its sender dropped).
        match rx.recv().ok().filter(|_| asked) {
            Some(Ok(h)) => {
                if self.gpus.cores[to].send(CoreMsg::Adopt(Box::new(h))).is_err() {
                    // The new core stopped since the reservation: the state went
                    // with the message, and the client's next request finds its core gone.
                    tracing::error!("client {}: GPU {to} stopped while the client moved there", self.client);
                }
                self.gpus.boards[from].count(self.class, false);
                self.gpu = Some(to);
            }
            Some(Err(why)) => {
                tracing::debug!("client {} stays on GPU {from}: {why}", self.client);
                self.gpus.boards[to].count(self.class, false);
            }
            None => {
                self.gpus.boards[to].count(self.class, false);
            }
        }
    }
}

/// Whether a request is a moment to move its client: one of its own work
/// (not its `Hello`, nor a `Status`, answered by every core).
fn moves_with(msg: &CoreMsg) -> bool {
    matches!(
        msg,
        CoreMsg::Inbound { inbound: crate::conn::Inbound::Request { request, .. }, .. }
            if !matches!(request, Request::Hello { .. } | Request::Status)
    )
}

/// What [`Route::place`] did with a connection's first message.
enum Placed {
    /// Placed: send this to its core.
    Send(CoreMsg),
    /// The client left before saying anything: no core ever heard of it.
    Left,
    /// No GPU takes clients (every core has stopped), or it was placed already.
    Nowhere,
}

impl Drop for Route {
    fn drop(&mut self) {
        if let Some(g) = self.gpu {
            self.gpus.boards[g].count(self.class, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_gpu_specs_become_one_spec_per_gpu() {
        let none = || 0;
        let two = || 2;
        assert_eq!(device_specs("cuda:0", none), Ok(vec!["cuda:0".to_string()]));
        assert_eq!(device_specs("cuda:0,own-sms", none), Ok(vec!["cuda:0,own-sms".to_string()]));
        assert_eq!(device_specs("cuda:0,1", none), Ok(vec!["cuda:0".to_string(), "cuda:1".to_string()]));
        assert_eq!(
            device_specs("cuda:1,0,no-queue-ahead", none),
            Ok(vec!["cuda:1,no-queue-ahead".to_string(), "cuda:0,no-queue-ahead".to_string()])
        );
        assert_eq!(device_specs("cuda:all", two), Ok(vec!["cuda:0".to_string(), "cuda:1".to_string()]));
        assert_eq!(
            device_specs("cuda:all,own-sms", two),
            Ok(vec!["cuda:0,own-sms".to_string(), "cuda:1,own-sms".to_string()])
        );
        assert_eq!(device_specs("cuda:all", none), Err(SpecError::NoGpus("cuda:all".into())));
        assert_eq!(device_specs("cuda:0,0", none), Err(SpecError::Twice { spec: "cuda:0,0".into(), gpu: 0 }));
        // Malformed single specs are left for their parser's message.
        assert_eq!(device_specs("cuda:x", none), Ok(vec!["cuda:x".to_string()]));
        assert_eq!(device_specs("sim:h100x2", none), Ok(vec!["sim:h100".to_string(), "sim:h100".to_string()]));
        assert_eq!(device_specs("sim:h200x3,memory=1GiB", none), Ok(vec!["sim:h200,memory=1GiB".to_string(); 3]));
        assert_eq!(device_specs("sim:h100", none), Ok(vec!["sim:h100".to_string()]));
        assert_eq!(device_specs("sim:k20c", none), Ok(vec!["sim:k20c".to_string()]));
        assert_eq!(device_specs("sim:h100x0", none), Err(SpecError::SimCount { spec: "sim:h100x0".into(), n: 0 }));
        assert!(device_specs("sim:h100x99", none).is_err());
    }

    fn status(device: &str, gpu: u32, clients: &[u64]) -> Status {
        let row = |client| gpumux_proto::ClientStatus {
            client,
            gpu,
            pid: 1,
            uid: 1,
            gid: 1,
            name: format!("c{client}"),
            priority: 0,
            weight: 1.0,
            memory_used: 10,
            memory_evicted: 0,
            memory_quota: 100,
            host_memory_used: 0,
            host_memory_quota: 0,
            ops_queued: 0,
            ops_running: 0,
            sms_held: 2,
            preemptions: 0,
            kernels_done: 0,
        };
        Status {
            device: device.into(),
            policy: "p".into(),
            sms: 132,
            memory_used: 10 * clients.len() as u64,
            memory_total: 1000,
            memory_evicted: 0,
            swap_memory: 50,
            evictions: 0,
            restores: 0,
            host_memory_used: 0,
            uptime_s: gpu as f64,
            context_rebuilds: gpu,
            clients: clients.iter().map(|&c| row(c)).collect(),
            gpus: vec![GpuStatus {
                gpu,
                device: device.into(),
                sms: 132,
                sms_busy: 2 * clients.len() as u32,
                memory_used: 10 * clients.len() as u64,
                memory_total: 1000,
                clients: clients.len() as u32,
                ops: 0,
                context_rebuilds: gpu,
            }],
        }
    }

    #[test]
    fn statuses_merge_into_totals_with_a_row_per_gpu() {
        let s = merge_status(vec![status("a", 0, &[1, 4]), status("b", 1, &[2, 3, 5])]);
        assert_eq!(
            s.clients.iter().map(|c| (c.client, c.gpu)).collect::<Vec<_>>(),
            [(1, 0), (2, 1), (3, 1), (4, 0), (5, 1)]
        );
        assert_eq!((s.sms, s.memory_used, s.memory_total, s.swap_memory), (264, 50, 2000, 100));
        assert_eq!(s.gpus.iter().map(|g| (g.gpu, g.clients)).collect::<Vec<_>>(), [(0, 2), (1, 3)]);
        assert_eq!((s.context_rebuilds, s.uptime_s), (1, 1.0));
        assert_eq!(s.device, "2 GPUs: a; b");
        let one = merge_status(vec![status("a", 0, &[1])]);
        assert_eq!(one, status("a", 0, &[1]), "one GPU's status is unchanged");
    }

    /// Two GPUs, no core threads: the route holds `Connected` until the
    /// Hello, places by it, and counts the client until it leaves.
    /// A GPU whose core does not answer `Status` is shown as what its board
    /// says: restarting its device (with how long so far and the rebuilds
    /// counted), stopped, or busy; it used to be "(stopped)" in every case,
    /// a GPU that was only restarting its device process among them. GPU 0
    /// answers; its row is the core's own.
    #[test]
    fn a_gpu_that_does_not_answer_shows_as_restarting_stopped_or_busy() {
        let boards: Vec<Arc<GpuBoard>> =
            ["a", "b", "c", "d"].iter().map(|d| Arc::new(GpuBoard::new(d.to_string(), 100))).collect();
        let (txs, mut rxs): (Vec<_>, Vec<_>) = boards.iter().map(|_| channel::<CoreMsg>()).unzip();
        let gpus = Gpus::new(txs, boards.clone(), Placement::Pairs);
        boards[1].count(None, true);
        let restarting = boards[1].restarting(3);
        boards[2].set_down();
        let answers = status("a", 0, &[7]);
        let rx0 = rxs.remove(0);
        let core0 = std::thread::spawn(move || {
            if let Ok(CoreMsg::Status { reply }) = rx0.recv() {
                let _ = reply.send(answers);
            }
        });
        // The others are asked and never answer (their receivers live on, unread).
        std::thread::sleep(Duration::from_millis(300));
        let answered = gpus.status_within(Duration::from_millis(200));
        core0.join().expect("core 0 answered");
        let rows: Vec<(u32, String, u32, u32)> =
            answered.gpus.iter().map(|g| (g.gpu, g.device.clone(), g.clients, g.context_rebuilds)).collect();
        assert_eq!(rows[0], (0, "a".to_string(), 1, 0), "{rows:?}");
        let (gpu, device, clients, rebuilds) = &rows[1];
        assert_eq!((*gpu, *clients, *rebuilds), (1, 1, 3), "{rows:?}");
        let secs: f64 = device
            .strip_prefix("b (restarting its device, ")
            .and_then(|r| r.strip_suffix(" s so far)"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("GPU 1 restarting, with how long: {device}"));
        assert!(secs >= 0.3, "restarting for at least the 0.3 s slept: {device}");
        assert_eq!(rows[2], (2, "c (stopped)".to_string(), 0, 0));
        assert_eq!(rows[3], (3, "d (busy: no answer in 0.2 s)".to_string(), 0, 0));
        assert_eq!(answered.clients.len(), 1, "only the answering core's clients are rows");
        // The rebuild over, the same GPU that does not answer is busy, not restarting.
        drop(restarting);
        let later = gpus.status_within(Duration::from_millis(10));
        assert_eq!(later.gpus[1].device, "b (busy: no answer in 0.0 s)");
        assert_eq!(later.gpus[1].context_rebuilds, 3, "the rebuilds counted stay");
        drop(rxs);
    }

    #[test]
    fn a_route_places_on_hello_and_counts_its_client_until_dropped() {
        let (tx0, rx0) = channel();
        let (tx1, rx1) = channel();
        let boards = vec![Arc::new(GpuBoard::new("a".into(), 100)), Arc::new(GpuBoard::new("b".into(), 100))];
        let gpus = Arc::new(Gpus::new(vec![tx0, tx1], boards.clone(), Placement::LeastLoaded));
        let connected = |client| {
            let (out, _) = channel();
            CoreMsg::Connected {
                client,
                peer: crate::session::Peer { pid: 1, uid: 1, gid: 1 },
                limits: crate::config::ClientLimits::default(),
                out,
                spin: crate::spin::ConnSpin::default(),
                outbox: None,
            }
        };
        let hello = |client, gpu| CoreMsg::Inbound {
            client,
            inbound: crate::conn::Inbound::Request {
                id: 1,
                request: Request::Hello {
                    magic: gpumux_proto::MAGIC,
                    version: gpumux_proto::VERSION,
                    name: "t".into(),
                    priority: 0,
                    weight: 1.0,
                    gpu,
                    class: None,
                },
                fd: None,
            },
            read_at: std::time::Instant::now(),
        };
        let (mut a, sent) = Route::new(&gpus, 1, connected(1));
        assert!(sent);
        assert!(rx0.try_recv().is_err() && rx1.try_recv().is_err(), "nothing before the Hello");
        assert!(a.send(hello(1, Some(1))));
        assert_eq!(a.gpu(), Some(1), "pinned");
        assert!(matches!(rx1.try_recv(), Ok(CoreMsg::Connected { client: 1, .. })));
        assert!(matches!(rx1.try_recv(), Ok(CoreMsg::Inbound { .. })));
        let (mut b, _) = Route::new(&gpus, 2, connected(2));
        assert!(b.send(hello(2, None)));
        assert_eq!(b.gpu(), Some(0), "least loaded: GPU 1 has the pinned client");
        let (mut c, _) = Route::new(&gpus, 3, connected(3));
        assert!(c.send(hello(3, Some(7))));
        let refused = rx0.try_iter().chain(rx1.try_iter()).find_map(|m| match m {
            CoreMsg::Inbound { client: 3, inbound: crate::conn::Inbound::Refused { id, error }, .. } => {
                Some((id, error))
            }
            _ => None,
        });
        let (id, error) = refused.unwrap_or_else(|| panic!("no refusal for the pin to GPU 7"));
        assert_eq!(id, 1);
        assert!(error.message.contains("no GPU 7") && error.message.contains("GPU 0, 1"), "{}", error.message);
        assert_eq!(boards.iter().map(|b| b.load().clients).collect::<Vec<_>>(), [2, 1]);
        drop((a, c));
        assert_eq!(boards.iter().map(|b| b.load().clients).collect::<Vec<_>>(), [1, 0]);
        drop(b);
        // One that leaves before its Hello never reaches a core nor counts.
        let (mut d, _) = Route::new(&gpus, 4, connected(4));
        assert!(d.send(CoreMsg::Disconnected { client: 4 }));
        assert_eq!(d.gpu(), None);
        assert!(rx0.try_recv().is_err() && rx1.try_recv().is_err());
    }
}

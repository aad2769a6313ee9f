//! The socket side: bind, accept, check the peer's credentials against the
//! config before anything else, then one reader and one writer thread per
//! client. Readers turn bytes into [`Inbound`]s through a [`Connection`] and
//! pass them to the core; writers send what the core queues for them.
//!
//! A client that asks (`UseRings`, right after `Hello`) moves its
//! conversation onto two shared-memory rings (`gpumux-ring`): its reader
//! maps them and answers the request itself (the answer goes out in turn,
//! through the core), opens the connection's [`Outbox`] on the outgoing ring
//! (the core writes replies into it directly, the writer when it must wait
//! for room), and from then on polls its ring instead of the socket, which
//! carries only doorbells, the descriptors of `AttachShm` and `AttachHost`,
//! and the end of the connection.
//!
//! The daemon's own limits (`[limits]`, [`ServerLimits`]) are kept here:
//! connections in all and per uid (checked at accept, before a thread is
//! started: a refused peer gets one `Quota` error frame naming the limit,
//! sent without waiting, and is closed), a deadline for `Hello` and one for
//! each frame once its first byte came (the reader's waits end at them: a
//! `Protocol` error naming the limit, then the connection closes), and the
//! `outstanding` backlog past which the reader stops reading (`outbox`).

use crate::config::{Config, ServerLimits};
use crate::conn::{Connection, Inbound};
use crate::core::CoreMsg;
use crate::gpus::{Gpus, Route};
use crate::outbox::Outbox;
use crate::session::Peer;
use crate::spin::ConnSpin;
use gpumux_proto::{encode_frame, ErrorKind, ErrorReply, Reply, Request, ServerFrame};
use gpumux_ring::{RingPair, RingReceiver};
use std::collections::HashMap;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes one `recvmsg` reads at most.
const READ_CHUNK: usize = 64 << 10;
/// How long a reader polls its socket after a request before it sleeps on
/// it: the next request of a client that is working arrives within tens of
/// µs, and one caught here saves the wake-up of a thread blocked in
/// `recvmsg` (several µs, more in a virtual machine) on the request's path.
/// The cost is one core per busy client for at most this long (yielding
/// between tries, like every poll of the daemon's).
const READER_SPIN: Duration = Duration::from_micros(100);
/// A writer gives up on a client that does not read for this long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the accept loop looks at the shutdown flag.
const ACCEPT_POLL_MS: i32 = 100;

/// Why the socket could not be served.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Another daemon answers on the path.
    #[error("a daemon already answers on {0} (stop it, or give another --socket)")]
    InUse(String),
    /// Creating the directory, removing a stale socket or binding failed.
    #[error("cannot listen on {path}: {cause}")]
    Bind {
        /// The socket path.
        path: String,
        /// Why (in the message, not also the error's source).
        cause: std::io::Error,
    },
}

/// Binds `path`: creates its directory if missing, refuses if a live daemon
/// answers there, replaces a stale socket file.
pub fn bind(path: &Path) -> Result<UnixListener, ServerError> {
    let bind_err = |cause| ServerError::Bind { path: path.display().to_string(), cause };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(bind_err)?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(ServerError::InUse(path.display().to_string()));
        }
        tracing::info!("removing the stale socket {}", path.display());
        std::fs::remove_file(path).map_err(bind_err)?;
    }
    let listener = UnixListener::bind(path).map_err(bind_err)?;
    // Anyone may reach the socket; who may talk is the config's to decide (SO_PEERCRED).
    use std::os::unix::fs::PermissionsExt;
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)) {
        // Not left behind for the next start to call stale.
        let _ = std::fs::remove_file(path);
        return Err(bind_err(e));
    }
    Ok(listener)
}

/// The kernel's word on who is at the other end.
pub fn peer_credentials(stream: &UnixStream) -> std::io::Result<Peer> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills a ucred of the size given on a socket we own.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Peer { pid: cred.pid, uid: cred.uid, gid: cred.gid })
}

/// Set by SIGINT/SIGTERM.
static SHUTDOWN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SHUTDOWN.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM ask the accept loop to stop.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Whether a signal asked the daemon to stop.
pub fn shutdown_requested() -> bool {
    SHUTDOWN.load(Ordering::SeqCst)
}

/// How long a writer polls its queue after a frame before it sleeps: a
/// client's replies come in bursts (a launch's, then its sync's a few tens
/// of µs later), and each one caught here saves a wake-up of several µs
/// on the reply's path. A writer is busy for at most this long per burst.
const WRITER_SPIN: Duration = Duration::from_micros(100);

/// A ring poll reads the socket too (for the client's end) once every
/// this many tries: a system call per try would cost what the ring saves.
const SOCKET_EVERY: u32 = 64;

/// The writer's next frame (`None` once the core dropped its sender).
fn next_frame(rx: &Receiver<ServerFrame>, spin: &ConnSpin) -> Option<ServerFrame> {
    let start = Instant::now();
    let window = spin.window(WRITER_SPIN);
    let mut looks = 0u32;
    loop {
        match rx.try_recv() {
            Ok(f) => return Some(f),
            Err(TryRecvError::Disconnected) => return None,
            // Not `spin.held()`: a ringed client's replies are written by the
            // core itself while the writer has none queued, so a cadence or a
            // copy's hold would keep this thread polling for nothing.
            Err(TryRecvError::Empty) if start.elapsed() < window => gpumux_ring::relax(looks),
            Err(TryRecvError::Empty) => return rx.recv().ok(),
        }
        looks = looks.saturating_add(1);
    }
}

fn send_frame(stream: &mut UnixStream, frame: &ServerFrame) -> std::io::Result<()> {
    let bytes = encode_frame(frame).map_err(std::io::Error::other)?;
    stream.write_all(&bytes)
}

/// Refuses a peer before any thread is started for it: one error frame,
/// written without waiting (a fresh socket has room for it; if not, the
/// peer only sees the close), then the connection closes.
fn refuse_at_accept(mut stream: UnixStream, kind: ErrorKind, message: String) {
    let frame = ServerFrame::Reply { id: 0, result: Err(ErrorReply::new(kind, message)) };
    if stream.set_nonblocking(true).is_ok() {
        let _ = send_frame(&mut stream, &frame);
    }
}

/// `5 s`, `500 ms`: a limit's duration as a message says it.
pub fn say_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Connections open now, in all and per uid, against `[limits]`.
#[derive(Debug, Default)]
struct OpenCounts {
    total: u32,
    per_uid: HashMap<u32, u32>,
    /// Connections closed since the daemon started (when to trim the heap: [`crate::heap`]).
    closed: u64,
}

/// One admitted connection's place in [`OpenCounts`]: shared by its reader
/// and writer threads, given back when both have ended.
#[derive(Debug)]
struct Slot {
    uid: u32,
    counts: Arc<Mutex<OpenCounts>>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        c.total = c.total.saturating_sub(1);
        c.closed += 1;
        if let Some(n) = c.per_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.per_uid.remove(&self.uid);
            }
        }
    }
}

/// Takes a slot for a peer of `uid`, or says which limit is full.
fn take_slot(counts: &Arc<Mutex<OpenCounts>>, uid: u32, limits: &ServerLimits) -> Result<Slot, String> {
    let mut c = counts.lock().unwrap_or_else(PoisonError::into_inner);
    if c.total >= limits.connections {
        return Err(format!(
            "the daemon has {} connections open, its limit ([limits] connections in its config); try again later",
            limits.connections
        ));
    }
    let mine = c.per_uid.get(&uid).copied().unwrap_or(0);
    if mine >= limits.connections_per_uid {
        return Err(format!(
            "uid {uid} has {} connections open, its limit ([limits] connections_per_uid in the daemon's \
             config); close some first",
            limits.connections_per_uid
        ));
    }
    c.total += 1;
    *c.per_uid.entry(uid).or_insert(0) += 1;
    Ok(Slot { uid, counts: counts.clone() })
}

/// Refusals logged at most once a second, with how many were not.
#[derive(Debug)]
struct RefusalLog {
    last: Option<Instant>,
    quiet: u64,
}

impl RefusalLog {
    fn note(&mut self, line: impl FnOnce() -> String) {
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.quiet += 1;
            return;
        }
        let more = std::mem::take(&mut self.quiet);
        if more > 0 {
            tracing::warn!("{} ({more} more refused since the last such line)", line());
        } else {
            tracing::warn!("{}", line());
        }
        self.last = Some(now);
    }
}

/// Accepts clients until `stop()` says so; their threads' handles go to `threads`.
pub fn serve(
    listener: &UnixListener,
    config: &Config,
    gpus: &Arc<Gpus>,
    threads: &mut Vec<JoinHandle<()>>,
    mut stop: impl FnMut() -> bool,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut next_client = 1u64;
    let counts = Arc::new(Mutex::new(OpenCounts::default()));
    let mut refusals = RefusalLog { last: None, quiet: 0 };
    let mut trimmer = crate::heap::Trimmer::default();
    while !stop() {
        let closed = counts.lock().unwrap_or_else(PoisonError::into_inner).closed;
        trimmer.tick(closed);
        let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, valid for the call.
        unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => continue,
            Err(e) => {
                // Out of descriptors or memory: the listener stays readable,
                // so wait a little rather than spin on it.
                refusals.note(|| format!("accept: {e}"));
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let accepted = Instant::now();
        threads.retain(|t| !t.is_finished());
        let client = next_client;
        next_client += 1;
        if let Err(e) = admit(client, stream, accepted, config, gpus, threads, &counts, &mut refusals) {
            tracing::warn!("client {client}: {e}");
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn admit(
    client: u64,
    stream: UnixStream,
    accepted: Instant,
    config: &Config,
    gpus: &Arc<Gpus>,
    threads: &mut Vec<JoinHandle<()>>,
    counts: &Arc<Mutex<OpenCounts>>,
    refusals: &mut RefusalLog,
) -> std::io::Result<()> {
    let peer = peer_credentials(&stream)?;
    let Some(limits) = config.limits_for(peer.uid, peer.gid).cloned() else {
        tracing::info!("refused pid {} uid {} gid {}: not allowed by the config", peer.pid, peer.uid, peer.gid);
        let message = format!(
            "uid {} (gid {}) may not use this daemon: its config has no [[allow]] entry for it",
            peer.uid, peer.gid
        );
        refuse_at_accept(stream, ErrorKind::NotPermitted, message);
        return Ok(());
    };
    let slot = match take_slot(counts, peer.uid, &config.limits) {
        Ok(slot) => Arc::new(slot),
        Err(why) => {
            refusals.note(|| format!("refused pid {} uid {}: {why}", peer.pid, peer.uid));
            refuse_at_accept(stream, ErrorKind::Quota, why);
            return Ok(());
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let (tx, rx) = channel::<ServerFrame>();
    // Shared by the core and the writer; the reader opens its ring.
    let outbox = Arc::new(Outbox::default());
    let writer_outbox = outbox.clone();
    let reader_outbox = outbox.clone();
    let mut writer = stream.try_clone()?;
    let reader = stream;
    let spin = ConnSpin::default();
    let writer_spin = spin.clone();
    let writer_slot = slot.clone();
    let spawned = std::thread::Builder::new().name(format!("gpumuxd-w{client}")).spawn(move || {
        let _slot = writer_slot;
        while let Some(frame) = next_frame(&rx, &writer_spin) {
            let window = writer_spin.window(WRITER_SPIN);
            let cost = crate::outbox::frame_cost(&frame);
            let sent = match writer_outbox.write_ring(&frame, window, WRITE_TIMEOUT) {
                Some(sent) => sent,
                None => send_frame(&mut writer, &frame),
            };
            writer_outbox.written(cost);
            if let Err(e) = sent {
                tracing::debug!("client {client}: write failed: {e}");
                break;
            }
        }
        writer_outbox.close();
        let _ = writer.shutdown(std::net::Shutdown::Both);
    });
    match spawned {
        Ok(t) => threads.push(t),
        Err(e) => {
            // A thread that cannot start refuses its connection, not the daemon.
            let why = format!("the daemon cannot start a thread for this connection now ({e}); try again later");
            refusals.note(|| format!("refused pid {} uid {}: {why}", peer.pid, peer.uid));
            refuse_at_accept(reader, ErrorKind::Quota, why);
            return Ok(());
        }
    }
    let reader_spin = spin.clone();
    // With several GPUs the route places the client on its Hello (gpus.rs).
    let peer_pid = peer.pid.max(0) as u64;
    let connected = CoreMsg::Connected { client, peer, limits, out: tx, spin, outbox: Some(outbox) };
    let (route, sent) = Route::new(gpus, client, connected);
    if !sent {
        return Err(std::io::Error::other("the core is gone"));
    }
    let failed_core = route.core().cloned();
    let server_limits = config.limits.clone();
    let spawned = std::thread::Builder::new().name(format!("gpumuxd-r{client}")).spawn(move || {
        let _slot = slot;
        let reader = Reader {
            client,
            pid: peer_pid,
            stream: &reader,
            route,
            spin: &reader_spin,
            outbox: &reader_outbox,
            limits: &server_limits,
            accepted,
            told_backlog: false,
        };
        reader.read_loop();
    });
    match spawned {
        Ok(t) => threads.push(t),
        Err(e) => {
            // The core lets the session go, which ends its writer; the
            // socket closes with the writer's end of it (the client sees its end).
            refusals.note(|| format!("client {client}: no reader thread ({e}); its connection is closed"));
            // Not placed yet (several GPUs): no core knows it, and its writer ends with its channel.
            if let Some(core) = failed_core {
                let _ = core.send(CoreMsg::Disconnected { client });
            }
        }
    }
    Ok(())
}

/// What one read of the client's socket gave.
enum Got {
    /// This many bytes.
    Bytes(usize),
    /// The end of the connection (or an error on it).
    End,
    /// The deadline passed with no byte.
    Late,
}

/// One read of the client's socket: polled without blocking for [`READER_SPIN`]
/// after the last bytes (a client's requests come in bursts: a launch, its
/// sync, the next launch), then a blocking read, which ends at `deadline`
/// if one is set.
fn read_some(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    last: Instant,
    spin: &ConnSpin,
    deadline: Option<Instant>,
) -> Got {
    let (window, spin) = (spin.window(READER_SPIN), spin);
    let mut looks = 0u32;
    while last.elapsed() < window || spin.held() {
        match crate::fdpass::recv_with_fds(sock, buf, fds, true) {
            Ok(0) => return Got::End,
            Ok(n) => return Got::Bytes(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => gpumux_ring::relax(looks),
            Err(_) => return Got::End,
        }
        looks = looks.saturating_add(1);
    }
    if let Some(deadline) = deadline {
        // Until bytes (or the end) come or the deadline passes.
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Got::Late;
            }
            let mut pfd = libc::pollfd { fd: sock, events: libc::POLLIN, revents: 0 };
            let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
            // SAFETY: one pollfd, valid for the call.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
            if rc > 0 {
                break;
            }
            if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return Got::End;
            }
        }
    }
    match crate::fdpass::recv_with_fds(sock, buf, fds, false) {
        Ok(0) | Err(_) => Got::End,
        Ok(n) => Got::Bytes(n),
    }
}

/// A connection's reader thread (module doc).
struct Reader<'a> {
    client: u64,
    /// The client's pid (SO_PEERCRED): its frames' key in the stage stamps.
    pid: u64,
    stream: &'a UnixStream,
    /// The way to the client's core (placed on its Hello: `gpus.rs`).
    route: Route,
    spin: &'a ConnSpin,
    outbox: &'a Outbox,
    limits: &'a ServerLimits,
    /// When the connection was accepted (`hello_timeout` runs from here).
    accepted: Instant,
    /// The log has said this client went over its `outstanding` limit.
    told_backlog: bool,
}

/// The frame being received, and since when (`frame_timeout` runs from then).
type Partial = Option<(u64, Instant)>;

impl Reader<'_> {
    /// The next deadline of the connection, if one runs, and what breaking it
    /// tells the client: `hello_timeout` until `Hello` has come,
    /// `frame_timeout` while part of a frame is held.
    fn deadline(&self, conn: &Connection, partial: &mut Partial) -> Option<(Instant, String)> {
        let frame = match (conn.partial_frame(), *partial) {
            (None, _) => None,
            (Some((n, _)), Some((m, since))) if n == m => Some(since),
            (Some(_), _) => Some(Instant::now()),
        };
        *partial = conn.partial_frame().zip(frame).map(|((n, _), since)| (n, since));
        let frame = frame.map(|since| {
            let held = conn.partial_frame().map_or(0, |(_, held)| held);
            let t = self.limits.frame_timeout;
            let why = format!(
                "a frame was still incomplete {} after its first byte ({held} bytes of it came): \
                 the daemon's [limits] frame_timeout",
                say_duration(t)
            );
            (since + t, why)
        });
        let hello = (!conn.is_greeted()).then(|| {
            let t = self.limits.hello_timeout;
            let why = format!("no Hello within {} of connecting: the daemon's [limits] hello_timeout", say_duration(t));
            (self.accepted + t, why)
        });
        match (hello, frame) {
            (Some(h), Some(f)) => Some(if h.0 <= f.0 { h } else { f }),
            (h, f) => h.or(f),
        }
    }

    /// A deadline passed: the core answers the violation and closes the connection.
    fn late(&mut self, conn: &mut Connection, why: String) {
        tracing::info!("client {}: {why}; closing it", self.client);
        let mut out = Vec::new();
        conn.violate_now(ErrorKind::Protocol, why, &mut out);
        for inbound in out {
            let _ = self.hand(inbound, Instant::now());
        }
    }

    /// Hands the core `inbound` once the connection's backlog is under its
    /// `outstanding` limit (waiting for that, without reading the client,
    /// while it is not); false when the core or the connection is gone.
    fn hand(&mut self, inbound: Inbound, read_at: Instant) -> bool {
        match self.outbox.wait_for_room(self.limits.outstanding) {
            None => return false,
            Some(waited) if !waited.is_zero() && !self.told_backlog => {
                self.told_backlog = true;
                tracing::info!(
                    "client {}: {} requests and replies outstanding (the daemon's [limits] outstanding): \
                     its requests were not read for {:.1} ms, until it read its replies",
                    self.client,
                    self.limits.outstanding,
                    waited.as_secs_f64() * 1e3
                );
            }
            Some(_) => {}
        }
        self.outbox.sent_request(inbound.cost());
        if let Inbound::Request { id, .. } = &inbound {
            // Issue 35's stage stamps: the request decoded, before the core has it.
            gpumux_stamps::stamp(gpumux_stamps::Stage::ReaderRead, gpumux_stamps::frame_key(self.pid, *id), 0);
        }
        if matches!(inbound, Inbound::Request { .. }) {
            // Learned before the core sees it: the core reads the window with the request.
            self.spin.note_request();
        }
        self.route.send(CoreMsg::Inbound { client: self.client, inbound, read_at })
    }

    fn read_loop(mut self) {
        let mut conn = Connection::new();
        let mut buf = vec![0u8; READ_CHUNK];
        let mut out: Vec<Inbound> = Vec::new();
        let mut last = Instant::now();
        let mut rings: Option<RingReceiver> = None;
        let mut partial: Partial = None;
        let stream = self.stream;
        // UseRings is answered here, not by the core: see the module doc.
        'serve: loop {
            let deadline = self.deadline(&conn, &mut partial);
            let mut fds = Vec::new();
            let n = match read_some(
                stream.as_raw_fd(),
                &mut buf,
                &mut fds,
                last,
                self.spin,
                deadline.as_ref().map(|d| d.0),
            ) {
                Got::Bytes(n) => n,
                Got::End => break,
                Got::Late => {
                    let why = deadline.map(|d| d.1).unwrap_or_default();
                    return self.late(&mut conn, why);
                }
            };
            last = Instant::now();
            conn.receive(&buf[..n], fds, &mut out);
            let read_at = Instant::now();
            for inbound in out.drain(..) {
                let inbound = match inbound {
                    Inbound::Request { id, request: Request::UseRings { capacity }, fd } => {
                        let result = open_rings(capacity, fd, &conn);
                        match result {
                            Ok(pair) => match stream.try_clone() {
                                Ok(sock) => {
                                    let (tx, rx) = pair.split();
                                    // Before the answer leaves: it goes through the ring.
                                    self.outbox.open(tx, sock);
                                    rings = Some(rx);
                                    conn.use_rings();
                                    Inbound::Answered { id, result: Ok(Reply::Done) }
                                }
                                Err(e) => Inbound::Answered {
                                    id,
                                    result: Err(ErrorReply::new(
                                        ErrorKind::Device,
                                        format!("no socket for the rings: {e}"),
                                    )),
                                },
                            },
                            Err(e) => Inbound::Answered { id, result: Err(e) },
                        }
                    }
                    other => other,
                };
                if !self.hand(inbound, read_at) {
                    // The connection (or the core) is going.
                    break 'serve;
                }
            }
            if conn.is_broken() {
                // The core answers the violation and closes the connection.
                return;
            }
            if let Some(rx) = rings.take() {
                // Anything the client sent on the socket after UseRings is a doorbell.
                self.ring_loop(&mut conn, rx, &mut buf);
                return;
            }
        }
        let _ = self.route.send(CoreMsg::Disconnected { client: self.client });
    }

    /// The reader once the client's frames come through its ring: polls the
    /// ring for the spin window after the last bytes (and the socket every
    /// [`SOCKET_EVERY`]th try, for its end), then sleeps on the socket until a
    /// doorbell, a descriptor or the end comes (or the frame deadline).
    fn ring_loop(mut self, conn: &mut Connection, mut rx: RingReceiver, buf: &mut [u8]) {
        let stream = self.stream;
        let sock = stream.as_raw_fd();
        let mut out: Vec<Inbound> = Vec::new();
        let mut bytes = Vec::new();
        let mut last = Instant::now();
        let mut tries = 0u32;
        // Looks since the last bytes (`gpumux_ring::relax`).
        let mut looks = 0u32;
        let mut ended = false;
        let mut partial: Partial = None;
        'serve: loop {
            bytes.clear();
            match rx.read_into(&mut bytes, usize::MAX) {
                Ok(0) => {}
                Ok(_) => {
                    last = Instant::now();
                    looks = 0;
                    let mut more_fds = || {
                        let mut fds = Vec::new();
                        let _ = crate::fdpass::recv_with_fds(sock, buf, &mut fds, true);
                        fds
                    };
                    conn.receive_ringed(&bytes, &mut out, &mut more_fds);
                }
                Err(e) => out.push(Inbound::Violation(ErrorReply::new(ErrorKind::Protocol, e.to_string()))),
            }
            let read_at = Instant::now();
            for inbound in out.drain(..) {
                let inbound = match inbound {
                    Inbound::Request { id, request: Request::UseRings { capacity }, fd } => {
                        Inbound::Answered { id, result: open_rings(capacity, fd, conn).map(|_| Reply::Done) }
                    }
                    other => other,
                };
                let broke = matches!(inbound, Inbound::Violation(_));
                if !self.hand(inbound, read_at) || broke {
                    // The core answers the violation and closes the connection.
                    return;
                }
            }
            if conn.is_broken() {
                return;
            }
            let deadline = self.deadline(conn, &mut partial);
            if let Some((at, why)) = &deadline {
                if Instant::now() >= *at {
                    return self.late(conn, why.clone());
                }
            }
            if !bytes.is_empty() {
                if bytes.capacity() > READ_CHUNK * 4 {
                    // A full ring's worth (up to 16 MiB) is not kept for the connection's life.
                    bytes = Vec::new();
                }
                continue;
            }
            if ended || self.outbox.is_closed() {
                // The ring was read once more after the end: nothing is left.
                break 'serve;
            }
            tries = tries.wrapping_add(1);
            let spinning = last.elapsed() < self.spin.window(READER_SPIN) || self.spin.held();
            if spinning && !tries.is_multiple_of(SOCKET_EVERY) {
                gpumux_ring::relax(looks);
                looks = looks.saturating_add(1);
                continue;
            }
            if !spinning {
                // Until the client's doorbell or end, or the frame deadline
                // (an error here is seen on the read below).
                let left = deadline.map(|(at, _)| at.saturating_duration_since(Instant::now()));
                let _ = rx.sleep_on(stream.as_fd(), left);
                gpumux_stamps::stamp(gpumux_stamps::Stage::ReaderWake, self.pid, 0);
            }
            // Doorbells, descriptors ahead of their AttachShm or AttachHost, or the end.
            loop {
                let mut fds = Vec::new();
                match crate::fdpass::recv_with_fds(sock, buf, &mut fds, true) {
                    Ok(0) => {
                        ended = true;
                        break;
                    }
                    Ok(_) => conn.take_fds(fds, &mut out),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        ended = true;
                        break;
                    }
                }
            }
        }
        let _ = self.route.send(CoreMsg::Disconnected { client: self.client });
    }
}

/// Maps the rings a `UseRings` offered, or says why not (the client goes on over the socket).
fn open_rings(capacity: u32, fd: Option<OwnedFd>, conn: &Connection) -> Result<RingPair, ErrorReply> {
    if conn.is_ringed() {
        return Err(ErrorReply::new(ErrorKind::Protocol, "a second UseRings; the connection uses its rings already"));
    }
    let fd = fd.ok_or_else(|| {
        ErrorReply::new(ErrorKind::Invalid, "UseRings came without its memfd (send it with SCM_RIGHTS)")
    })?;
    RingPair::open(fd, capacity as usize).map_err(|e| ErrorReply::new(ErrorKind::Invalid, e.to_string()))
}

//! The connection: frames out under a lock, one reader thread that routes
//! replies to the callers waiting for them by request id.
//!
//! Any thread may send; each request registers a one-shot channel under a
//! fresh id before its frame is written, and the reader thread fills it when
//! the reply with that id comes (through the rings, a waiting caller reads
//! and routes the replies itself while it polls: `reply_ring`). Notices are kept for `take_notices`. When
//! the socket closes, every waiting caller gets [`ClientError::DaemonGone`].
//!
//! A request sent with [`Connection::send_deferred`] (a launch, an asynchronous copy) has no
//! caller waiting, and the daemon answers it only to refuse it (protocol
//! version 3): a reply whose id nobody waits for is such a refusal, kept
//! for [`Connection::take_deferred_error`], which the calls that wait for
//! stream work (sync, events) and the next launch consult. The daemon answers
//! one connection's requests in order, so by the time a sync's reply is
//! here, every earlier launch's refusal is too.
//!
//! **Rings.** Right after `Hello`, the connection offers the daemon two
//! shared-memory rings (`Request::UseRings`, `gpumux-ring`); once accepted,
//! frames go both ways through them and the socket carries only doorbells
//! (a byte for a side that sleeps), the descriptor of an `AttachShm` (sent
//! before its frame) and the end of the connection. A request then costs no
//! system call while the daemon's reader polls, and a reply none while ours
//! does. A daemon that refuses the rings leaves the conversation on the
//! socket; `GPUMUX_RINGS=0` does not offer them.
//!
//! **The daemon's last word.** A daemon that closes a connection says why
//! first, in an error frame with id 0 (a uid its config does not allow,
//! before it reads a byte; a broken protocol rule). That frame is read
//! before the close is reported, whatever the timing: a write that fails
//! because the daemon has already closed is not the end of the story (its
//! reason may be waiting unread), and every call after the close reports
//! [`ClientError::Closed`] with the daemon's words instead of
//! [`ClientError::DaemonGone`]. On 717b546 a refused uid got, at random,
//! "gpumuxd closed the connection" or "gpumuxd answered Hello with a reply
//! to request 0" (issue 36, case 5).

use crate::error::{ClientError, Result};
use crate::reply_ring::ReplyRing;
use gpumux_proto::{
    decode_frame_body, encode_frame, ClientFrame, ErrorReply, FrameReader, Notice, Reply, Request, ServerFrame,
};
use gpumux_ring::{RingPair, RingReceiver, RingSender};
use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

type Answer = std::result::Result<Reply, ErrorReply>;

/// What a waiting caller gets: its answer, or the daemon's reason for
/// closing the connection before answering.
pub(crate) enum Routed {
    Answer(Answer),
    Closed(ErrorReply),
}

/// What the reader thread and the callers share.
#[derive(Default)]
pub(crate) struct Routing {
    /// Callers waiting, by request id.
    waiting: HashMap<u64, Sender<Routed>>,
    /// Set once the socket is closed: nothing more will be answered.
    closed: bool,
    /// Why the daemon closed the connection, if it said (module doc).
    farewell: Option<ErrorReply>,
    /// Notices not yet taken.
    notices: Vec<Notice>,
    /// Errors of requests sent without a caller waiting (launches),
    /// oldest first, not yet reported.
    deferred_errors: VecDeque<(&'static str, ErrorReply)>,
    /// Requests whose waiter is a thread of the library, not the caller
    /// (a host function's, [`Connection::send_reporting`]): an error in
    /// the reply is also kept in `deferred_errors`, by name.
    reported: HashMap<u64, &'static str>,
    /// Deferred requests that are not launches (asynchronous copies), by
    /// id, so that a refusal names its request: an accepted one is never
    /// answered, so the oldest go once there are [`MAX_NAMED`].
    named: std::collections::BTreeMap<u64, &'static str>,
}

/// The most deferred requests other than launches whose names are kept
/// ([`Routing::named`]); one forgotten is refused as a `Launch` would be.
const MAX_NAMED: usize = 1024;

impl Routing {
    /// Whether a call waits for a reply (sent, and not yet answered).
    pub(crate) fn awaited(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Hands one frame from the daemon to whoever waits for it. Frames are
    /// routed in the order they came, by one thread at a time (the reader
    /// thread, or a caller reading the ring itself: `reply_ring`), so a
    /// launch's refusal is kept before the reply of the sync after it is handed on.
    pub(crate) fn route(&mut self, frame: ServerFrame) {
        match frame {
            ServerFrame::Reply { id, result } => {
                // A reply nobody waits for is a launch's (or an
                // asynchronous copy's) refusal (module doc). Id 0 is no request's: the daemon's word on why it
                // closes the connection, kept for every call from then on.
                if let Some(tx) = self.waiting.remove(&id) {
                    if let Some(name) = self.reported.remove(&id) {
                        if let Err(error) = &result {
                            self.deferred_errors.push_back((name, error.clone()));
                        }
                    }
                    let _ = tx.send(Routed::Answer(result));
                } else if id != 0 {
                    let name = self.named.remove(&id).unwrap_or("Launch");
                    if let Err(error) = result {
                        self.deferred_errors.push_back((name, error));
                    }
                } else if let Err(error) = result {
                    self.farewell = Some(error);
                }
            }
            ServerFrame::Notice(notice) => self.notices.push(notice),
        }
    }

    /// The error of a call on a closed connection: the daemon's reason, if it gave one.
    fn gone(&self) -> ClientError {
        match &self.farewell {
            Some(error) => ClientError::Closed { error: error.clone() },
            None => ClientError::DaemonGone,
        }
    }
}

/// How long a caller polls for its reply before it sleeps: a daemon
/// answers a request in tens of µs, and a thread woken from a futex sleep
/// costs several µs more at the median and far more at the tail. The cost
/// is one core busy for at most this long per request.
const SPIN_FOR_REPLY: std::time::Duration = std::time::Duration::from_micros(100);

/// How long the reader thread and a waiting caller of an urgent client
/// (priority above 0) poll before they sleep: above the gaps between the
/// kernels of a client that launches every few ms, so that no wake-up of its
/// own threads lies on its path (each tens of µs in a virtual machine). The
/// daemon does the same for it (gpumuxd's `spin` module).
const URGENT_SPIN: std::time::Duration = std::time::Duration::from_millis(5);

/// The longest a call waiting for a copy keeps polling ([`Connection::send_spinning`]).
pub(crate) const MAX_COPY_SPIN: std::time::Duration = std::time::Duration::from_millis(5);

/// Where [`Connection`]'s spin deadline counts from.
fn origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// Whether `until` (ns after [`origin`], 0: none) is still ahead.
pub(crate) fn before(until: &AtomicU64) -> bool {
    let until = until.load(Ordering::Relaxed);
    until != 0 && (origin().elapsed().as_nanos() as u64) < until
}

/// Now, in ns after [`origin`].
pub(crate) fn origin_ns() -> u64 {
    origin().elapsed().as_nanos() as u64
}

/// `GPUMUX_SPIN_US` in µs (read once), if set and above 0.
fn fixed_spin() -> Option<u64> {
    static SPIN_US: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *SPIN_US.get_or_init(|| {
        std::env::var("GPUMUX_SPIN_US").ok().and_then(|v| v.trim().parse::<u64>().ok()).filter(|&us| us > 0)
    })
}

/// The poll window of a thread whose own default is `default`:
/// `GPUMUX_SPIN_US` (read once) if set, else [`URGENT_SPIN`] for an urgent
/// client, else the default.
pub(crate) fn spin_window(default: std::time::Duration, urgent: bool) -> std::time::Duration {
    match fixed_spin() {
        Some(us) => std::time::Duration::from_micros(us.min(1_000_000)),
        None if urgent => default.max(URGENT_SPIN),
        None => default,
    }
}

/// Takes a lock even if a thread panicked holding it: the data under these
/// locks stays consistent at every await point (a map insert, a push).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A reply to come.
#[must_use = "a request's reply says whether it worked"]
pub(crate) struct PendingReply {
    request: &'static str,
    /// The request's frame id (its stage stamps' key, `gpumux_stamps`).
    id: u64,
    rx: Receiver<Routed>,
    /// How long to poll for it before sleeping.
    spin: std::time::Duration,
    /// The replies' ring, which the waiting call reads itself while it polls (`reply_ring`).
    ring: Option<Arc<ReplyRing>>,
}

impl PendingReply {
    /// Waits for the reply; a daemon error becomes [`ClientError::Daemon`].
    pub(crate) fn wait(self) -> Result<Reply> {
        use gpumux_stamps::{stamp, Stage};
        stamp(Stage::WaitPoll, self.id, 0);
        let answer = match &self.ring {
            Some(ring) => match ring.poll_for(&self.rx, self.spin) {
                Some(answer) => answer,
                None => {
                    stamp(Stage::WaitSleep, self.id, 0);
                    self.rx.recv().map_err(|_| ())
                }
            },
            None => self.poll_channel(),
        };
        stamp(Stage::WaitReturn, self.id, 0);
        match answer {
            Ok(Routed::Answer(Ok(reply))) => Ok(reply),
            Ok(Routed::Answer(Err(error))) => Err(ClientError::Daemon { request: self.request, error }),
            Ok(Routed::Closed(error)) => Err(ClientError::Closed { error }),
            Err(_) => Err(ClientError::DaemonGone),
        }
    }

    /// The wait on a socket connection: polls the channel the reader thread
    /// answers on for the spin window, then sleeps on it.
    fn poll_channel(&self) -> std::result::Result<Routed, ()> {
        let start = std::time::Instant::now();
        let spin = self.spin;
        let mut looks = 0u32;
        loop {
            match self.rx.try_recv() {
                Ok(a) => return Ok(a),
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return Err(()),
                Err(std::sync::mpsc::TryRecvError::Empty) if start.elapsed() < spin => gpumux_ring::relax(looks),
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    gpumux_stamps::stamp(gpumux_stamps::Stage::WaitSleep, self.id, 0);
                    return self.rx.recv().map_err(|_| ());
                }
            }
            looks = looks.saturating_add(1);
        }
    }

    /// The request's name, for messages.
    pub(crate) fn request(&self) -> &'static str {
        self.request
    }
}

/// Where frames to the daemon go: the socket, or the ring once accepted.
struct Writer {
    stream: UnixStream,
    ring: Option<RingSender>,
}

/// A connected, greeted socket with its reader thread.
pub(crate) struct Connection {
    writer: Mutex<Writer>,
    routing: Arc<Mutex<Routing>>,
    next_id: AtomicU64,
    reader: Option<JoinHandle<()>>,
    /// The replies' ring once accepted, read by the reader thread and by waiting calls.
    reply_ring: Option<Arc<ReplyRing>>,
    /// The client's priority is above 0 (`spin_window`); the reader thread reads it too.
    urgent: Arc<AtomicBool>,
    /// Until when (ns after [`origin`]) the reader thread polls whatever its
    /// window: a caller waits for a copy that takes this long
    /// ([`Connection::send_spinning`]).
    spin_until: Arc<AtomicU64>,
    /// The gaps between this client's requests (`gpumux_ring::cadence`):
    /// a client that comes back every few ms keeps its reader polling that
    /// long after each request, as the daemon does for it.
    cadence: gpumux_ring::cadence::Cadence,
}

impl Connection {
    /// Sends `hello` on `stream` and waits for its answer (before any other
    /// thread exists), offers the rings if `rings` (module doc), then starts
    /// the reader thread.
    pub(crate) fn handshake(stream: UnixStream, hello: Request, rings: bool) -> Result<(Connection, Reply)> {
        let mut frames = FrameReader::new();
        let mut buf = vec![0u8; READ_CHUNK];
        // A daemon that refuses this uid writes why and closes without
        // reading: the Hello's write may fail (a broken pipe) with the
        // reason unread here. It is read; the end of the stream after it,
        // if it did not come, is `DaemonGone` as the write's failure was.
        if let Err(e) = send_all(stream.as_raw_fd(), &encode_frame(&ClientFrame { id: 1, request: hello })?, None) {
            if !matches!(e.kind(), std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset) {
                return Err(e.into());
            }
        }
        let reply = loop {
            match read_frame(&stream, &mut frames, &mut buf, None, false, None)? {
                ServerFrame::Reply { id: 1, result: Ok(reply) } => break reply,
                ServerFrame::Reply { id: 1, result: Err(error) } => {
                    return Err(ClientError::Daemon { request: "Hello", error });
                }
                // The daemon's reason for closing (module doc).
                ServerFrame::Reply { id: 0, result: Err(error) } => return Err(ClientError::Closed { error }),
                ServerFrame::Reply { id, .. } => {
                    return Err(ClientError::Protocol { request: "Hello", got: format!("a reply to request {id}") });
                }
                // Nothing to keep before the handshake: a ShuttingDown here is
                // followed by the close, which ends the loop with DaemonGone.
                ServerFrame::Notice(_) => continue,
            }
        };
        let mut routing = Routing::default();
        let ring = if rings { offer_rings(&stream, &mut frames, &mut buf, &mut routing.notices)? } else { None };
        let routing = Arc::new(Mutex::new(routing));
        let reader_stream = stream.try_clone()?;
        let urgent = Arc::new(AtomicBool::new(false));
        let spin_until = Arc::new(AtomicU64::new(0));
        let (reader_urgent, reader_until) = (Arc::clone(&urgent), Arc::clone(&spin_until));
        let (ring_tx, reply_ring, reader) = match ring {
            Some((tx, rx)) => {
                let replies = ReplyRing::new(rx, frames, Arc::clone(&routing));
                let reader = replies.spawn_reader(reader_stream, reader_urgent, reader_until)?;
                (Some(tx), Some(replies), reader)
            }
            None => {
                let reader_routing = Arc::clone(&routing);
                let reader = std::thread::Builder::new()
                    .name("gpumux-client-reader".into())
                    .spawn(move || read_loop(reader_stream, frames, reader_routing, reader_urgent, reader_until))?;
                (None, None, reader)
            }
        };
        let conn = Connection {
            writer: Mutex::new(Writer { stream, ring: ring_tx }),
            routing,
            next_id: AtomicU64::new(RINGS_ID + 1),
            reader: Some(reader),
            reply_ring,
            urgent,
            spin_until,
            cadence: gpumux_ring::cadence::Cadence::new(),
        };
        Ok((conn, reply))
    }

    /// Whether frames go through the shared-memory rings.
    pub(crate) fn uses_rings(&self) -> bool {
        lock(&self.writer).ring.is_some()
    }

    /// Writes one encoded frame, with `fd` passed alongside.
    fn write_frame(&self, bytes: &[u8], fd: Option<RawFd>) -> std::io::Result<()> {
        let mut writer = lock(&self.writer);
        let Writer { stream, ring } = &mut *writer;
        let sock = stream.as_raw_fd();
        let Some(ring) = ring else {
            return send_all(sock, bytes, fd);
        };
        if let Some(fd) = fd {
            // Before its frame: the daemon reads the socket when the frame asks.
            send_with_fd(sock, &[FD_MARKER], fd)?;
        }
        let mut sent = 0;
        let start = std::time::Instant::now();
        loop {
            sent += ring.write(&bytes[sent..]).map_err(std::io::Error::other)?;
            if ring.take_sleeper() {
                gpumux_ring::ring_doorbell(stream.as_fd())?;
            }
            if sent == bytes.len() {
                return Ok(());
            }
            // Full: the daemon's reader drains it unless it is gone.
            if lock(&self.routing).closed {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            if start.elapsed() < SPIN_FOR_REPLY {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }

    /// Sends a request (with `fd` passed alongside, for `AttachShm`) and
    /// returns its reply to come.
    pub(crate) fn send(&self, request: Request, fd: Option<BorrowedFd<'_>>) -> Result<PendingReply> {
        self.send_as(request, fd, false)
    }

    /// [`Connection::send`]; `reported`: [`Connection::send_reporting`].
    fn send_as(&self, request: Request, fd: Option<BorrowedFd<'_>>, reported: bool) -> Result<PendingReply> {
        self.note_cadence();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let name = request.name();
        let bytes = encode_frame(&ClientFrame { id, request })?;
        let (tx, rx) = channel();
        {
            let mut routing = lock(&self.routing);
            if routing.closed {
                return Err(routing.gone());
            }
            routing.waiting.insert(id, tx);
            if reported {
                routing.reported.insert(id, name);
            }
        }
        gpumux_stamps::stamp(gpumux_stamps::Stage::WaitCall, id, 0);
        let written = self.write_frame(&bytes, fd.map(|f| f.as_raw_fd()));
        if let Err(e) = written {
            {
                // Let go before `write_failed`, which takes the lock again.
                let mut routing = lock(&self.routing);
                routing.waiting.remove(&id);
                routing.reported.remove(&id);
            }
            return Err(self.write_failed(e));
        }
        Ok(PendingReply {
            request: name,
            id,
            rx,
            spin: spin_window(SPIN_FOR_REPLY, self.urgent.load(Ordering::Relaxed)),
            ring: self.reply_ring.clone().filter(|_| crate::reply_ring::callers_read()),
        })
    }

    /// A request goes out now: the cadence learns its gap to the last, and a
    /// window learned keeps the reader polling that long from now (its
    /// reply, and the replies of the requests that follow within the
    /// window, then find it awake). Nothing is learned with `GPUMUX_SPIN_US`
    /// set (every window is that), nor with `GPUMUX_CADENCE=0`.
    fn note_cadence(&self) {
        if fixed_spin().is_some() || !gpumux_ring::cadence::enabled() {
            return;
        }
        let now = origin().elapsed().as_nanos() as u64 + 1;
        let window = self.cadence.note(now, READER_SPIN, gpumux_ring::cadence::CADENCE_CAP);
        if !window.is_zero() {
            self.spin_until.fetch_max(now + window.as_nanos() as u64, Ordering::Relaxed);
        }
    }

    /// [`Connection::send`] for a request whose reply takes about `expect`
    /// (a copy of known size): the caller and the reader thread keep
    /// polling that long, at most [`MAX_COPY_SPIN`], instead of sleeping
    /// after their usual window. A reply to a sleeping client costs two
    /// wake-ups (the daemon's doorbell to the reader, the reader's hand-off
    /// to the caller), tens of µs a copy of issue 40's pipeline; CUDA's own
    /// synchronous copies spin likewise. One core busy while the copy runs.
    pub(crate) fn send_spinning(&self, request: Request, expect: std::time::Duration) -> Result<PendingReply> {
        let expect = expect.min(MAX_COPY_SPIN);
        let until = (origin().elapsed() + expect).as_nanos() as u64;
        self.spin_until.fetch_max(until, Ordering::Relaxed);
        let mut pending = self.send_as(request, None, false)?;
        pending.spin = pending.spin.max(expect);
        Ok(pending)
    }

    /// Sends a request whose reply a thread of the library waits for, not
    /// the caller: an error in the reply is kept for
    /// [`Connection::take_deferred_error`] as a launch's is, by the reader
    /// thread before it hands on any later reply, so the next call that
    /// waits for stream work reports it (a host function refused).
    pub(crate) fn send_reporting(&self, request: Request) -> Result<PendingReply> {
        self.send_as(request, None, true)
    }

    /// Sends a request no caller waits for (module doc): an error in its
    /// reply is kept for [`Connection::take_deferred_error`].
    pub(crate) fn send_deferred(&self, request: Request) -> Result<()> {
        self.send_deferred_stamped(request, None)
    }

    /// [`Connection::send_deferred`] of a launch called at `called` (ns,
    /// `gpumux_stamps`): its call and its frame's write are stamped by the
    /// frame's id, which the daemon's stamps name too (issue 35).
    pub(crate) fn send_deferred_stamped(&self, request: Request, called: Option<u64>) -> Result<()> {
        self.note_cadence();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let name = request.name();
        let bytes = encode_frame(&ClientFrame { id, request })?;
        {
            let mut routing = lock(&self.routing);
            if routing.closed {
                return Err(routing.gone());
            }
            if name != "Launch" {
                if routing.named.len() >= MAX_NAMED {
                    routing.named.pop_first();
                }
                routing.named.insert(id, name);
            }
        }
        if let Some(called) = called {
            // Before the write: the daemon may read the frame before the write returns.
            gpumux_stamps::at(called, gpumux_stamps::Stage::ClientCall, id, 0);
            gpumux_stamps::stamp(gpumux_stamps::Stage::ClientWrite, id, 0);
        }
        self.write_frame(&bytes, None).map_err(|e| self.write_failed(e))
    }

    /// The error of a write that failed: for the daemon's end of the
    /// connection, what the daemon said as it closed, once the reader
    /// thread has read it (module doc); it reads up to the close at once,
    /// so the wait is short, and bounded.
    fn write_failed(&self, e: std::io::Error) -> ClientError {
        let e = ClientError::from(e);
        if !matches!(e, ClientError::DaemonGone) {
            return e;
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        loop {
            {
                let routing = lock(&self.routing);
                if routing.closed || std::time::Instant::now() >= deadline {
                    return routing.gone();
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The oldest error of a deferred request not yet reported, if any.
    pub(crate) fn take_deferred_error(&self) -> Option<ClientError> {
        let (request, error) = lock(&self.routing).deferred_errors.pop_front()?;
        Some(ClientError::Daemon { request, error })
    }

    /// Keeps an error a call could not report (an earlier one went first)
    /// for the next call; errors that are not the daemon's (the socket
    /// closed) are seen again by every later call anyway.
    pub(crate) fn defer_error(&self, e: ClientError) {
        if let ClientError::Daemon { request, error } = e {
            lock(&self.routing).deferred_errors.push_back((request, error));
        }
    }

    /// Sends a request and waits for its reply.
    pub(crate) fn call(&self, request: Request) -> Result<Reply> {
        self.send(request, None)?.wait()
    }

    /// The notices received since the last call.
    pub(crate) fn take_notices(&self) -> Vec<Notice> {
        std::mem::take(&mut lock(&self.routing).notices)
    }

    /// Marks the client urgent (priority above 0): its threads poll longer.
    pub(crate) fn set_urgent(&self, urgent: bool) {
        self.urgent.store(urgent, Ordering::Relaxed);
    }

    /// Whether the daemon closed the connection.
    pub(crate) fn is_closed(&self) -> bool {
        lock(&self.routing).closed
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Ends the reader's blocking read; it then marks the routing closed.
        let _ = lock(&self.writer).stream.shutdown(std::net::Shutdown::Both);
        if let Some(replies) = &self.reply_ring {
            replies.close();
        }
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// Bytes one read of the socket takes at most.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

/// How long the reader thread polls the socket after a frame before it
/// sleeps on it: a working client's replies come tens of µs apart, and one
/// caught here saves the wake-up of a thread blocked in `read` on the reply's
/// path. One core busy for at most this long after each reply, yielding
/// between tries.
pub(crate) const READER_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// Reads the next whole frame from `stream` (blocking), reading through `buf`
/// (kept by the caller: zeroing 64 KiB for every frame cost a few µs on
/// every reply's path). With `spin_from`, polls without blocking until its
/// window (`spin_window` of [`READER_SPIN`]) after that instant first.
fn read_frame(
    mut stream: &UnixStream,
    frames: &mut FrameReader,
    buf: &mut [u8],
    spin_from: Option<std::time::Instant>,
    urgent: bool,
    spin_until: Option<&AtomicU64>,
) -> Result<ServerFrame> {
    loop {
        if let Some(body) = frames.next_body()? {
            return Ok(decode_frame_body(&body)?);
        }
        let mut n = None;
        let spin = spin_window(READER_SPIN, urgent);
        let mut looks = 0u32;
        while spin_from.is_some_and(|t| t.elapsed() < spin || spin_until.is_some_and(before)) {
            // SAFETY: `buf` is valid for writes of its length.
            let got = unsafe { libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if got >= 0 {
                n = Some(got as usize);
                break;
            }
            match std::io::Error::last_os_error() {
                e if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::Interrupted => {
                    gpumux_ring::relax(looks);
                    looks = looks.saturating_add(1);
                }
                e => return Err(e.into()),
            }
        }
        let n = match n {
            Some(n) => n,
            None => stream.read(buf)?,
        };
        if n == 0 {
            return Err(ClientError::DaemonGone);
        }
        frames.extend(&buf[..n]);
    }
}

/// The id of the `UseRings` request (the second, after `Hello`'s 1).
const RINGS_ID: u64 = 2;
/// The socket byte that carries an `AttachShm`'s descriptor (ringed).
const FD_MARKER: u8 = 1;
/// A ring poll reads the socket too (for the daemon's end) once every this many tries.
pub(crate) const SOCKET_EVERY: u32 = 64;

/// Whether `GPUMUX_RINGS` leaves the rings on (anything but `0`, or unset).
pub(crate) fn rings_from_env() -> bool {
    std::env::var("GPUMUX_RINGS").map_or(true, |v| v.trim() != "0")
}

/// Offers the daemon two rings and waits for its answer, reading the ring
/// (where an acceptance comes) and the socket (where a refusal or a notice
/// comes). `None`: refused or not made; the conversation stays on the socket.
fn offer_rings(
    stream: &UnixStream,
    frames: &mut FrameReader,
    buf: &mut [u8],
    notices: &mut Vec<Notice>,
) -> Result<Option<(RingSender, RingReceiver)>> {
    let Ok(pair) = RingPair::create(gpumux_ring::DEFAULT_CAPACITY) else {
        return Ok(None);
    };
    let request = Request::UseRings { capacity: pair.capacity() as u32 };
    let frame = encode_frame(&ClientFrame { id: RINGS_ID, request })?;
    if let Err(e) = send_all(stream.as_raw_fd(), &frame, Some(pair.fd().as_raw_fd())) {
        // Closed already: its reason may be read, or waiting (module doc).
        let e = ClientError::from(e);
        if matches!(e, ClientError::DaemonGone) {
            let _ = drain_socket(stream, frames, buf);
            while let Some(body) = frames.next_body()? {
                if let ServerFrame::Reply { id: 0, result: Err(error) } = decode_frame_body(&body)? {
                    return Err(ClientError::Closed { error });
                }
            }
        }
        return Err(e);
    }
    let (tx, mut rx) = pair.split();
    let mut ring_frames = FrameReader::new();
    let mut inbox = Vec::new();
    let answer = |frame: ServerFrame, notices: &mut Vec<Notice>| match frame {
        ServerFrame::Reply { id: RINGS_ID, result } => Some(Ok(result)),
        // The daemon's reason for closing (module doc).
        ServerFrame::Reply { id: 0, result: Err(error) } => Some(Err(ClientError::Closed { error })),
        ServerFrame::Reply { .. } => None,
        ServerFrame::Notice(n) => {
            notices.push(n);
            None
        }
    };
    loop {
        inbox.clear();
        rx.read_into(&mut inbox, usize::MAX)
            .map_err(|e| ClientError::Protocol { request: "UseRings", got: e.to_string() })?;
        ring_frames.extend(&inbox);
        while let Some(body) = ring_frames.next_body()? {
            if let Some(result) = answer(decode_frame_body(&body)?, notices) {
                let result = result?;
                // Accepted through the ring: what the socket still holds (a
                // notice sent before) is read now; after this, only doorbells.
                if result.is_ok() {
                    drain_socket(stream, frames, buf)?;
                    while let Some(body) = frames.next_body()? {
                        if let Some(Err(closed)) = answer(decode_frame_body(&body)?, notices) {
                            return Err(closed);
                        }
                    }
                    *frames = ring_frames;
                    return Ok(Some((tx, rx)));
                }
                return Ok(None);
            }
        }
        // What the socket holds is read before its end is reported.
        let drained = drain_socket(stream, frames, buf);
        while let Some(body) = frames.next_body()? {
            if let Some(result) = answer(decode_frame_body(&body)?, notices) {
                let result = result?;
                // A refusal comes on the socket; the rings are dropped.
                return match result {
                    Ok(_) => Err(ClientError::Protocol { request: "UseRings", got: "an answer on the socket".into() }),
                    Err(_) => Ok(None),
                };
            }
        }
        drained?;
        // A once-per-connection wait: a short nap, not a spin.
        let mut pfd = libc::pollfd { fd: stream.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, valid for the call.
        unsafe { libc::poll(&mut pfd, 1, 1) };
    }
}

/// Reads what the socket holds now into `frames`; the daemon's end is [`ClientError::DaemonGone`].
pub(crate) fn drain_socket(stream: &UnixStream, frames: &mut FrameReader, buf: &mut [u8]) -> Result<()> {
    loop {
        // SAFETY: `buf` is valid for writes of its length.
        let got = unsafe { libc::recv(stream.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        match got {
            0 => return Err(ClientError::DaemonGone),
            n if n > 0 => frames.extend(&buf[..n as usize]),
            _ => match std::io::Error::last_os_error() {
                e if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                e if e.kind() == std::io::ErrorKind::Interrupted => {}
                e => return Err(e.into()),
            },
        }
    }
}

/// The reader thread of a socket connection (a ringed one's is
/// `ReplyRing`'s): routes replies and keeps notices until the socket
/// closes or a frame does not decode (then closes it: the stream cannot be
/// trusted past a bad frame).
fn read_loop(
    stream: UnixStream,
    mut frames: FrameReader,
    routing: Arc<Mutex<Routing>>,
    urgent: Arc<AtomicBool>,
    spin_until: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    let mut last = std::time::Instant::now();
    while let Ok(frame) =
        read_frame(&stream, &mut frames, &mut buf, Some(last), urgent.load(Ordering::Relaxed), Some(&spin_until))
    {
        last = std::time::Instant::now();
        if let ServerFrame::Reply { id, .. } = &frame {
            gpumux_stamps::stamp(gpumux_stamps::Stage::ReplySeen, *id, 1);
        }
        lock(&routing).route(frame);
    }
    close_routing(&stream, &routing);
}

/// The end of the reader thread: the socket shut, every waiting caller told.
pub(crate) fn close_routing(stream: &UnixStream, routing: &Mutex<Routing>) {
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let mut routing = lock(routing);
    routing.closed = true;
    // Every waiting caller gets the daemon's reason, if it gave one; else
    // dropping the senders wakes them with DaemonGone.
    let waiting = std::mem::take(&mut routing.waiting);
    if let Some(error) = &routing.farewell {
        for tx in waiting.into_values() {
            let _ = tx.send(Routed::Closed(error.clone()));
        }
    }
}

/// Writes all of `bytes` to the socket, with `pass` sent as `SCM_RIGHTS`
/// alongside the first byte. `MSG_NOSIGNAL`: a closed peer is an error
/// here, not a SIGPIPE that ends the program.
pub(crate) fn send_all(sock: RawFd, bytes: &[u8], pass: Option<RawFd>) -> std::io::Result<()> {
    let mut sent = 0;
    if let Some(fd) = pass {
        sent = send_with_fd(sock, bytes, fd)?;
    }
    while sent < bytes.len() {
        let rest = &bytes[sent..];
        // SAFETY: sends from a live slice of `rest.len()` bytes.
        let n = unsafe { libc::send(sock, rest.as_ptr().cast(), rest.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

/// One `sendmsg` carrying `fd` in an `SCM_RIGHTS` message; returns the bytes sent (≥ 1).
fn send_with_fd(sock: RawFd, bytes: &[u8], fd: RawFd) -> std::io::Result<usize> {
    const FD_BYTES: u32 = std::mem::size_of::<RawFd>() as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(FD_BYTES) } as usize;
    // u64 words keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: a zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds one cmsghdr with room for one fd
    // (CMSG_SPACE above), so CMSG_FIRSTHDR is non-null and CMSG_DATA in bounds.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(FD_BYTES) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
    }
    loop {
        // SAFETY: msg points at live buffers (above).
        let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

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

use crate::config::Config;
use crate::conn::{Connection, Inbound};
use crate::core::CoreMsg;
use crate::outbox::Outbox;
use crate::session::Peer;
use crate::spin::ConnSpin;
use gpumux_proto::{encode_frame, ErrorKind, ErrorReply, Reply, Request, ServerFrame};
use gpumux_ring::{RingPair, RingReceiver};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
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
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(bind_err)?;
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

/// Accepts clients until `stop()` says so; their threads' handles go to `threads`.
pub fn serve(
    listener: &UnixListener,
    config: &Config,
    core: &Sender<CoreMsg>,
    threads: &mut Vec<JoinHandle<()>>,
    mut stop: impl FnMut() -> bool,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut next_client = 1u64;
    while !stop() {
        let mut pfd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd, valid for the call.
        unsafe { libc::poll(&mut pfd, 1, ACCEPT_POLL_MS) };
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => continue,
            Err(e) => {
                tracing::warn!("accept: {e}");
                continue;
            }
        };
        threads.retain(|t| !t.is_finished());
        let client = next_client;
        next_client += 1;
        if let Err(e) = admit(client, stream, config, core, threads) {
            tracing::warn!("client {client}: {e}");
        }
    }
    Ok(())
}

fn admit(
    client: u64,
    mut stream: UnixStream,
    config: &Config,
    core: &Sender<CoreMsg>,
    threads: &mut Vec<JoinHandle<()>>,
) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let peer = peer_credentials(&stream)?;
    let Some(limits) = config.limits_for(peer.uid, peer.gid).cloned() else {
        tracing::info!("refused pid {} uid {} gid {}: not allowed by the config", peer.pid, peer.uid, peer.gid);
        let e = ErrorReply::new(
            ErrorKind::NotPermitted,
            format!(
                "uid {} (gid {}) may not use this daemon: its config has no [[allow]] entry for it",
                peer.uid, peer.gid
            ),
        );
        send_frame(&mut stream, &ServerFrame::Reply { id: 0, result: Err(e) })?;
        return Ok(());
    };
    let (tx, rx) = channel::<ServerFrame>();
    // Shared by the core and the writer; the reader opens its ring.
    let outbox = std::sync::Arc::new(Outbox::default());
    let writer_outbox = outbox.clone();
    let reader_outbox = outbox.clone();
    let mut writer = stream.try_clone()?;
    let reader = stream;
    let spin = ConnSpin::default();
    let writer_spin = spin.clone();
    threads.push(std::thread::Builder::new().name(format!("gpumuxd-w{client}")).spawn(move || {
        while let Some(frame) = next_frame(&rx, &writer_spin) {
            let window = writer_spin.window(WRITER_SPIN);
            let sent = match writer_outbox.write_ring(&frame, window, WRITE_TIMEOUT) {
                Some(sent) => sent,
                None => send_frame(&mut writer, &frame),
            };
            writer_outbox.written();
            if let Err(e) = sent {
                tracing::debug!("client {client}: write failed: {e}");
                break;
            }
        }
        let _ = writer.shutdown(std::net::Shutdown::Both);
    })?);
    let reader_spin = spin.clone();
    core.send(CoreMsg::Connected { client, peer, limits, out: tx, spin, outbox: Some(outbox) })
        .map_err(std::io::Error::other)?;
    let core = core.clone();
    threads.push(std::thread::Builder::new().name(format!("gpumuxd-r{client}")).spawn(move || {
        read_loop(client, &reader, &core, &reader_spin, &reader_outbox);
    })?);
    Ok(())
}

/// One read of the client's socket: polled without blocking for [`READER_SPIN`]
/// after the last bytes (a client's requests come in bursts: a launch, its
/// sync, the next launch), then a blocking read. `None` at its end or error.
fn read_some(sock: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>, last: Instant, spin: &ConnSpin) -> Option<usize> {
    let spin = spin.window(READER_SPIN);
    let mut looks = 0u32;
    while last.elapsed() < spin {
        match crate::fdpass::recv_with_fds(sock, buf, fds, true) {
            Ok(0) => return None,
            Ok(n) => return Some(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => gpumux_ring::relax(looks),
            Err(_) => return None,
        }
        looks = looks.saturating_add(1);
    }
    match crate::fdpass::recv_with_fds(sock, buf, fds, false) {
        Ok(0) | Err(_) => None,
        Ok(n) => Some(n),
    }
}

fn read_loop(client: u64, stream: &UnixStream, core: &Sender<CoreMsg>, spin: &ConnSpin, outbox: &Outbox) {
    let mut conn = Connection::new();
    let mut buf = vec![0u8; READ_CHUNK];
    let mut out: Vec<Inbound> = Vec::new();
    let mut last = Instant::now();
    let mut rings: Option<RingReceiver> = None;
    // UseRings is answered here, not by the core: see the module doc.
    loop {
        let mut fds = Vec::new();
        let Some(n) = read_some(stream.as_raw_fd(), &mut buf, &mut fds, last, spin) else { break };
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
                                outbox.open(tx, sock);
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
            if core.send(CoreMsg::Inbound { client, inbound, read_at }).is_err() {
                return;
            }
        }
        if conn.is_broken() {
            // The core answers the violation and closes the connection.
            return;
        }
        if let Some(rx) = rings.take() {
            // Anything the client sent on the socket after UseRings is a doorbell.
            ring_loop(client, stream, core, spin, &mut conn, rx, &mut buf);
            return;
        }
    }
    let _ = core.send(CoreMsg::Disconnected { client });
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

/// The reader once the client's frames come through its ring: polls the
/// ring for the spin window after the last bytes (and the socket every
/// [`SOCKET_EVERY`]th try, for its end), then sleeps on the socket until a
/// doorbell, a descriptor or the end comes.
fn ring_loop(
    client: u64,
    stream: &UnixStream,
    core: &Sender<CoreMsg>,
    spin: &ConnSpin,
    conn: &mut Connection,
    mut rx: RingReceiver,
    buf: &mut [u8],
) {
    let sock = stream.as_raw_fd();
    let mut out: Vec<Inbound> = Vec::new();
    let mut bytes = Vec::new();
    let mut last = Instant::now();
    let mut tries = 0u32;
    // Looks since the last bytes (`gpumux_ring::relax`).
    let mut looks = 0u32;
    let mut ended = false;
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
            if core.send(CoreMsg::Inbound { client, inbound, read_at }).is_err() || broke {
                // The core answers the violation and closes the connection.
                return;
            }
        }
        if conn.is_broken() {
            return;
        }
        if !bytes.is_empty() {
            continue;
        }
        if ended {
            // The ring was read once more after the end: nothing is left.
            break 'serve;
        }
        tries = tries.wrapping_add(1);
        let spinning = last.elapsed() < spin.window(READER_SPIN);
        if spinning && !tries.is_multiple_of(SOCKET_EVERY) {
            gpumux_ring::relax(looks);
            looks = looks.saturating_add(1);
            continue;
        }
        if !spinning {
            // Until the client's doorbell or end (an error here is seen on the read below).
            let _ = rx.sleep_on(stream.as_fd(), None);
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
    let _ = core.send(CoreMsg::Disconnected { client });
}

//! A framed, two-way channel between the daemon and its device process
//! ([`super::remote`], [`crate::device_host`]): messages through two
//! shared-memory rings (`gpumux-ring`), a Unix `socketpair` beside them.
//!
//! Messages are `gpumux-proto` frames (4-byte length, postcard body) of any
//! serde type, written into the peer's ring and read out of ours: no system
//! call while both sides poll, which is the common case while work is in
//! flight (the daemon's `Poll` and its answer every few µs). The socket
//! carries what the rings cannot: a *doorbell* byte when the peer went to
//! sleep on it, descriptors (`SCM_RIGHTS`, sent on the socket before the
//! message they belong to is written into the ring), and the peer's death
//! (end of stream). A message larger than the ring goes in pieces; a writer
//! that finds the ring full first reads what the peer sent meanwhile (kept
//! for the next receive) before it waits, so a large message one way (a
//! module's source) never deadlocks against a stream of events the other way.
//!
//! Setting up: the daemon makes the rings and sends their file as the
//! socket's first byte ([`Link::connect`]); the device process takes it
//! ([`Link::accept`]) before anything else.

use gpumux_proto::{decode_frame_body, encode_frame_into, FrameError, FrameReader};
use gpumux_ring::{RingError, RingPair, RingReceiver, RingSender};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long a reader polls before it sleeps on the socket (see
/// [`Link::recv_spin`]): one core busy for at most this long after each
/// message, which is what a reply within the window saves a wake-up for.
/// Every such poll in gpumuxd and its client library holds its core for
/// the first tries of a wait, then yields it between tries
/// (`gpumux_ring::relax`), so on a machine with fewer free cores than
/// polling threads the threads with work still run.
pub const SPIN: Duration = Duration::from_micros(200);

/// Bytes one socket read takes at most (doorbells and descriptor markers only).
const READ_CHUNK: usize = 4 << 10;
/// A poll of the rings looks at the socket too (for the peer's end of
/// stream) once every this many tries: a system call per try would cost
/// what the rings save.
const SOCKET_EVERY: u32 = 64;
/// The socket's first byte: the rings' file comes with it.
const RING_OFFER: u8 = 0xA5;
/// The most bytes of a sent frame's buffer kept for the next ([`Link::send`]).
const FRAME_KEPT: usize = 64 << 10;
/// A byte that carries a descriptor for the next message that needs one.
const FD_MARKER: u8 = 1;

/// Why a link failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The other end closed its socket (its process exited or was killed).
    #[error("the other end closed the link")]
    Closed,
    /// A socket call failed. (Each cause is in its message, so none is
    /// also the error's source: printed with its chain it came twice.)
    #[error("the device link failed: {0}")]
    Io(io::Error),
    /// Bytes that are not a message of the expected type (a bug on one side).
    #[error("a malformed message on the device link: {0}")]
    Frame(FrameError),
    /// The shared-memory rings could not be made, or were broken.
    #[error("the device link's rings: {0}")]
    Ring(RingError),
    /// The device process was not offered its rings in time.
    #[error("the device link was not set up: {0}")]
    Setup(String),
}

impl From<io::Error> for LinkError {
    fn from(e: io::Error) -> Self {
        LinkError::Io(e)
    }
}

impl From<FrameError> for LinkError {
    fn from(e: FrameError) -> Self {
        LinkError::Frame(e)
    }
}

impl From<RingError> for LinkError {
    fn from(e: RingError) -> Self {
        LinkError::Ring(e)
    }
}

/// One end of the channel (module doc).
#[derive(Debug)]
pub struct Link {
    sock: OwnedFd,
    tx: RingSender,
    rx: RingReceiver,
    reader: FrameReader,
    /// Bytes taken from the ring, waiting for the frame reader.
    inbox: Vec<u8>,
    /// Descriptors received, in order, not yet claimed by their message.
    fds: VecDeque<OwnedFd>,
    /// The other end closed (bytes already read may still hold messages).
    closed: bool,
    buf: Box<[u8]>,
    /// Messages are held while this is set ([`Link::hold`]).
    holding: bool,
    /// Messages held, as their frames, in the order sent.
    held: Vec<u8>,
    /// The frame being sent, kept: no allocation per message.
    frame: Vec<u8>,
    /// [`Link::look`]s so far: every [`SOCKET_EVERY`]th also reads the socket.
    looks: u32,
}

/// A connected pair of sockets, both close-on-exec.
pub fn socket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: socketpair writes two descriptors into `fds` on success.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both are fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Makes a stream socket non-blocking.
fn non_blocking(sock: &OwnedFd) -> io::Result<()> {
    let raw = sock.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Link {
    /// The daemon's end: makes the rings and offers them on `sock` (made
    /// non-blocking here). The peer takes them with [`Link::accept`].
    pub fn connect(sock: OwnedFd) -> Result<Link, LinkError> {
        non_blocking(&sock)?;
        let rings = RingPair::create(gpumux_ring::DEFAULT_CAPACITY)?;
        send_byte(&sock, RING_OFFER, Some(rings.fd()))?;
        Ok(Link::with(sock, rings))
    }

    /// The device process's end: waits at most `timeout` for the rings
    /// [`Link::connect`] offers on `sock` (made non-blocking here).
    pub fn accept(sock: OwnedFd, timeout: Duration) -> Result<Link, LinkError> {
        non_blocking(&sock)?;
        let deadline = Instant::now() + timeout;
        let mut fds = VecDeque::new();
        let mut first = [0u8; 1];
        loop {
            match crate::fdpass::recv_with_fds(sock.as_raw_fd(), &mut first, &mut fds, false) {
                Ok(0) => return Err(LinkError::Closed),
                Ok(_) => break,
                Err(e) if matches!(e.kind(), io::ErrorKind::Interrupted) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(LinkError::Setup(format!("no rings offered within {timeout:?}")));
                    }
                    wait(&sock, libc::POLLIN, Some(left))?;
                }
                Err(e) => return Err(LinkError::Io(e)),
            }
        }
        let fd = match (first[0], fds.pop_front()) {
            (RING_OFFER, Some(fd)) => fd,
            (byte, fd) => {
                return Err(LinkError::Setup(format!(
                    "the first byte was {byte:#x} {} a descriptor, not the rings' offer",
                    if fd.is_some() { "with" } else { "without" }
                )))
            }
        };
        let rings = RingPair::open(fd, gpumux_ring::DEFAULT_CAPACITY)?;
        Ok(Link::with(sock, rings))
    }

    fn with(sock: OwnedFd, rings: RingPair) -> Link {
        let (tx, rx) = rings.split();
        Link {
            sock,
            tx,
            rx,
            reader: FrameReader::new(),
            inbox: Vec::new(),
            fds: VecDeque::new(),
            closed: false,
            buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
            holding: false,
            held: Vec::new(),
            frame: Vec::new(),
            looks: 0,
        }
    }

    /// From now on, messages sent without a descriptor are held here and go
    /// to the ring together at [`Link::release`] (or before anything that
    /// needs them gone: a message with a descriptor, a receive, a close): the
    /// peer reads the same frames in the same order, with one ring write and
    /// at most one doorbell for all of them. The daemon holds a launch
    /// command and, for a kernel answered from its end known ahead, its
    /// operation's unbind (issue 35).
    pub fn hold(&mut self) {
        self.holding = true;
    }

    /// Sends what was held and stops holding.
    pub fn release(&mut self) -> Result<(), LinkError> {
        self.holding = false;
        self.flush()
    }

    /// Writes the held messages to the ring, if any.
    fn flush(&mut self) -> Result<(), LinkError> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        let written = self.write_all(&held);
        self.held = held;
        self.held.clear();
        written
    }

    /// Sends `msg`, with `fd` for the peer's [`Link::take_fd`] if given.
    pub fn send<T: Serialize>(&mut self, msg: &T, fd: Option<BorrowedFd<'_>>) -> Result<(), LinkError> {
        let mut bytes = std::mem::take(&mut self.frame);
        let sent = self.send_frame(msg, fd, &mut bytes);
        // Kept for the next message unless a large one (a module's source) grew it.
        if bytes.capacity() <= FRAME_KEPT {
            self.frame = bytes;
        }
        sent
    }

    /// [`Link::send`] with `bytes` as the frame's buffer.
    fn send_frame<T: Serialize>(
        &mut self,
        msg: &T,
        fd: Option<BorrowedFd<'_>>,
        bytes: &mut Vec<u8>,
    ) -> Result<(), LinkError> {
        encode_frame_into(msg, bytes)?;
        if self.holding && fd.is_none() {
            self.held.extend_from_slice(bytes);
            return Ok(());
        }
        // Held messages first: the peer reads every message in the order sent.
        self.flush()?;
        if let Some(fd) = fd {
            // On the socket before its message is in the ring: the peer
            // finds it there when it reads the message.
            loop {
                match send_byte(&self.sock, FD_MARKER, Some(fd)) {
                    Err(LinkError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.fill()?;
                        wait(&self.sock, libc::POLLOUT, Some(Duration::from_millis(1)))?;
                    }
                    Err(e) => return Err(e),
                    Ok(()) => break,
                }
            }
        }
        self.write_all(bytes)
    }

    /// Writes `bytes` (whole frames) to the ring, ringing the peer's doorbell
    /// if it sleeps; waits while the ring is full.
    fn write_all(&mut self, bytes: &[u8]) -> Result<(), LinkError> {
        let mut sent = 0;
        let start = Instant::now();
        loop {
            sent += self.tx.write(&bytes[sent..])?;
            if self.tx.take_sleeper() {
                self.ring_doorbell()?;
            }
            if sent == bytes.len() {
                return Ok(());
            }
            // The ring is full: take what the peer sends meanwhile, so it
            // never blocks on us; give up if it is gone.
            self.fill()?;
            if self.closed {
                return Err(LinkError::Closed);
            }
            if start.elapsed() < SPIN {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// The next message if one has fully arrived; never blocks.
    /// [`LinkError::Closed`] once the peer closed and every message it sent was taken.
    pub fn try_recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, LinkError> {
        // An answer awaited may be to a message held.
        self.flush()?;
        if let Some(msg) = self.next()? {
            return Ok(Some(msg));
        }
        self.fill()?;
        if let Some(msg) = self.next()? {
            return Ok(Some(msg));
        }
        if self.closed {
            return Err(LinkError::Closed);
        }
        Ok(None)
    }

    /// [`Link::try_recv`] for a caller that looks again and again while it
    /// does other work (the core's look for a poll's answer between the
    /// requests it handles meanwhile): the ring at every look, the socket
    /// (the peer's end of stream, descriptors) at every `SOCKET_EVERY`th,
    /// as [`Link::recv_spin`] does. A `recvmsg` at every look was half the
    /// core thread's time with 8 clients launching on sim:h100 (perf,
    /// issue 35), each look a system call before the next request or the
    /// answer was seen. A socket read at every look, as before, measured no
    /// different beyond the runs' spread on the H200 (docs/program-speed.md;
    /// its switch is in git: f0dceeb).
    pub fn look<T: DeserializeOwned>(&mut self) -> Result<Option<T>, LinkError> {
        self.looks = self.looks.wrapping_add(1);
        if self.looks.is_multiple_of(SOCKET_EVERY) {
            return self.try_recv();
        }
        self.flush()?;
        if let Some(msg) = self.next()? {
            return Ok(Some(msg));
        }
        self.take_ring()?;
        self.next()
    }

    /// Whether the peer has written anything not yet received (a message,
    /// or the start of one); never blocks, and reads the ring only (a held
    /// poll's look for the daemon's next message: the socket's end of stream
    /// is seen at the next receive).
    pub fn has_message(&mut self) -> Result<bool, LinkError> {
        if self.reader.pending() > 0 {
            return Ok(true);
        }
        self.take_ring()?;
        Ok(self.reader.pending() > 0)
    }

    /// The next message, polling for it without sleeping for at most
    /// `spin` (`Ok(None)` then): the daemon and its device process answer
    /// each other within µs while work is in flight, and a sleep costs a
    /// wake-up of several µs (tens at the tail) per hop. The polls read the
    /// ring; every `SOCKET_EVERY`th (64th) also reads the socket.
    pub fn recv_spin<T: DeserializeOwned>(&mut self, spin: Duration) -> Result<Option<T>, LinkError> {
        self.recv_spin_between(spin, || false)
    }

    /// [`Link::recv_spin`], calling `between` each time the ring had
    /// nothing (the device process's looks between messages,
    /// `GPUMUX_DEEPEN_BETWEEN`): a message waiting is always read first.
    /// `between` says whether it did work; the spin's window starts again
    /// after work, so that a device busy with what it looks at does not
    /// go to sleep on the socket meanwhile.
    pub fn recv_spin_between<T: DeserializeOwned>(
        &mut self,
        spin: Duration,
        mut between: impl FnMut() -> bool,
    ) -> Result<Option<T>, LinkError> {
        self.flush()?;
        let mut start = Instant::now();
        let mut tries = 0u32;
        loop {
            tries = tries.wrapping_add(1);
            if tries.is_multiple_of(SOCKET_EVERY) {
                if let Some(msg) = self.try_recv()? {
                    return Ok(Some(msg));
                }
            } else {
                self.take_ring()?;
                if let Some(msg) = self.next()? {
                    return Ok(Some(msg));
                }
            }
            if between() {
                start = Instant::now();
                continue;
            }
            if start.elapsed() >= spin {
                return self.try_recv();
            }
            gpumux_ring::relax(tries);
        }
    }

    /// The next message, waiting for it at most `timeout` (`Ok(None)` then);
    /// it polls for [`SPIN`] first, then sleeps on the socket.
    pub fn recv_timeout<T: DeserializeOwned>(&mut self, timeout: Duration) -> Result<Option<T>, LinkError> {
        let spin = crate::spin::window(SPIN);
        if let Some(msg) = self.recv_spin(spin.min(timeout))? {
            return Ok(Some(msg));
        }
        let deadline = Instant::now() + timeout.saturating_sub(spin);
        loop {
            if let Some(msg) = self.try_recv()? {
                return Ok(Some(msg));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.wait_readable(Some(left))?;
        }
    }

    /// Sleeps until a message, a doorbell or the peer's close arrives, or
    /// `timeout` passes (`None`: no limit). Call it once [`Link::try_recv`]
    /// has nothing.
    pub fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<(), LinkError> {
        self.flush()?;
        if self.closed || self.rx.available()? > 0 {
            return Ok(());
        }
        // Tell the peer to ring, then look once more (gpumux-ring's "Sleeping").
        use std::os::fd::AsFd;
        Ok(self.rx.sleep_on(self.sock.as_fd(), timeout)?)
    }

    /// Tells the peer we are done (it reads end of stream), keeping the socket.
    pub fn close(&mut self) {
        // What was held goes first; a peer already gone makes it moot.
        let _ = self.flush();
        // SAFETY: shutdown on a descriptor we own; an error (already closed) changes nothing.
        unsafe {
            libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR);
        }
    }

    /// The oldest descriptor received and not yet claimed (the one sent with
    /// the message just taken, for messages that carry one).
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        if self.fds.is_empty() {
            // Sent before its message: on the socket by now if not read yet.
            let _ = self.fill_socket();
        }
        self.fds.pop_front()
    }

    /// The next whole message among the bytes taken, if any.
    fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>, LinkError> {
        match self.reader.next_body()? {
            Some(body) => Ok(Some(decode_frame_body(&body)?)),
            None => Ok(None),
        }
    }

    /// Moves what the ring holds to the frame reader.
    fn take_ring(&mut self) -> Result<(), LinkError> {
        self.inbox.clear();
        if self.rx.read_into(&mut self.inbox, usize::MAX)? > 0 {
            self.reader.extend(&self.inbox);
        }
        Ok(())
    }

    /// Reads the socket, then the ring: after an end of stream is seen,
    /// everything the peer wrote before it closed is in the ring.
    fn fill(&mut self) -> Result<(), LinkError> {
        self.fill_socket()?;
        self.take_ring()
    }

    /// Reads everything on the socket now (doorbells, descriptors, the end).
    fn fill_socket(&mut self) -> Result<(), LinkError> {
        while !self.closed {
            match crate::fdpass::recv_with_fds(self.sock.as_raw_fd(), &mut self.buf, &mut self.fds, false) {
                Ok(0) => self.closed = true,
                // Doorbells and descriptor markers: the bytes say nothing more.
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => self.closed = true,
                Err(e) => return Err(LinkError::Io(e)),
            }
        }
        Ok(())
    }

    /// Wakes the peer sleeping on the socket.
    fn ring_doorbell(&mut self) -> Result<(), LinkError> {
        use std::os::fd::AsFd;
        gpumux_ring::ring_doorbell(self.sock.as_fd()).map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => LinkError::Closed,
            _ => LinkError::Io(e),
        })
    }
}

/// Sends one byte, with `fd` as `SCM_RIGHTS` if given.
fn send_byte(sock: &OwnedFd, byte: u8, fd: Option<BorrowedFd<'_>>) -> Result<(), LinkError> {
    loop {
        match send_some(sock, &[byte], fd) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET)) => {
                return Err(LinkError::Closed)
            }
            Err(e) => return Err(LinkError::Io(e)),
        }
    }
}

/// Waits for `events` on `sock`, at most `timeout` (`None`: no limit).
fn wait(sock: &OwnedFd, events: libc::c_short, timeout: Option<Duration>) -> io::Result<()> {
    let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events, revents: 0 };
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: one valid pollfd; `ts_ptr` is null or points to a live timespec.
    let rc = unsafe { libc::ppoll(&mut pfd, 1, ts_ptr, std::ptr::null()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// One `sendmsg` of (a prefix of) `bytes`, with `fd` as `SCM_RIGHTS` if given.
fn send_some(sock: &OwnedFd, bytes: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<usize> {
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut libc::c_void, iov_len: bytes.len() };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut cmsg = vec![0u64; space.div_ceil(8)];
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer has room for one header and one descriptor.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>(), fd.as_raw_fd());
        }
    }
    // SAFETY: msg describes live buffers; MSG_NOSIGNAL turns a closed peer into EPIPE, not SIGPIPE.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn large_messages_both_ways_do_not_deadlock_and_fds_arrive_with_theirs() {
        let (a, b) = socket_pair().unwrap();
        let big: Vec<u8> = (0..3_000_000u32).map(|i| i as u8).collect();
        let expected = big.clone();
        let other = std::thread::spawn(move || {
            let mut link = Link::accept(b, Duration::from_secs(10)).unwrap();
            link.send(&big, None).unwrap();
            let got: Vec<u8> = link.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
            let fd = link.take_fd();
            (got, fd.is_some())
        });
        let mut link = Link::connect(a).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        link.send(&expected, Some(file.as_fd())).unwrap();
        let got: Vec<u8> = link.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        assert!(got == expected);
        let (theirs, fd_came) = other.join().unwrap();
        assert!(theirs == expected);
        assert!(fd_came, "the descriptor came with its message");
        assert!(matches!(link.try_recv::<Vec<u8>>(), Err(LinkError::Closed)), "the peer's close is seen");
    }

    /// Held messages reach the peer only at the release (or before a
    /// message with a descriptor, or a receive), all of them, in order.
    #[test]
    fn held_messages_go_together_at_the_release_in_the_order_sent() {
        let (a, b) = socket_pair().unwrap();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel::<u32>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            let mut link = Link::accept(b, Duration::from_secs(10)).unwrap();
            let mut got = Vec::new();
            while got.len() < 7 {
                let n: u32 = link.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
                let _ = seen_tx.send(n);
                got.push(n);
                if n == 2 {
                    // The sender holds 3 and 4 until told to go on.
                    let _ = go_rx.recv();
                }
            }
            let fd = link.take_fd();
            (got, fd.is_some())
        });
        let mut link = Link::connect(a).unwrap();
        link.send(&1u32, None).unwrap();
        link.hold();
        link.send(&2u32, None).unwrap();
        link.send(&3u32, None).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(seen_rx.try_recv().is_ok_and(|n| n == 1), "a message before the hold went at once");
        assert!(seen_rx.try_recv().is_err(), "held messages wait for the release");
        link.release().unwrap();
        assert_eq!(seen_rx.recv_timeout(Duration::from_secs(10)), Ok(2));
        let _ = go_tx.send(());
        assert_eq!(seen_rx.recv_timeout(Duration::from_secs(10)), Ok(3));
        // Held again: a message with a descriptor sends the held ones first.
        link.hold();
        link.send(&4u32, None).unwrap();
        link.send(&5u32, None).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        link.send(&6u32, Some(file.as_fd())).unwrap();
        link.send(&7u32, None).unwrap();
        // A receive sends what is held (an answer may be to it).
        assert!(link.try_recv::<u32>().unwrap().is_none());
        let (got, fd_came) = other.join().unwrap();
        assert_eq!(got, [1, 2, 3, 4, 5, 6, 7], "every message, in the order sent");
        assert!(fd_came, "the descriptor came with its message");
        link.release().unwrap();
    }

    /// A look ([`Link::look`]) finds each message the peer wrote, in order,
    /// sends what was held first (the answer awaited may be to it), and
    /// sees the peer's close within [`SOCKET_EVERY`] looks of the last
    /// message.
    #[test]
    fn looks_find_every_message_in_order_and_the_peers_close() {
        let (a, b) = socket_pair().unwrap();
        let other = std::thread::spawn(move || {
            let mut link = Link::accept(b, Duration::from_secs(10)).unwrap();
            // Answers each number with its double, then closes after 0.
            loop {
                let n: u32 = link.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
                link.send(&(n * 2), None).unwrap();
                if n == 0 {
                    break;
                }
            }
        });
        let mut link = Link::connect(a).unwrap();
        let look_for = |link: &mut Link| -> Result<u32, LinkError> {
            let start = Instant::now();
            loop {
                if let Some(n) = link.look::<u32>()? {
                    return Ok(n);
                }
                assert!(start.elapsed() < Duration::from_secs(10), "no answer within 10 s");
                std::thread::yield_now();
            }
        };
        for n in [3u32, 1, 7] {
            link.hold();
            link.send(&n, None).unwrap();
            // Held until the look: the peer can answer only once it is sent.
            assert_eq!(look_for(&mut link).unwrap(), n * 2);
            link.release().unwrap();
        }
        link.send(&0u32, None).unwrap();
        assert_eq!(look_for(&mut link).unwrap(), 0);
        other.join().unwrap();
        let mut looks = 0;
        let closed = loop {
            looks += 1;
            match link.look::<u32>() {
                Err(LinkError::Closed) => break true,
                Ok(None) if looks <= 10 * SOCKET_EVERY => std::thread::sleep(Duration::from_millis(1)),
                _ => break false,
            }
        };
        assert!(closed, "the peer's close was not seen in {looks} looks");
        assert!(looks <= 2 * SOCKET_EVERY, "the close took {looks} looks to be seen");
    }
}

//! A framed, two-way channel over one end of a Unix `socketpair`, with
//! descriptors passed alongside (`SCM_RIGHTS`): how the daemon and its
//! device process talk ([`super::remote`], [`crate::device_host`]).
//!
//! Messages are `gpumux-proto` frames (4-byte length, postcard body) of any
//! serde type. The socket is non-blocking at both ends, and a write that
//! would block first reads what the peer sent meanwhile (kept for the next
//! receive) before it waits: so a large message one way (a module's source)
//! never deadlocks against a stream of events the other way.

use gpumux_proto::{decode_frame_body, encode_frame, FrameError, FrameReader};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// How long a reader polls before it sleeps on the socket (see
/// [`Link::recv_spin`]): one core busy for at most this long after each
/// message, which is what a reply within the window saves a wake-up for.
/// Every such poll in gpumuxd and its client library yields the CPU
/// between tries (`sched_yield`), so on a machine with fewer free cores
/// than polling threads the threads with work still run.
pub const SPIN: Duration = Duration::from_micros(200);

/// Bytes one read takes at most.
const READ_CHUNK: usize = 64 << 10;

/// Why a link failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The other end closed its socket (its process exited or was killed).
    #[error("the other end closed the link")]
    Closed,
    /// A socket call failed.
    #[error("the device link failed: {0}")]
    Io(#[from] io::Error),
    /// Bytes that are not a message of the expected type (a bug on one side).
    #[error("a malformed message on the device link: {0}")]
    Frame(#[from] FrameError),
}

/// One end of the channel (module doc).
#[derive(Debug)]
pub struct Link {
    sock: OwnedFd,
    reader: FrameReader,
    /// Descriptors received, in order, not yet claimed by their message.
    fds: VecDeque<OwnedFd>,
    /// The other end closed (bytes already read may still hold messages).
    closed: bool,
    buf: Box<[u8]>,
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

impl Link {
    /// Takes over a connected stream socket (made non-blocking here).
    pub fn new(sock: OwnedFd) -> io::Result<Link> {
        let raw = sock.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
        if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Link {
            sock,
            reader: FrameReader::new(),
            fds: VecDeque::new(),
            closed: false,
            buf: vec![0u8; READ_CHUNK].into_boxed_slice(),
        })
    }

    /// Sends `msg`, with `fd` attached to its first byte if given.
    pub fn send<T: Serialize>(&mut self, msg: &T, fd: Option<BorrowedFd<'_>>) -> Result<(), LinkError> {
        let bytes = encode_frame(msg)?;
        let mut sent = 0;
        while sent < bytes.len() {
            let attach = if sent == 0 { fd } else { None };
            match send_some(&self.sock, &bytes[sent..], attach) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Take what the peer sends meanwhile, so it never blocks on us.
                    self.fill()?;
                    wait(&self.sock, libc::POLLIN | libc::POLLOUT, None)?;
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET)) => {
                    return Err(LinkError::Closed)
                }
                Err(e) => return Err(LinkError::Io(e)),
            }
        }
        Ok(())
    }

    /// The next message if one has fully arrived; never blocks.
    /// [`LinkError::Closed`] once the peer closed and every message it sent was taken.
    pub fn try_recv<T: DeserializeOwned>(&mut self) -> Result<Option<T>, LinkError> {
        if let Some(body) = self.reader.next_body()? {
            return Ok(Some(decode_frame_body(&body)?));
        }
        self.fill()?;
        if let Some(body) = self.reader.next_body()? {
            return Ok(Some(decode_frame_body(&body)?));
        }
        if self.closed {
            return Err(LinkError::Closed);
        }
        Ok(None)
    }

    /// The next message, polling for it without sleeping for at most
    /// `spin` (`Ok(None)` then): the daemon and its device process answer
    /// each other within µs while work is in flight, and a sleep in
    /// `ppoll` costs a wake-up of several µs (tens at the tail) per hop.
    pub fn recv_spin<T: DeserializeOwned>(&mut self, spin: Duration) -> Result<Option<T>, LinkError> {
        let start = Instant::now();
        loop {
            if let Some(msg) = self.try_recv()? {
                return Ok(Some(msg));
            }
            if start.elapsed() >= spin {
                return Ok(None);
            }
            std::thread::yield_now();
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

    /// Sleeps until bytes (or the peer's close) arrive, or `timeout` passes
    /// (`None`: no limit). Call it once [`Link::try_recv`] has nothing.
    pub fn wait_readable(&mut self, timeout: Option<Duration>) -> Result<(), LinkError> {
        if !self.closed {
            wait(&self.sock, libc::POLLIN, timeout)?;
        }
        Ok(())
    }

    /// Tells the peer we are done (it reads end of stream), keeping the socket.
    pub fn close(&mut self) {
        // SAFETY: shutdown on a descriptor we own; an error (already closed) changes nothing.
        unsafe {
            libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR);
        }
    }

    /// The oldest descriptor received and not yet claimed (the one sent with
    /// the message just taken, for messages that carry one).
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    /// Reads everything available now into the frame buffer.
    fn fill(&mut self) -> Result<(), LinkError> {
        while !self.closed {
            match crate::fdpass::recv_with_fds(self.sock.as_raw_fd(), &mut self.buf, &mut self.fds, false) {
                Ok(0) => self.closed = true,
                Ok(n) => self.reader.extend(&self.buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => self.closed = true,
                Err(e) => return Err(LinkError::Io(e)),
            }
        }
        Ok(())
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
            let mut link = Link::new(b).unwrap();
            link.send(&big, None).unwrap();
            let got: Vec<u8> = link.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
            let fd = link.take_fd();
            (got, fd.is_some())
        });
        let mut link = Link::new(a).unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        link.send(&expected, Some(file.as_fd())).unwrap();
        let got: Vec<u8> = link.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        assert!(got == expected);
        let (theirs, fd_came) = other.join().unwrap();
        assert!(theirs == expected);
        assert!(fd_came, "the descriptor came with its message");
        assert!(matches!(link.try_recv::<Vec<u8>>(), Err(LinkError::Closed)), "the peer's close is seen");
    }
}

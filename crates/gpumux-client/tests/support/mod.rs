//! A tiny fake gpumuxd for tests: one client, speaking gpumux-proto over a
//! Unix socket, with the shared region mapped as the real daemon maps it.
//!
//! Host copies are answered late, the way a DMA finishes: a copy's data is
//! moved only when its reply is sent, and a reply is sent only once a second
//! copy is waiting (`Behaviour::hold` more; or nothing more came for 50 ms).
//! A client that rewrote a slot of its region before that slot's reply would
//! see its data corrupted.

#![allow(dead_code)] // each test file uses a part

use gpumux_proto::*;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the fake saw.
#[derive(Debug, Default)]
pub struct Log {
    pub requests: Vec<Request>,
    /// Seals of the region's memfd.
    pub seals: i32,
    /// Its size per fstat.
    pub shm_size: u64,
    /// Whether the memfd came with the AttachShm frame.
    pub fd_came_with_attach: bool,
    /// Most host copies received and not yet answered.
    pub max_outstanding: usize,
    /// The client offered rings (refused here).
    pub rings_offered: bool,
}

pub struct FakeDaemon {
    pub socket: PathBuf,
    thread: Option<JoinHandle<Log>>,
}

/// How the fake behaves.
#[derive(Clone, Copy)]
pub struct Behaviour {
    /// Limits.shm_bytes in the Welcome.
    pub shm_limit: u64,
    /// Close the connection right after the Welcome.
    pub close_after_welcome: bool,
    /// Close it right after the Welcome, saying why first (an error frame
    /// with id 0, as the daemon does when it ends a connection).
    pub farewell_after_welcome: bool,
    /// Host copies held unanswered: the oldest is answered (its data moved)
    /// once this many wait (or nothing more came for 50 ms).
    pub hold: usize,
    /// Refuse (`Quota`) an `AttachShm` of at least this many bytes.
    pub refuse_attach_from: Option<u64>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            shm_limit: 4096,
            close_after_welcome: false,
            farewell_after_welcome: false,
            hold: 2,
            refuse_attach_from: None,
        }
    }
}

impl FakeDaemon {
    pub fn start(behaviour: Behaviour) -> FakeDaemon {
        static N: AtomicU32 = AtomicU32::new(0);
        let socket = std::env::temp_dir().join(format!(
            "gpumux-client-test-{}-{}.sock",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        let thread = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            serve(stream, behaviour)
        });
        FakeDaemon { socket, thread: Some(thread) }
    }

    /// Waits for the client to leave; what the fake saw.
    pub fn finish(mut self) -> Log {
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

struct Region {
    ptr: *mut u8,
    len: usize,
}

fn reply(stream: &UnixStream, id: u64, result: Result<Reply, ErrorReply>) {
    use std::io::Write;
    let bytes = encode_frame(&ServerFrame::Reply { id, result }).unwrap();
    let _ = (&*stream).write_all(&bytes);
}

/// Reads with recvmsg, returning bytes and any fds that came along.
fn recv(fd: RawFd, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>)> {
    let mut control = [0u64; 16];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    let raw = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok((n as usize, fds))
}

fn serve(stream: UnixStream, behaviour: Behaviour) -> Log {
    let mut log = Log::default();
    let mut frames = FrameReader::new();
    let mut fds: VecDeque<OwnedFd> = VecDeque::new();
    let mut region: Option<Region> = None;
    let mut buffers: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut outstanding: VecDeque<(u64, Request)> = VecDeque::new();
    stream.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = vec![0u8; 1 << 16];

    // Moves a copy's data (now, as a DMA completing) and answers it.
    let finish = |id: u64, request: &Request, region: &Option<Region>, buffers: &mut HashMap<u64, Vec<u8>>| {
        let r = region.as_ref().unwrap();
        let shm = unsafe { std::slice::from_raw_parts_mut(r.ptr, r.len) };
        match request {
            Request::CopyToDevice { dst, shm_offset, bytes, .. } => {
                let (o, s, n) = (dst.offset as usize, *shm_offset as usize, *bytes as usize);
                buffers.get_mut(&dst.buffer.0).unwrap()[o..o + n].copy_from_slice(&shm[s..s + n]);
            }
            Request::CopyToHost { src, shm_offset, bytes, .. } => {
                let (o, s, n) = (src.offset as usize, *shm_offset as usize, *bytes as usize);
                shm[s..s + n].copy_from_slice(&buffers[&src.buffer.0][o..o + n]);
            }
            _ => unreachable!(),
        }
        reply(&stream, id, Ok(Reply::Done));
    };

    loop {
        let (n, got) = match recv(stream.as_raw_fd(), &mut buf) {
            Ok(x) => x,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                while let Some((id, request)) = outstanding.pop_front() {
                    finish(id, &request, &region, &mut buffers);
                }
                continue;
            }
            Err(_) => return log,
        };
        if n == 0 {
            return log;
        }
        let fds_before = fds.len();
        fds.extend(got);
        frames.extend(&buf[..n]);
        while let Some(body) = frames.next_body().unwrap() {
            let ClientFrame { id, request } = decode_frame_body(&body).unwrap();
            if let Request::UseRings { .. } = request {
                // Refused, as a daemon that cannot map them would: the
                // client goes on over the socket, which this fake reads.
                // (The real daemon's rings are tested in gpumuxd's tests.)
                log.rings_offered = true;
                fds.clear();
                reply(&stream, id, Err(ErrorReply::new(ErrorKind::Invalid, "the fake daemon reads the socket only")));
                continue;
            }
            log.requests.push(request.clone());
            match &request {
                Request::Hello { .. } => {
                    let limits = Limits {
                        max_priority: 10,
                        max_weight: 10.0,
                        memory_bytes: 1 << 30,
                        queued_ops: 100,
                        shm_bytes: behaviour.shm_limit,
                        host_memory_bytes: 1 << 30,
                    };
                    let welcome = Welcome {
                        version: VERSION,
                        client: 1,
                        device: "sim:h100".into(),
                        policy: "fcfs".into(),
                        sms: 132,
                        limits,
                        gpu: 0,
                    };
                    reply(&stream, id, Ok(Reply::Welcome(welcome)));
                    if behaviour.farewell_after_welcome {
                        reply(
                            &stream,
                            0,
                            Err(ErrorReply::new(ErrorKind::Protocol, "the fake daemon ends this connection")),
                        );
                        return log;
                    }
                    if behaviour.close_after_welcome {
                        return log;
                    }
                }
                Request::AttachShm { bytes } if behaviour.refuse_attach_from.is_some_and(|from| *bytes >= from) => {
                    fds.pop_front();
                    reply(&stream, id, Err(ErrorReply::new(ErrorKind::Quota, "no more pinned memory here")));
                }
                Request::AttachShm { bytes } => {
                    log.fd_came_with_attach = fds.len() > fds_before;
                    let fd = fds.pop_front().unwrap();
                    log.seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
                    log.shm_size = st.st_size as u64;
                    let len = *bytes as usize;
                    let p = unsafe {
                        libc::mmap(
                            std::ptr::null_mut(),
                            len,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_SHARED,
                            fd.as_raw_fd(),
                            0,
                        )
                    };
                    assert_ne!(p, libc::MAP_FAILED);
                    region = Some(Region { ptr: p.cast(), len });
                    reply(&stream, id, Ok(Reply::Done));
                }
                Request::Alloc { bytes: 0 } => reply(
                    &stream,
                    id,
                    Err(ErrorReply::new(ErrorKind::Invalid, "an allocation of 0 bytes; ask for at least 1")),
                ),
                Request::Alloc { bytes } => {
                    let handle = buffers.len() as u64 + 1;
                    buffers.insert(handle, vec![0; *bytes as usize]);
                    reply(&stream, id, Ok(Reply::Buffer(BufferId(handle))));
                }
                Request::CopyToDevice { .. } | Request::CopyToHost { .. } => {
                    outstanding.push_back((id, request.clone()));
                    log.max_outstanding = log.max_outstanding.max(outstanding.len());
                    if outstanding.len() >= behaviour.hold {
                        let (id, request) = outstanding.pop_front().unwrap();
                        finish(id, &request, &region, &mut buffers);
                    }
                }
                Request::SyncStream(_) => {
                    // A notice first: the client must keep it for take_notices.
                    let notice = Notice::ContextLost {
                        caused_by_you: false,
                        what: "another client's kernel faulted".into(),
                        lost: LostWork { launches: vec!["vector_add".into()], copies: 1, buffers: vec![BufferId(1)] },
                    };
                    let bytes = encode_frame(&ServerFrame::Notice(notice)).unwrap();
                    use std::io::Write;
                    let _ = (&stream).write_all(&bytes);
                    reply(&stream, id, Ok(Reply::Done));
                }
                Request::Goodbye => {
                    reply(&stream, id, Ok(Reply::Done));
                    return log;
                }
                // Everything else, Status included, gets Done: a wrong reply
                // for the requests that expect another.
                _ => reply(&stream, id, Ok(Reply::Done)),
            }
        }
    }
}

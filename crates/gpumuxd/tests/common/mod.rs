//! A daemon process on the simulated device and a minimal client speaking
//! only `gpumux-proto` over a real socket (the client library is not used).
#![allow(dead_code)]

use gpumux_proto::*;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// A `gpumuxd` child on `sim:h100`, stopped with SIGTERM on drop.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    /// Holds the socket and the config; removed on drop, after the daemon
    /// has stopped (fields drop after `Drop::drop`).
    dir: tempfile::TempDir,
}

impl Daemon {
    pub fn start(config: Option<&str>) -> Daemon {
        Daemon::start_with(config, &[])
    }

    /// With more command-line arguments (`--device-process`).
    pub fn start_with(config: Option<&str>, args: &[&str]) -> Daemon {
        Daemon::start_on(None, config, args)
    }

    /// On `device` (`None`: `GPUMUXD_TEST_DEVICE`, else `sim:h100`).
    pub fn start_on(device: Option<&str>, config: Option<&str>, args: &[&str]) -> Daemon {
        Daemon::start_env(device, config, args, &[])
    }

    /// As [`Daemon::start_on`], with variables set in the daemon's environment only.
    pub fn start_env(device: Option<&str>, config: Option<&str>, args: &[&str], vars: &[(&str, &str)]) -> Daemon {
        // Under /tmp, so the socket's path stays well within the 108 bytes allowed.
        let dir = tempfile::Builder::new().prefix("gpumuxd-test-").tempdir().expect("a temporary directory");
        let socket = dir.path().join("sub").join("g.sock");
        // GPUMUXD_TEST_BIN / GPUMUXD_TEST_DEVICE: the same test against another
        // daemon binary and device (a GPU script runs some tests on `cuda:0`).
        let bin = std::env::var("GPUMUXD_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpumuxd").into());
        let device = device
            .map(str::to_string)
            .unwrap_or_else(|| std::env::var("GPUMUXD_TEST_DEVICE").unwrap_or_else(|_| "sim:h100".into()));
        let mut cmd = Command::new(bin);
        cmd.env("RUST_LOG", std::env::var("GPUMUXD_TEST_LOG").unwrap_or_else(|_| "warn".into()));
        cmd.args(["--device", device.as_str(), "--socket"]).arg(&socket).args(args).envs(vars.iter().copied());
        if let Some(text) = config {
            let path = dir.path().join("config.toml");
            std::fs::write(&path, text).unwrap();
            cmd.arg("--config").arg(path);
        }
        let child = cmd.spawn().expect("gpumuxd starts");
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "gpumuxd did not listen on {}", socket.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        Daemon { child, socket, dir }
    }

    /// SIGTERM, then the exit status.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// The pids of the daemon's child processes (its device process).
    pub fn children(&self) -> Vec<i32> {
        let me = self.child.id() as i32;
        let mut pids = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // pid (comm) state ppid ...: comm may hold spaces, so read after its last ')'.
            let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
            let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok());
            let zombie = rest.split_whitespace().next() == Some("Z");
            if ppid == Some(me) && !zombie {
                pids.push(pid);
            }
        }
        pids
    }

    /// The one device process, waiting up to 10 s for it to be there.
    pub fn device_process(&self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let [pid] = self.children().as_slice() {
                return *pid;
            }
            assert!(Instant::now() < deadline, "no single device process: {:?}", self.children());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.alive() {
            self.stop();
        }
    }
}

/// A client of the library (`gpumux_client`) named `name` on `d`, with
/// kernel `kernel` of `source` loaded and a 4 KiB buffer for its arguments:
/// the setup of the tests that launch one small kernel again and again.
pub fn library_client(
    d: &Daemon,
    name: &str,
    source: &str,
    kernel: &str,
) -> (gpumux_client::Client, gpumux_client::Kernel, gpumux_client::Buffer) {
    let options =
        gpumux_client::ConnectOptions { socket: Some(d.socket.clone()), ..gpumux_client::ConnectOptions::named(name) };
    let client = gpumux_client::Client::connect(options).expect("connects");
    let module = client.load_module("m", source, &[]).expect("loads");
    let k = module.kernel(kernel).expect("the kernel");
    let buf = client.alloc(4096).expect("allocates");
    (client, k, buf)
}

pub struct Client {
    pub sock: UnixStream,
    reader: FrameReader,
    next_id: u64,
    pub notices: Vec<Notice>,
    /// Replies that came while waiting for another.
    early: Vec<(u64, Result<Reply, ErrorReply>)>,
    /// Launches sent with [`Client::launch_ok`]: a reply to one is a refusal.
    launched: Vec<u64>,
}

impl Client {
    pub fn connect(d: &Daemon) -> Client {
        Client::connect_to(&d.socket)
    }

    pub fn connect_to(socket: &std::path::Path) -> Client {
        let sock = UnixStream::connect(socket).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Client {
            sock,
            reader: FrameReader::new(),
            next_id: 1,
            notices: Vec::new(),
            early: Vec::new(),
            launched: Vec::new(),
        }
    }

    pub fn hello(d: &Daemon, name: &str, priority: i32) -> (Client, Welcome) {
        let mut c = Client::connect(d);
        let w = c.call(Request::hello(name, priority));
        match w {
            Ok(Reply::Welcome(w)) => (c, w),
            other => panic!("no welcome: {other:?}"),
        }
    }

    pub fn send(&mut self, request: Request) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.sock.write_all(&encode_frame(&ClientFrame { id, request }).unwrap()).unwrap();
        id
    }

    /// Sends `AttachShm` with `fd` alongside (SCM_RIGHTS).
    pub fn attach(&mut self, fd: &OwnedFd, bytes: u64) -> Result<Reply, ErrorReply> {
        let id = self.send_fd(Request::AttachShm { bytes }, Some(fd));
        self.wait(id)
    }

    /// Sends `request` with `fd` alongside if given (SCM_RIGHTS); its id.
    pub fn send_fd(&mut self, request: Request, fd: Option<&OwnedFd>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        send_fd(&self.sock, &encode_frame(&ClientFrame { id, request }).unwrap(), fd);
        id
    }

    /// The next frame, or None at end of stream.
    pub fn next_frame(&mut self) -> Option<ServerFrame> {
        loop {
            if let Some(body) = self.reader.next_body().unwrap() {
                return Some(decode_frame_body(&body).unwrap());
            }
            let mut buf = [0u8; 65536];
            match self.sock.read(&mut buf) {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.reader.extend(&buf[..n]),
            }
        }
    }

    pub fn wait(&mut self, id: u64) -> Result<Reply, ErrorReply> {
        if let Some(i) = self.early.iter().position(|(i, _)| *i == id) {
            return self.early.remove(i).1;
        }
        loop {
            match self.next_frame().expect("the daemon closed the connection") {
                ServerFrame::Reply { id: got, result } if self.launched.contains(&got) => {
                    panic!("launch {got} was refused: {result:?}")
                }
                ServerFrame::Reply { id: got, result } if got == id => return result,
                ServerFrame::Reply { id: got, result } => self.early.push((got, result)),
                ServerFrame::Notice(n) => self.notices.push(n),
            }
        }
    }

    pub fn call(&mut self, request: Request) -> Result<Reply, ErrorReply> {
        let id = self.send(request);
        self.wait(id)
    }

    pub fn ok(&mut self, request: Request) -> Reply {
        assert!(!matches!(request, Request::Launch(_)), "an accepted launch has no reply: use launch_ok");
        let name = request.name();
        self.call(request).unwrap_or_else(|e| panic!("{name}: {e:?}"))
    }

    /// Sends a launch the test expects accepted. An accepted launch gets no
    /// reply (protocol version 3), so a reply to it, seen by any later wait,
    /// is a refusal and fails the test there.
    pub fn launch_ok(&mut self, request: Request) {
        assert!(matches!(request, Request::Launch(_)), "launch_ok sends launches");
        let id = self.send(request);
        self.launched.push(id);
    }

    pub fn alloc(&mut self, bytes: u64) -> BufferId {
        match self.ok(Request::Alloc { bytes }) {
            Reply::Buffer(b) => b,
            other => panic!("{other:?}"),
        }
    }

    pub fn load(&mut self, source: &str) -> Vec<KernelEntry> {
        match self.ok(Request::LoadModule { name: "t.cu".into(), source: source.into(), options: vec![] }) {
            Reply::Module { kernels, .. } => kernels,
            other => panic!("{other:?}"),
        }
    }

    pub fn status(&mut self) -> Status {
        match self.ok(Request::Status) {
            Reply::Status(s) => s,
            other => panic!("{other:?}"),
        }
    }
}

pub fn launch(kernel: KernelId, blocks: u32, block_time_ns: u64, args: Vec<Arg>) -> Request {
    Request::Launch(Launch {
        kernel,
        grid: [blocks, 1, 1],
        block: [128, 1, 1],
        shared_bytes: 0,
        args,
        stream: StreamId(0),
        block_time_ns: Some(block_time_ns),
    })
}

/// Sends `bytes` in one `sendmsg`, with `fd` as SCM_RIGHTS if given.
pub fn send_fd(sock: &UnixStream, bytes: &[u8], fd: Option<&OwnedFd>) {
    // SAFETY: a msghdr of live buffers; one descriptor in a control buffer sized for it.
    unsafe {
        let space = libc::CMSG_SPACE(4) as usize;
        let mut cmsg = vec![0u64; space.div_ceil(8)];
        let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut _, iov_len: bytes.len() };
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if let Some(fd) = fd {
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), fd.as_raw_fd());
        }
        assert_eq!(libc::sendmsg(sock.as_raw_fd(), &msg, 0), bytes.len() as isize);
    }
}

/// A memfd of `bytes`, sealed against shrinking, as the client library makes it.
pub fn memfd(bytes: u64) -> OwnedFd {
    unsafe {
        let fd = libc::memfd_create(c"gpumux-test".as_ptr(), libc::MFD_ALLOW_SEALING | libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, bytes as i64), 0);
        assert_eq!(libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK), 0);
        OwnedFd::from_raw_fd(fd)
    }
}

pub fn pwrite(fd: &OwnedFd, offset: u64, data: &[u8]) {
    let n = unsafe { libc::pwrite(fd.as_raw_fd(), data.as_ptr().cast(), data.len(), offset as i64) };
    assert_eq!(n, data.len() as isize);
}

pub fn pread(fd: &OwnedFd, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let n = unsafe { libc::pread(fd.as_raw_fd(), v.as_mut_ptr().cast(), len, offset as i64) };
    assert_eq!(n, len as isize);
    v
}

pub fn own_uid() -> u32 {
    unsafe { libc::geteuid() }
}

/// A uid other than this test's that the system knows (root, or another
/// user of /etc/passwd when the test runs as root): a config that admits
/// only uids the system does not know stops the daemon at start.
pub fn other_known_uid() -> u32 {
    if own_uid() != 0 {
        return 0;
    }
    std::fs::read_to_string("/etc/passwd")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(':').nth(2)?.parse::<u32>().ok())
        .find(|&u| u != 0)
        .expect("a user other than root in /etc/passwd")
}

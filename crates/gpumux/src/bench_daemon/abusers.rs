//! The client processes of `gpumux bench daemon --hostile` ([`super::hostile`]):
//! this executable's hidden `bench-hostile-role`, one process per client.
//!
//! * `steady`: a well-behaved client (the client library, the bench's
//!   `empty` kernel): launch + sync in a loop, each latency counted in the
//!   phase the bench last named;
//! * `flood`: connections opened as fast as the daemon takes them (waves of
//!   `--flood`), held a second, closed, again;
//! * `never-read`: `Hello`, then `Status` requests pipelined forever, no
//!   reply ever read; a new connection when the daemon ends one;
//! * `half-frames`: [`HALF_FRAME_CONNECTIONS`] connections, each a `Hello`
//!   then an 8 MiB frame length and half its body, left open; reopened when
//!   the daemon ends them;
//! * `huge-grids`: a module loaded, then launches of 2^31 − 2 blocks of
//!   1024 threads (the most a launch may have) over and over, never a sync;
//!   its replies (refusals) read and counted.
//!
//! The abusers speak the raw protocol (`gpumux-proto`) and ignore their own
//! failures: the daemon refusing or closing their connections is expected,
//! and counted ([`AbuserResult`]). Line protocol with the bench, as
//! `bench-role`'s: `ready` once prepared, then `go`, `phase N` (steady
//! clients: which phase their latencies count in), `stop` (or the end of
//! stdin); the process prints `result <json>` or `error <message>` last.

use super::gpu::{DaemonGpu, JobGpu};
use anyhow::{anyhow, bail, Context, Result};
use gpumux_proto::{
    decode_frame_body, encode_frame, ClientFrame, ErrorKind, FrameReader, KernelId, Launch, Reply, Request,
    ServerFrame, StreamId, MAGIC, MAX_FRAME_BYTES, VERSION,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// What a `bench-hostile-role` process does (module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum HostileRole {
    Steady,
    Flood,
    NeverRead,
    HalfFrames,
    HugeGrids,
}

impl HostileRole {
    /// The four abusers, in the order the bench starts them (the flood last,
    /// a second after the others, so they hold their connections before it
    /// takes every slot of the bench's uid).
    pub const ABUSERS: [HostileRole; 4] =
        [HostileRole::NeverRead, HostileRole::HalfFrames, HostileRole::HugeGrids, HostileRole::Flood];

    /// The abusers `names` asks for, in [`HostileRole::ABUSERS`]' order, or which name is unknown.
    pub fn abusers(names: &[String]) -> Result<Vec<HostileRole>> {
        let known = || HostileRole::ABUSERS.map(HostileRole::name).join(", ");
        let mut picked = Vec::new();
        for n in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
            let Some(r) = HostileRole::ABUSERS.into_iter().find(|r| r.name() == n) else {
                bail!("unknown abuser `{n}` in --hostile-abusers (known: {})", known());
            };
            picked.push(r);
        }
        if picked.is_empty() {
            bail!("--hostile-abusers names none (known: {})", known());
        }
        Ok(HostileRole::ABUSERS.into_iter().filter(|r| picked.contains(r)).collect())
    }

    /// Its name on the command line and in tables.
    pub fn name(self) -> &'static str {
        match self {
            HostileRole::Steady => "steady",
            HostileRole::Flood => "flood",
            HostileRole::NeverRead => "never-read",
            HostileRole::HalfFrames => "half-frames",
            HostileRole::HugeGrids => "huge-grids",
        }
    }

    /// What it does, in a line (the report's legend).
    pub fn describe(self, flood: u32) -> String {
        match self {
            HostileRole::Steady => "launch + sync of an empty kernel in a loop (the client library)".into(),
            HostileRole::Flood => {
                format!("opens up to {flood} connections as fast as it can, holds them 1 s, closes them, again")
            }
            HostileRole::NeverRead => "Hello, then Status requests pipelined forever; never reads a reply".into(),
            HostileRole::HalfFrames => format!(
                "{HALF_FRAME_CONNECTIONS} connections, each Hello, an 8 MiB frame length and {} MiB of its body, left open",
                HALF_FRAME_BODY >> 20
            ),
            HostileRole::HugeGrids => {
                "launches of 2^31 - 2 blocks of 1024 threads over and over, never syncs; reads its refusals".into()
            }
        }
    }
}

/// `gpumux bench-hostile-role`'s arguments (written by the bench, not by hand).
#[derive(clap::Args, Debug)]
pub struct HostileRoleArgs {
    #[arg(long, value_enum)]
    pub role: HostileRole,
    /// The daemon's socket.
    #[arg(long)]
    pub socket: PathBuf,
    /// The client's name (steady clients; `gpumux ps` shows it).
    #[arg(long, default_value = "hostile-bench")]
    pub name: String,
    /// Connections per wave of the flood.
    #[arg(long, default_value_t = 2000)]
    pub flood: u32,
}

/// Connections the half-frames abuser keeps open: half of the daemon's
/// default per-uid limit (64), which all the bench's clients share.
pub const HALF_FRAME_CONNECTIONS: usize = 32;
/// Bytes of body it sends after each frame's 8 MiB length.
pub const HALF_FRAME_BODY: usize = (MAX_FRAME_BYTES / 2) as usize;
/// How long the flood holds each wave.
const FLOOD_HOLD: Duration = Duration::from_secs(1);
/// Blocks of the huge-grids abuser's launches: the most a launch may have.
pub const HUGE_GRID_BLOCKS: u32 = (1 << 31) - 2;

// ---------------------------------------------------------------------------
// Latency histogram

/// Sub-buckets per power of two: a bucket is at most 1/64 (1.6 %) wide.
const SUB: u64 = 64;

/// Launch + sync latencies, ns, in log-linear buckets 1.6 % wide (a
/// minute of launches in a few KiB), with the exact count and maximum.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Hist {
    /// (bucket, count), buckets ascending, empty ones left out.
    pub buckets: Vec<(u32, u64)>,
    pub count: u64,
    pub max_ns: u64,
    pub sum_ns: u64,
}

fn bucket_of(ns: u64) -> u32 {
    if ns < 2 * SUB {
        return ns as u32;
    }
    let e = 63 - ns.leading_zeros() as u64 - 6;
    (SUB * e + (ns >> e)) as u32
}

/// The largest value of bucket `b`.
fn bucket_top(b: u32) -> u64 {
    let b = b as u64;
    if b < 2 * SUB {
        return b;
    }
    let e = b / SUB - 1;
    let m = b - SUB * e;
    ((((m + 1) as u128) << e) - 1).min(u64::MAX as u128) as u64
}

/// A histogram being filled (dense; [`Recorder::hist`] makes the sparse one).
pub struct Recorder {
    counts: Vec<u64>,
    count: u64,
    max_ns: u64,
    sum_ns: u64,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder { counts: vec![0; bucket_of(u64::MAX) as usize + 1], count: 0, max_ns: 0, sum_ns: 0 }
    }
}

impl Recorder {
    pub fn record(&mut self, ns: u64) {
        self.counts[bucket_of(ns) as usize] += 1;
        self.count += 1;
        self.max_ns = self.max_ns.max(ns);
        self.sum_ns = self.sum_ns.saturating_add(ns);
    }

    pub fn hist(&self) -> Hist {
        let buckets = self.counts.iter().enumerate().filter(|(_, &c)| c > 0).map(|(b, &c)| (b as u32, c)).collect();
        Hist { buckets, count: self.count, max_ns: self.max_ns, sum_ns: self.sum_ns }
    }
}

impl Hist {
    /// Adds `other`'s samples.
    pub fn merge(&mut self, other: &Hist) {
        let mut m: BTreeMap<u32, u64> = self.buckets.iter().copied().collect();
        for &(b, c) in &other.buckets {
            *m.entry(b).or_default() += c;
        }
        self.buckets = m.into_iter().collect();
        self.count += other.count;
        self.max_ns = self.max_ns.max(other.max_ns);
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// Nearest-rank percentile `p` (0-100), ns: the top of its bucket (at
    /// most 1.6 % above the sample), never above the maximum; 0 for none.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for &(b, c) in &self.buckets {
            seen += c;
            if seen >= rank {
                return bucket_top(b).min(self.max_ns);
            }
        }
        self.max_ns
    }
}

// ---------------------------------------------------------------------------
// What the processes report

/// A steady client's latencies in one phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PhaseLatency {
    /// 1 alone, 2 beside the abusers, 3 after them.
    pub phase: u8,
    pub hist: Hist,
}

/// What a steady client prints last.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct SteadyResult {
    pub phases: Vec<PhaseLatency>,
    /// The first error it got (a well-behaved client should get none), and in which phase.
    pub error: Option<(u8, String)>,
}

/// What an abuser prints last: what it did and what the daemon did to it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AbuserResult {
    pub role: String,
    /// Connections opened (connect succeeded).
    pub opened: u64,
    /// Connects that failed (the listen queue full, no descriptors left).
    pub connect_failed: u64,
    /// Connections the daemon refused at once: a `Quota` error frame with no
    /// request's id, then the end.
    pub refused: u64,
    /// Connections the daemon ended otherwise while the abuser held them.
    pub closed: u64,
    /// Requests (or half frames) sent.
    pub sent: u64,
    /// Times its writes found the daemon not reading (never-read and
    /// huge-grids: a write with no room after one with room, i.e. the
    /// daemon's backpressure; half-frames: a half frame not out in 2 s).
    pub stalled: u64,
    /// Error frames read, by kind (`Quota`, `Protocol`, ...).
    pub errors: BTreeMap<String, u64>,
}

// ---------------------------------------------------------------------------
// The line protocol

/// The bench's words, as the job threads see them.
struct Control {
    go: Mutex<bool>,
    cv: Condvar,
    stop: AtomicBool,
    /// The steady clients' phase (0: not counted).
    phase: AtomicU8,
}

impl Control {
    fn start() -> Arc<Control> {
        let c = Arc::new(Control {
            go: Mutex::new(false),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            phase: 0.into(),
        });
        let reader = c.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                let words: Vec<&str> = line.split_whitespace().collect();
                match words.as_slice() {
                    ["go"] => reader.release(),
                    ["phase", n] => reader.phase.store(n.parse().unwrap_or(0), Ordering::SeqCst),
                    ["stop"] => break,
                    _ => {}
                }
            }
            reader.stop.store(true, Ordering::SeqCst);
            reader.release();
        });
        c
    }

    fn release(&self) {
        *self.go.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    /// Waits for `go`; false if the bench said `stop` (or went) first.
    fn wait_go(&self) -> bool {
        let mut go = self.go.lock().unwrap_or_else(|e| e.into_inner());
        while !*go {
            go = self.cv.wait(go).unwrap_or_else(|e| e.into_inner());
        }
        !self.stopped()
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sleeps up to `d`, less if told to stop.
    fn nap(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.stopped() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5).min(end.saturating_duration_since(Instant::now())));
        }
    }
}

fn ready() -> Result<()> {
    println!("ready");
    std::io::stdout().flush()?;
    Ok(())
}

/// Runs the role (module doc); the exit status says whether it worked.
pub fn main(args: HostileRoleArgs) -> Result<()> {
    // The abusers write to connections the daemon closes: an error to count, not the end.
    // SAFETY: setting a signal's disposition to SIG_IGN.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let result = match args.role {
        HostileRole::Steady => steady(&args).and_then(|r| Ok(serde_json::to_string(&r)?)),
        role => abuse(role, &args).and_then(|r| Ok(serde_json::to_string(&r)?)),
    };
    match result {
        Ok(json) => {
            println!("result {json}");
            Ok(())
        }
        Err(e) => {
            println!("error {}", format!("{e:#}").replace('\n', " "));
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------
// The well-behaved client

/// How long a steady client's loop may take to notice `stop` (a launch +
/// sync in flight) before the client reports without it.
const STUCK_GRACE: Duration = Duration::from_secs(5);

/// A steady client's figures, shared by its loop and its main thread.
#[derive(Default)]
struct SteadyState {
    phases: BTreeMap<u8, Recorder>,
    /// The launch + sync in flight: its phase and start.
    in_flight: Option<(u8, Instant)>,
    error: Option<(u8, String)>,
    done: bool,
}

/// The phase a launch + sync counts in, from the phases at its start and
/// its end (1 alone, 2 abused, 3 after; they only go up): the abused phase
/// if it was in flight during any of it, else the phase it started in.
pub fn counted_in(start: u8, end: u8) -> u8 {
    if start <= 2 && end >= 2 {
        2
    } else {
        start
    }
}

fn steady(args: &HostileRoleArgs) -> Result<SteadyResult> {
    let mut gpu = DaemonGpu::connect(&args.socket, &args.name, 0)?;
    // As the overhead experiment's latency job prepares: the first launches measure the block time.
    for _ in 0..100 {
        gpu.launch("empty", [1, 1, 1], [32, 1, 1], &[], 1_000)?;
    }
    gpu.sync()?;
    let control = Control::start();
    ready()?;
    if !control.wait_go() {
        return Ok(SteadyResult::default());
    }
    let state = Arc::new(Mutex::new(SteadyState::default()));
    fn lock(s: &Mutex<SteadyState>) -> std::sync::MutexGuard<'_, SteadyState> {
        s.lock().unwrap_or_else(|e| e.into_inner())
    }
    {
        let (state, control) = (state.clone(), control.clone());
        std::thread::spawn(move || {
            while !control.stopped() {
                let phase = control.phase.load(Ordering::SeqCst);
                let t0 = Instant::now();
                lock(&state).in_flight = Some((phase, t0));
                let r = gpu.launch("empty", [1, 1, 1], [32, 1, 1], &[], 1_000).and_then(|_| gpu.sync());
                let ns = t0.elapsed().as_nanos() as u64;
                let phase = counted_in(phase, control.phase.load(Ordering::SeqCst));
                let mut s = lock(&state);
                s.in_flight = None;
                if let Err(e) = r {
                    s.error = Some((phase, format!("{e:#}")));
                    break;
                }
                if phase > 0 {
                    s.phases.entry(phase).or_default().record(ns);
                }
            }
            lock(&state).done = true;
        });
    }
    while !control.stopped() && !lock(&state).done {
        std::thread::sleep(Duration::from_millis(10));
    }
    // A launch + sync may be waiting on a daemon that does not answer: report without it.
    let told = Instant::now();
    while !lock(&state).done && told.elapsed() < STUCK_GRACE {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut s = lock(&state);
    if let Some((phase, t0)) = s.in_flight.filter(|_| !s.done) {
        let waited = t0.elapsed();
        let phase = counted_in(phase, control.phase.load(Ordering::SeqCst));
        if phase > 0 {
            s.phases.entry(phase).or_default().record(waited.as_nanos() as u64);
        }
        s.error.get_or_insert((
            phase,
            format!("a launch + sync was still waiting for the daemon after {:.1} s", waited.as_secs_f64()),
        ));
    }
    Ok(SteadyResult {
        phases: s.phases.iter().map(|(&phase, r)| PhaseLatency { phase, hist: r.hist() }).collect(),
        error: s.error.clone(),
    })
}

// ---------------------------------------------------------------------------
// The abusers

fn abuse(role: HostileRole, args: &HostileRoleArgs) -> Result<AbuserResult> {
    let mut r = AbuserResult { role: role.name().into(), ..AbuserResult::default() };
    // Prepared before `ready`: the huge grids' module, never-read's greeting.
    let mut huge = None;
    let mut never = None;
    match role {
        HostileRole::HugeGrids => huge = Some(HugeGrids::connect(&args.socket, &mut r, Duration::from_secs(120))?),
        HostileRole::NeverRead => never = Some(NeverRead::connect(&args.socket, &mut r)?),
        _ => {}
    }
    let control = Control::start();
    ready()?;
    if !control.wait_go() {
        return Ok(r);
    }
    match role {
        HostileRole::Flood => flood(&args.socket, args.flood, &control, &mut r),
        HostileRole::NeverRead => never_read(&args.socket, never, &control, &mut r),
        HostileRole::HalfFrames => half_frames(&args.socket, &control, &mut r),
        HostileRole::HugeGrids => huge_grids(&args.socket, huge, &control, &mut r),
        HostileRole::Steady => unreachable!("steady clients are not abusers"),
    }
    Ok(r)
}

fn hello_bytes(name: &str) -> Vec<u8> {
    let request = Request::Hello {
        magic: MAGIC,
        version: VERSION,
        name: name.into(),
        priority: 0,
        weight: 1.0,
        gpu: None,
        class: None,
    };
    encode_frame(&ClientFrame { id: 1, request }).expect("a Hello encodes")
}

/// The name of an error kind (`Quota`, `Version`).
fn kind_name(k: &ErrorKind) -> String {
    let s = format!("{k:?}");
    s.split([' ', '{', '(']).next().unwrap_or_default().to_owned()
}

/// What a look at a connection found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Open,
    /// Ended by the daemon; `refused`: with a `Quota` error frame of no request (at accept).
    Ended {
        refused: bool,
    },
}

/// Reads what `sock` (non-blocking) has, counting error frames into `r`;
/// whether the daemon ended the connection. Replies that are not errors are
/// dropped, undecodable bytes ignored.
fn look(sock: &UnixStream, reader: &mut FrameReader, r: &mut AbuserResult) -> Seen {
    let mut buf = [0u8; 65536];
    let mut refused = false;
    loop {
        let ended = match (&*sock).read(&mut buf) {
            Ok(0) => true,
            Ok(n) => {
                reader.extend(&buf[..n]);
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Seen::Open,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => false,
            Err(_) => true,
        };
        while let Ok(Some(body)) = reader.next_body() {
            if let Ok(ServerFrame::Reply { id, result: Err(e) }) = decode_frame_body::<ServerFrame>(&body) {
                refused |= id == 0 && e.kind == ErrorKind::Quota;
                *r.errors.entry(kind_name(&e.kind)).or_default() += 1;
            }
        }
        if ended {
            return Seen::Ended { refused };
        }
    }
}

fn count_end(seen: Seen, r: &mut AbuserResult) {
    match seen {
        Seen::Ended { refused: true } => r.refused += 1,
        Seen::Ended { refused: false } => r.closed += 1,
        Seen::Open => {}
    }
}

/// A socket address for `path`.
fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        bail!("socket path {} is too long", path.display());
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

/// A non-blocking connect: the stream, or the error (`WouldBlock`: the daemon's listen queue is full).
fn connect_nonblocking(addr: &(libc::sockaddr_un, libc::socklen_t)) -> std::io::Result<UnixStream> {
    // SAFETY: socket(2) and connect(2) with a valid address of the given length;
    // the descriptor is owned at once.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let owned = OwnedFd::from_raw_fd(fd);
        if libc::connect(fd, (&addr.0 as *const libc::sockaddr_un).cast(), addr.1) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(UnixStream::from(owned))
    }
}

/// Raises this process's descriptor limit to its hard limit (or `want`, if lower).
fn raise_nofile(want: u64) {
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < want {
            l.rlim_cur = want.min(l.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// Waves of connections, each held [`FLOOD_HOLD`] and closed (module doc).
fn flood(socket: &Path, wave: u32, control: &Control, r: &mut AbuserResult) {
    raise_nofile(wave as u64 + 64);
    let Ok(addr) = sockaddr(socket) else { return };
    while !control.stopped() {
        let mut conns: Vec<UnixStream> = Vec::with_capacity(wave as usize);
        let mut tries = 0u32;
        while conns.len() < wave as usize && !control.stopped() {
            match connect_nonblocking(&addr) {
                Ok(s) => {
                    r.opened += 1;
                    conns.push(s);
                }
                Err(e) => {
                    r.connect_failed += 1;
                    if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) {
                        break;
                    }
                    // The listen queue is full: try again at once, but give up the
                    // core now and then (the daemon must run to empty it).
                    tries += 1;
                    if tries.is_multiple_of(64) {
                        std::thread::sleep(Duration::from_micros(200));
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
        }
        control.nap(FLOOD_HOLD);
        for s in &conns {
            count_end(look(s, &mut FrameReader::new(), r), r);
        }
        drop(conns);
    }
}

/// Never-read's connection, greeted.
struct NeverRead {
    sock: UnixStream,
}

impl NeverRead {
    fn connect(socket: &Path, r: &mut AbuserResult) -> Result<NeverRead> {
        let mut sock = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
        r.opened += 1;
        sock.write_all(&hello_bytes("never-read"))?;
        sock.set_nonblocking(true)?;
        Ok(NeverRead { sock })
    }
}

/// `Status` requests, pipelined without reading (module doc).
fn never_read(socket: &Path, first: Option<NeverRead>, control: &Control, r: &mut AbuserResult) {
    // 64 KiB of Status frames, written round and round.
    let one = encode_frame(&ClientFrame { id: 2, request: Request::Status }).expect("a Status encodes");
    let per = (65536 / one.len()).max(1);
    let batch: Vec<u8> = one.iter().copied().cycle().take(one.len() * per).collect();
    let mut conn = first;
    let mut pos = 0usize;
    let mut sent_bytes = 0u64;
    let mut blocked = false;
    while !control.stopped() {
        let Some(c) = conn.as_ref() else {
            match NeverRead::connect(socket, r) {
                Ok(c) => conn = Some(c),
                Err(_) => {
                    r.connect_failed += 1;
                    control.nap(Duration::from_millis(10));
                }
            }
            pos = 0;
            continue;
        };
        match push(&c.sock, &batch[pos..]) {
            Push::Sent(n) => {
                blocked = false;
                pos = (pos + n) % batch.len();
                sent_bytes += n as u64;
                r.sent = sent_bytes / one.len() as u64;
            }
            Push::Full => {
                // The daemon stopped reading (its backpressure): wait for room.
                if !blocked {
                    r.stalled += 1;
                    blocked = true;
                }
                wait_for(&c.sock, libc::POLLOUT);
            }
            Push::Ended => {
                // Ended by the daemon: read what is left for its reason, then a new connection.
                let mut reader = FrameReader::new();
                let seen = look(&c.sock, &mut reader, r);
                count_end(if seen == Seen::Open { Seen::Ended { refused: false } } else { seen }, r);
                conn = None;
            }
        }
    }
}

/// A half-frames connection: `Hello`, an 8 MiB length, half the body.
fn half_frame(socket: &Path, body: &[u8], r: &mut AbuserResult) -> Option<UnixStream> {
    let Ok(mut sock) = UnixStream::connect(socket) else {
        r.connect_failed += 1;
        return None;
    };
    r.opened += 1;
    let _ = sock.set_write_timeout(Some(Duration::from_secs(2)));
    let mut bytes = hello_bytes("half-frames");
    bytes.extend_from_slice(&MAX_FRAME_BYTES.to_le_bytes());
    // A failed write (the daemon refused the connection, or stopped reading)
    // is seen when the connection is looked at.
    match sock.write_all(&bytes).and_then(|_| sock.write_all(body)) {
        Ok(()) => r.sent += 1,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => r.stalled += 1,
        Err(_) => {}
    }
    let _ = sock.set_nonblocking(true);
    Some(sock)
}

fn half_frames(socket: &Path, control: &Control, r: &mut AbuserResult) {
    let body = vec![0u8; HALF_FRAME_BODY];
    let mut conns: Vec<(UnixStream, FrameReader)> = Vec::new();
    while !control.stopped() {
        while conns.len() < HALF_FRAME_CONNECTIONS && !control.stopped() {
            match half_frame(socket, &body, r) {
                Some(s) => conns.push((s, FrameReader::new())),
                None => break,
            }
        }
        control.nap(Duration::from_millis(100));
        conns.retain_mut(|(s, reader)| {
            let seen = look(s, reader, r);
            count_end(seen, r);
            seen == Seen::Open
        });
    }
}

/// A connection refused at accept (a `Quota` frame of no request).
#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("refused at accept (Quota)")
    }
}

impl std::error::Error for Refused {}

/// The huge-grids abuser's connection: greeted, its module loaded.
struct HugeGrids {
    sock: UnixStream,
    kernel: KernelId,
    reader: FrameReader,
    next_id: u64,
}

impl HugeGrids {
    /// `wait`: how long each answer may take.
    fn connect(socket: &Path, r: &mut AbuserResult, wait: Duration) -> Result<HugeGrids> {
        let mut sock = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
        r.opened += 1;
        sock.set_read_timeout(Some(wait))?;
        sock.write_all(&hello_bytes("huge-grids"))?;
        let mut reader = FrameReader::new();
        let mut wait = |sock: &mut UnixStream, id: u64| -> Result<Reply> {
            let mut buf = [0u8; 65536];
            loop {
                while let Some(body) = reader.next_body()? {
                    if let ServerFrame::Reply { id: got, result } = decode_frame_body::<ServerFrame>(&body)? {
                        if got == 0 && matches!(&result, Err(e) if e.kind == ErrorKind::Quota) {
                            return Err(Refused.into());
                        }
                        if got == id {
                            return result.map_err(|e| anyhow!("{:?}: {}", e.kind, e.message));
                        }
                    }
                }
                let n = sock.read(&mut buf)?;
                if n == 0 {
                    bail!("the daemon closed the connection");
                }
                reader.extend(&buf[..n]);
            }
        };
        wait(&mut sock, 1).context("Hello")?;
        let load = Request::LoadModule {
            name: "huge.cu".into(),
            source: "extern \"C\" __global__ void huge() {}".into(),
            options: vec![],
        };
        sock.write_all(&encode_frame(&ClientFrame { id: 2, request: load })?)?;
        let kernel = match wait(&mut sock, 2).context("loading the huge-grids module")? {
            Reply::Module { kernels, .. } => kernels.first().map(|k| k.kernel).context("the module has no kernel")?,
            other => bail!("LoadModule answered {other:?}"),
        };
        sock.set_nonblocking(true)?;
        Ok(HugeGrids { sock, kernel, reader, next_id: 3 })
    }
}

fn huge_grids(socket: &Path, first: Option<HugeGrids>, control: &Control, r: &mut AbuserResult) {
    let mut conn = first;
    // The frame being written and how much of it is out.
    let (mut frame, mut pos) = (Vec::new(), 0usize);
    let mut blocked = false;
    while !control.stopped() {
        let Some(c) = conn.as_mut() else {
            // A short wait: the bench's `stop` must not wait for a slow daemon.
            match HugeGrids::connect(socket, r, Duration::from_secs(2)) {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    if e.downcast_ref::<Refused>().is_some() {
                        r.refused += 1;
                    } else {
                        r.connect_failed += 1;
                    }
                    control.nap(Duration::from_millis(10));
                }
            }
            (frame, pos) = (Vec::new(), 0);
            continue;
        };
        if pos == frame.len() {
            let launch = Request::Launch(Launch {
                kernel: c.kernel,
                grid: [HUGE_GRID_BLOCKS, 1, 1],
                block: [1024, 1, 1],
                shared_bytes: 0,
                args: vec![],
                stream: StreamId::DEFAULT,
                block_time_ns: Some(1_000),
            });
            frame = encode_frame(&ClientFrame { id: c.next_id, request: launch }).expect("a launch encodes");
            c.next_id += 1;
            pos = 0;
        }
        let ended = match push(&c.sock, &frame[pos..]) {
            Push::Sent(n) => {
                blocked = false;
                pos += n;
                if pos == frame.len() {
                    r.sent += 1;
                }
                false
            }
            Push::Full => {
                if !blocked {
                    r.stalled += 1;
                    blocked = true;
                }
                wait_for(&c.sock, libc::POLLIN | libc::POLLOUT);
                false
            }
            Push::Ended => true,
        };
        // Its replies (refusals) are read as they come, and the end with them.
        match look(&c.sock, &mut c.reader, r) {
            Seen::Open if !ended => {}
            seen => {
                count_end(if seen == Seen::Open { Seen::Ended { refused: false } } else { seen }, r);
                conn = None;
            }
        }
    }
}

/// What one non-blocking write did.
enum Push {
    /// This many bytes went out (maybe 0: interrupted).
    Sent(usize),
    /// No room: the daemon is not reading.
    Full,
    /// The daemon ended the connection.
    Ended,
}

fn push(sock: &UnixStream, bytes: &[u8]) -> Push {
    // SAFETY: send(2) from a live buffer on a socket we own; MSG_NOSIGNAL: a closed peer is an error.
    let n = unsafe {
        libc::send(sock.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
    };
    if n >= 0 {
        return Push::Sent(n as usize);
    }
    match std::io::Error::last_os_error().kind() {
        std::io::ErrorKind::WouldBlock => Push::Full,
        std::io::ErrorKind::Interrupted => Push::Sent(0),
        _ => Push::Ended,
    }
}

/// Waits up to 20 ms for `events` on `sock`.
fn wait_for(sock: &UnixStream, events: libc::c_short) {
    let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events, revents: 0 };
    // SAFETY: one pollfd, valid for the call.
    unsafe { libc::poll(&mut pfd, 1, 20) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotone_and_at_most_a_64th_wide() {
        let within = |ns: u64| {
            let top = bucket_top(bucket_of(ns));
            assert!(top >= ns, "{ns} above its bucket's top {top}");
            if ns >= 2 * SUB {
                assert!((top - ns) as f64 <= ns as f64 / 64.0, "{ns}: top {top}");
            }
        };
        let mut last = 0;
        for ns in 0..100_000u64 {
            within(ns);
            assert!(bucket_of(ns) >= last);
            last = bucket_of(ns);
        }
        for s in 0..64 {
            within(1u64 << s);
            within((1u64 << s) - 1);
        }
        within(u64::MAX);
        assert_eq!(bucket_top(bucket_of(1000)), 1007);
    }

    #[test]
    fn a_launch_in_flight_during_the_abuse_counts_as_abused() {
        assert_eq!([(1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 3)].map(|(a, b)| counted_in(a, b)), [1, 2, 2, 2, 2, 3]);
    }

    #[test]
    fn percentiles_merge_and_are_near_the_exact_ones() {
        let (mut a, mut b) = (Recorder::default(), Recorder::default());
        for ns in 1..=1000u64 {
            a.record(ns * 1000);
        }
        b.record(5_000_000);
        let mut h = a.hist();
        h.merge(&b.hist());
        assert_eq!(h.count, 1001);
        assert_eq!(h.max_ns, 5_000_000);
        assert_eq!(h.percentile(100.0), 5_000_000);
        let p50 = h.percentile(50.0) as f64;
        assert!((501_000.0..=501_000.0 * 1.016).contains(&p50), "{p50}");
        let p99 = h.percentile(99.0) as f64;
        assert!((991_000.0..=991_000.0 * 1.016).contains(&p99), "{p99}");
        assert_eq!(Hist::default().percentile(99.0), 0);
        let back: Hist = serde_json::from_str(&serde_json::to_string(&h).unwrap()).unwrap();
        assert_eq!(back, h);
    }
}

//! Stage stamps: where each kernel's time goes between a client's launch
//! call and the GPU, per kernel, on one clock, in every process on the way
//! (issue 35; docs/program-speed.md, "Stage stamps").
//!
//! **Why.** The daemon's logs are per-process aggregates (means of a
//! stage, counts of exchanges): they cannot say which stage paces a chain
//! of dependent launches, because a pacer shows as the stage whose
//! *inter-kernel gap* is the largest, and gaps need per-kernel times on one
//! clock. `CLOCK_MONOTONIC` is one clock for every process of a host.
//!
//! **Cost.** Off unless `GPUMUX_STAMPS=DIR` is set: [`stamp`] is then one
//! relaxed atomic load and a branch. On, it is a clock read and a push
//! into a per-thread buffer preallocated at the thread's first stamp
//! ([`CAPACITY`] records; a full buffer counts what it dropped), locked only
//! against [`flush`], which appends every thread's records to
//! `DIR/<pid>.stamps` and empties the buffers. A process calls [`flush`]
//! when it ends its part (the daemon at stop, its device process at the
//! link's close, a client at its close).
//!
//! **Format** (one record a line, [`analysis`] reads it): a header line
//! `# gpumux stamps pid=P ppid=Q` (a device process's parent is its
//! daemon), then `ns stage key aux tid`, with `stage` a
//! [`Stage`]'s name. `key` is what the stage knows the kernel by (a
//! client's frame id, the engine's operation or launch id: [`Stage`] says
//! which); the analysis joins them ([`analysis`], module doc).

pub mod analysis;
pub mod syncs;
#[cfg(test)]
mod test_lines;

use std::cell::OnceCell;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The variable naming the folder the stamps go to.
pub const VAR: &str = "GPUMUX_STAMPS";
/// Records a thread keeps before [`flush`] (32 bytes each: 8 MiB a
/// stamping thread). A chain bench's programs part stamps about 12 per
/// kernel on the core's thread for ~4,000 kernels a program run.
pub const CAPACITY: usize = 1 << 18;

/// A stage of a kernel's way, or of an exchange between the core and its
/// device process. The key each stage carries is in its doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Stage {
    /// Client: `launch` called (key: the request's frame id).
    ClientCall = 0,
    /// Client: the launch's frame encoded, its write to the ring starting (key: frame id).
    ClientWrite,
    /// Core: the launch request read and made an operation (key: the
    /// operation; aux: client pid << 40 | frame id).
    CoreRead,
    /// Core: the operation's bind, stamped just before it is sent to the device
    /// process, so that it precedes [`Stage::HostBind`] (key: operation).
    CoreBind,
    /// Core: the engine's launch command, stamped just before it is sent
    /// (key: operation; aux: launch).
    CoreLaunch,
    /// Device process: the bind received (key: operation).
    HostBind,
    /// Device process: the launch command received (key: operation; aux: launch).
    HostLaunch,
    /// The device's thread posted the kernel's launch calls to the launcher
    /// thread (key: operation). Absent for launches it makes itself.
    LaunchPosted,
    /// The thread that calls `cuLaunchKernel` (the launcher thread, or the
    /// device's own): the call starts (key: operation).
    LaunchStart,
    /// The same call returned (key: operation).
    LaunchReturn,
    /// Device process: the kernel's end seen by a poll of the device and
    /// reported ahead of its launch command (key: operation).
    EndSeenAhead,
    /// Device process: the launch's end seen by a poll (key: launch).
    EndSeen,
    /// Core: the launch's end read (from a poll's answer, or answered from
    /// an end known ahead) (key: launch).
    CoreEnd,
    /// Core: a lockstep exchange started, its `Poll` sent (key: the
    /// core's exchange number).
    ExchangeStart,
    /// Core: the exchange's answer read (key: exchange number).
    ExchangeEnd,
    /// Core: it began to block for an exchange's answer (key: exchange number).
    WaitStart,
    /// Device process: a `Poll` received (key: its count of polls).
    HostPoll,
    /// Device process: the poll's answer sent (key: its count of polls).
    HostAnswer,
    /// Client: a call that waits for its reply (a sync) sends its request,
    /// its frame encoded and its write starting (key: frame id).
    WaitCall,
    /// Client: that call starts polling for its reply (key: frame id).
    WaitPoll,
    /// Client: its poll window passed with no reply; it sleeps on its
    /// channel for the reader thread to hand the reply on (key: frame id).
    WaitSleep,
    /// Client: the reply read out of the reply ring (or socket) and routed
    /// (key: frame id; aux: 1 if the library's reader thread read it, 0 if
    /// the waiting call did).
    ReplySeen,
    /// Client: the waiting call has its reply (key: frame id).
    WaitReturn,
    /// Client: the library's reader thread woke from its sleep on the
    /// socket (a doorbell, key 0).
    ClientReaderWake,
    /// Daemon: a connection's reader thread decoded a request (key: client
    /// pid << 40 | frame id).
    ReaderRead,
    /// Daemon: a connection's reader thread woke from its sleep on the
    /// socket (a doorbell; key: the client's pid).
    ReaderWake,
    /// Core: a `SyncStream` request taken (key: client pid << 40 | frame id).
    CoreSync,
    /// Core: a reply frame written into the client's ring, or handed to its
    /// writer thread (key: client pid << 40 | frame id; aux: 1 if handed to
    /// the writer thread, 0 if written into the ring directly).
    CoreReply,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 28] = [
        Stage::ClientCall,
        Stage::ClientWrite,
        Stage::CoreRead,
        Stage::CoreBind,
        Stage::CoreLaunch,
        Stage::HostBind,
        Stage::HostLaunch,
        Stage::LaunchPosted,
        Stage::LaunchStart,
        Stage::LaunchReturn,
        Stage::EndSeenAhead,
        Stage::EndSeen,
        Stage::CoreEnd,
        Stage::ExchangeStart,
        Stage::ExchangeEnd,
        Stage::WaitStart,
        Stage::HostPoll,
        Stage::HostAnswer,
        Stage::WaitCall,
        Stage::WaitPoll,
        Stage::WaitSleep,
        Stage::ReplySeen,
        Stage::WaitReturn,
        Stage::ClientReaderWake,
        Stage::ReaderRead,
        Stage::ReaderWake,
        Stage::CoreSync,
        Stage::CoreReply,
    ];

    /// Its name in the files.
    pub fn name(self) -> &'static str {
        match self {
            Stage::ClientCall => "client_call",
            Stage::ClientWrite => "client_write",
            Stage::CoreRead => "core_read",
            Stage::CoreBind => "core_bind",
            Stage::CoreLaunch => "core_launch",
            Stage::HostBind => "host_bind",
            Stage::HostLaunch => "host_launch",
            Stage::LaunchPosted => "launch_posted",
            Stage::LaunchStart => "launch_start",
            Stage::LaunchReturn => "launch_return",
            Stage::EndSeenAhead => "end_seen_ahead",
            Stage::EndSeen => "end_seen",
            Stage::CoreEnd => "core_end",
            Stage::ExchangeStart => "exchange_start",
            Stage::ExchangeEnd => "exchange_end",
            Stage::WaitStart => "wait_start",
            Stage::HostPoll => "host_poll",
            Stage::HostAnswer => "host_answer",
            Stage::WaitCall => "wait_call",
            Stage::WaitPoll => "wait_poll",
            Stage::WaitSleep => "wait_sleep",
            Stage::ReplySeen => "reply_seen",
            Stage::WaitReturn => "wait_return",
            Stage::ClientReaderWake => "client_reader_wake",
            Stage::ReaderRead => "reader_read",
            Stage::ReaderWake => "reader_wake",
            Stage::CoreSync => "core_sync",
            Stage::CoreReply => "core_reply",
        }
    }

    /// The stage named `s`.
    pub fn from_name(s: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|st| st.name() == s)
    }
}

/// One stamp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// `CLOCK_MONOTONIC`, ns.
    pub ns: u64,
    /// What happened.
    pub stage: Stage,
    /// The stage's key ([`Stage`]).
    pub key: u64,
    /// A second number some stages carry ([`Stage`]).
    pub aux: u64,
}

/// 0: not looked at yet; 1: off; 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);
static DIR: OnceLock<PathBuf> = OnceLock::new();
/// Every stamping thread's buffer, for [`flush`].
static BUFFERS: Mutex<Vec<Arc<Buffer>>> = Mutex::new(Vec::new());
/// Records dropped by full buffers.
static DROPPED: AtomicU64 = AtomicU64::new(0);
static NEXT_TID: AtomicU64 = AtomicU64::new(1);

struct Buffer {
    tid: u64,
    records: Mutex<Vec<Record>>,
}

thread_local! {
    static MINE: OnceCell<Arc<Buffer>> = const { OnceCell::new() };
    /// The operation the thread is starting a kernel of ([`set_tag`]).
    static TAG: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Whether stamps are on (`GPUMUX_STAMPS` set and not empty), read once.
#[inline]
pub fn on() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => init(),
    }
}

#[cold]
fn init() -> bool {
    let dir = std::env::var_os(VAR).filter(|d| !d.is_empty()).map(PathBuf::from);
    let on = match dir {
        Some(d) => {
            let _ = DIR.set(d);
            true
        }
        None => false,
    };
    STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    on
}

/// The key of a client's frame in the daemon's stamps: its pid and frame id
/// (a client's own stamps name the frame id alone, in its `<pid>.stamps`).
pub fn frame_key(pid: u64, frame: u64) -> u64 {
    (pid << 40) | (frame & ((1 << 40) - 1))
}

/// `CLOCK_MONOTONIC` in ns (the clock every process of a host shares).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid out pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The time now if stamps are on, for a stage stamped later with [`at`]
/// (its key is known only after the event, as a request's operation).
#[inline]
pub fn now_if_on() -> Option<u64> {
    on().then(now_ns)
}

/// Stamps `stage` of `key` now (nothing when off).
#[inline]
pub fn stamp(stage: Stage, key: u64, aux: u64) {
    if on() {
        at(now_ns(), stage, key, aux);
    }
}

/// Stamps `stage` of `key` at `ns` (a time from [`now_if_on`]).
pub fn at(ns: u64, stage: Stage, key: u64, aux: u64) {
    if !on() {
        return;
    }
    MINE.with(|mine| {
        let buf = mine.get_or_init(|| {
            let b = Arc::new(Buffer {
                tid: NEXT_TID.fetch_add(1, Ordering::Relaxed),
                records: Mutex::new(Vec::with_capacity(CAPACITY)),
            });
            if let Ok(mut all) = BUFFERS.lock() {
                all.push(b.clone());
            }
            b
        });
        if let Ok(mut r) = buf.records.lock() {
            if r.len() < CAPACITY {
                r.push(Record { ns, stage, key, aux });
            } else {
                DROPPED.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
}

/// Names the operation this thread starts a kernel of, for a stamp made
/// where it is not known (the launch call, or the post to the launcher
/// thread, which carries it there: [`tag`]).
#[inline]
pub fn set_tag(op: u64) {
    if on() {
        TAG.with(|t| t.set(op));
    }
}

/// The operation last named on this thread by [`set_tag`] (0: none).
#[inline]
pub fn tag() -> u64 {
    if on() {
        TAG.with(|t| t.get())
    } else {
        0
    }
}

/// Appends every thread's records to `DIR/<pid>.stamps` and empties the
/// buffers; the error names the file. Nothing when off.
pub fn flush() -> std::io::Result<()> {
    if !on() {
        return Ok(());
    }
    let Some(dir) = DIR.get() else { return Ok(()) };
    let pid = std::process::id();
    let path = dir.join(format!("{pid}.stamps"));
    let buffers: Vec<Arc<Buffer>> = match BUFFERS.lock() {
        Ok(b) => b.clone(),
        Err(_) => return Ok(()),
    };
    let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let held: usize = buffers.iter().map(|b| b.records.lock().map_or(0, |r| r.len())).sum();
    if held == 0 && DROPPED.load(Ordering::Relaxed) == 0 {
        // A process that stamped nothing (a native bench role) leaves no file.
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(named)?;
    let fresh = !path.exists();
    let file = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(named)?;
    let mut out = std::io::BufWriter::new(file);
    if fresh {
        // SAFETY: getppid cannot fail.
        let ppid = unsafe { libc::getppid() };
        writeln!(out, "# gpumux stamps pid={pid} ppid={ppid}").map_err(named)?;
    }
    for b in buffers {
        let taken = match b.records.lock() {
            Ok(mut r) => std::mem::take(&mut *r),
            Err(_) => continue,
        };
        for r in &taken {
            writeln!(out, "{} {} {} {} {}", r.ns, r.stage.name(), r.key, r.aux, b.tid).map_err(named)?;
        }
        // Keep the buffer's room for the next records.
        if let Ok(mut r) = b.records.lock() {
            if r.capacity() == 0 {
                r.reserve(taken.capacity().max(1024));
            }
        }
    }
    let dropped = DROPPED.swap(0, Ordering::Relaxed);
    if dropped > 0 {
        writeln!(out, "# dropped {dropped}").map_err(named)?;
    }
    out.flush().map_err(named)
}

/// [`flush`], its error logged on stderr (for a process's exit paths, where
/// there is nobody to return it to).
pub fn flush_or_say() {
    if let Err(e) = flush() {
        eprintln!("gpumux stamps: cannot write: {e}");
    }
}

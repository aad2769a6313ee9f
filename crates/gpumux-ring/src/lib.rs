//! Two single-producer, single-consumer byte rings in one sealed memfd,
//! shared by two processes: the hot path of gpumuxd's links (the daemon and
//! its device process; a client and the daemon).
//!
//! Why: a message over a Unix socket costs a `sendmsg` and a `recvmsg`, each
//! several µs on a virtual machine's host, and a reader that polls a socket
//! makes a syscall per try. Through shared memory a message is a copy and a
//! release store on one side and an acquire load on the other; a reader that
//! polls reads one cache line. The socket stays, for what shared memory
//! cannot do: waking a reader that went to sleep (a *doorbell* byte), passing
//! descriptors, and telling a peer's death (end of stream).
//!
//! The rings carry bytes, not messages: the caller frames them (gpumuxd uses
//! `gpumux-proto` frames) and a message larger than a ring goes through in
//! pieces while the peer reads.
//!
//! **The peer may be hostile** (a client of the daemon). Nothing read from
//! the mapping is trusted: each side keeps its own index privately and only
//! publishes it; the peer's index is checked against the capacity on every
//! read ([`RingError::Corrupt`] if it is out of range); data bytes are read
//! and written with atomic operations, so a peer that scribbles on them while
//! we copy gives us garbage to reject, not undefined behaviour. The opener
//! maps a file only if it is sealed against shrinking and exactly as long as
//! the agreed capacity says, so the creator cannot turn our accesses into
//! SIGBUS.
//!
//! **Sleeping.** A reader about to sleep on the socket sets its ring's
//! `sleeping` flag, then looks at the ring once more ([`RingReceiver::prepare_sleep`]);
//! a writer publishes its bytes, then takes the flag ([`RingSender::take_sleeper`])
//! and, if it was set, writes a doorbell byte to the socket. Both sides use
//! sequentially consistent operations, so at least one sees the other: no
//! message is left in a ring while its reader sleeps.

pub mod cadence;

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Each ring's bytes unless the creator asks otherwise: a few hundred
/// engine commands or events, or one request with its arguments, fit many
/// times over; a module's source goes through in pieces.
pub const DEFAULT_CAPACITY: usize = 256 << 10;
/// The smallest and largest capacity an opener accepts.
pub const MIN_CAPACITY: usize = 4 << 10;
/// See [`MIN_CAPACITY`].
pub const MAX_CAPACITY: usize = 16 << 20;

/// "gpumuxR1": the first word of a ring file.
const MAGIC: u64 = u64::from_le_bytes(*b"gpumuxR1");
/// Each shared index on a line of its own (two, against the adjacent-line
/// prefetcher), so the producer's and the consumer's stores do not contend.
const LINE: usize = 128;
/// Header: the magic and capacity, then per ring its tail, head and sleeping flag.
const HEADER: usize = 4096;
/// The memfd's name (seen in /proc/PID/fd).
const MEMFD_NAME: &CStr = c"gpumux-ring";

/// What went wrong with a ring.
#[derive(Debug, thiserror::Error)]
pub enum RingError {
    /// A system call failed (creating, sizing, sealing or mapping the file).
    #[error("shared-memory ring: {what}: {cause}")]
    Os {
        /// The call.
        what: &'static str,
        /// Its error (in the message, not also the error's source).
        cause: std::io::Error,
    },
    /// The file offered is not a ring this side can map safely.
    #[error("shared-memory ring refused: {0}")]
    Refused(String),
    /// The peer's index is out of range: it broke the ring (a bug or a hostile peer).
    #[error("shared-memory ring corrupt: the peer's {index} index is {value}, ours {ours}, capacity {capacity}")]
    Corrupt {
        /// Which index ("head" or "tail").
        index: &'static str,
        /// What the peer published.
        value: u64,
        /// Our own index it is checked against.
        ours: u64,
        /// The ring's capacity.
        capacity: usize,
    },
}

/// Which end of the file a process holds: the creator writes ring 0 and
/// reads ring 1, the opener the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Made the file ([`RingPair::create`]).
    Creator,
    /// Mapped a file the other side made ([`RingPair::open`]).
    Opener,
}

/// The shared mapping; unmapped when the last half is dropped.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    fd: OwnedFd,
}

// SAFETY: the mapping is valid until drop and only accessed through atomics.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping we made, unmapped once (the Arc's last owner).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl Mapping {
    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= HEADER);
        // SAFETY: inside the header page, 8-aligned (the mapping is page-aligned),
        // and only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(offset).cast()) }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= HEADER);
        // SAFETY: as in `u64_at`.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) }
    }

    fn tail(&self, ring: usize) -> &AtomicU64 {
        self.u64_at(LINE * (2 + 6 * ring))
    }

    fn head(&self, ring: usize) -> &AtomicU64 {
        self.u64_at(LINE * (4 + 6 * ring))
    }

    fn sleeping(&self, ring: usize) -> &AtomicU32 {
        self.u32_at(LINE * (6 + 6 * ring))
    }

    /// Ring `ring`'s data bytes, `capacity` of them.
    fn data(&self, ring: usize) -> *mut u8 {
        // SAFETY: HEADER + 2 × capacity is the mapping's length.
        unsafe { self.ptr.as_ptr().add(HEADER + ring * self.capacity) }
    }
}

/// The file's length for a capacity.
fn file_len(capacity: usize) -> usize {
    HEADER + 2 * capacity
}

/// The two rings of one file, as one side sees them; [`RingPair::split`]
/// gives the halves to the threads that write and read.
#[derive(Debug)]
pub struct RingPair {
    map: Arc<Mapping>,
    side: Side,
}

impl RingPair {
    /// Makes a fresh file with two rings of `capacity` bytes each (a power
    /// of two within [`MIN_CAPACITY`]..=[`MAX_CAPACITY`]), sealed against
    /// resizing; send [`RingPair::fd`] to the peer with the capacity.
    pub fn create(capacity: usize) -> Result<RingPair, RingError> {
        check_capacity(capacity)?;
        let os = |what| move |cause| RingError::Os { what, cause };
        // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(MEMFD_NAME.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(os("memfd_create")(std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = file_len(capacity);
        // SAFETY: plain syscalls on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(os("ftruncate")(std::io::Error::last_os_error()));
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: as above; F_ADD_SEALS takes an int.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(os("sealing")(std::io::Error::last_os_error()));
        }
        let map = map(fd, capacity)?;
        map.u64_at(8).store(capacity as u64, Ordering::Relaxed);
        // The magic last: an opener that sees it sees the rest.
        map.u64_at(0).store(MAGIC, Ordering::Release);
        Ok(RingPair { map: Arc::new(map), side: Side::Creator })
    }

    /// Maps a file the peer made with [`RingPair::create`] and said has
    /// rings of `capacity` bytes. Refused unless it is sealed against
    /// shrinking, exactly that long, and starts with the ring's magic and
    /// the same capacity.
    pub fn open(fd: OwnedFd, capacity: usize) -> Result<RingPair, RingError> {
        check_capacity(capacity)?;
        let raw = fd.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own; F_GET_SEALS takes no argument.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(RingError::Refused(format!("not a memfd ({})", std::io::Error::last_os_error())));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(RingError::Refused("the file is not sealed against shrinking".into()));
        }
        // SAFETY: fstat fills a zeroed stat for a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(raw, &mut st) } != 0 {
            return Err(RingError::Os { what: "fstat", cause: std::io::Error::last_os_error() });
        }
        let len = file_len(capacity);
        if st.st_size as u64 != len as u64 {
            return Err(RingError::Refused(format!(
                "the file is {} bytes; rings of {capacity} bytes need {len}",
                st.st_size
            )));
        }
        let map = map(fd, capacity)?;
        let magic = map.u64_at(0).load(Ordering::Acquire);
        let cap = map.u64_at(8).load(Ordering::Relaxed);
        if magic != MAGIC || cap != capacity as u64 {
            return Err(RingError::Refused(format!(
                "the header says magic {magic:#x}, capacity {cap}; expected {MAGIC:#x}, {capacity}"
            )));
        }
        Ok(RingPair { map: Arc::new(map), side: Side::Opener })
    }

    /// The file, to send to the peer (`SCM_RIGHTS`) or let a child inherit.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.map.fd.as_fd()
    }

    /// Each ring's capacity in bytes.
    pub fn capacity(&self) -> usize {
        self.map.capacity
    }

    /// Which side this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The half that writes the peer's incoming ring and the half that reads ours.
    pub fn split(self) -> (RingSender, RingReceiver) {
        let (out, inc) = match self.side {
            Side::Creator => (0, 1),
            Side::Opener => (1, 0),
        };
        // Start from what the mapping says, so a half made again (after a
        // split of a fresh pair, both are 0) continues where it was.
        let tail = self.map.tail(out).load(Ordering::Acquire);
        let head = self.map.head(inc).load(Ordering::Acquire);
        (RingSender { map: self.map.clone(), ring: out, tail }, RingReceiver { map: self.map, ring: inc, head })
    }
}

fn check_capacity(capacity: usize) -> Result<(), RingError> {
    if !capacity.is_power_of_two() || !(MIN_CAPACITY..=MAX_CAPACITY).contains(&capacity) {
        return Err(RingError::Refused(format!(
            "a ring's capacity must be a power of two from {MIN_CAPACITY} to {MAX_CAPACITY} bytes, not {capacity}"
        )));
    }
    Ok(())
}

/// Maps the whole file shared, read-write.
fn map(fd: OwnedFd, capacity: usize) -> Result<Mapping, RingError> {
    let len = file_len(capacity);
    // SAFETY: a fresh shared mapping of a file at least `len` long (checked
    // or made so by the caller, and sealed); the result is checked.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(RingError::Os { what: "mmap", cause: std::io::Error::last_os_error() });
    }
    let ptr = NonNull::new(p.cast::<u8>())
        .ok_or_else(|| RingError::Os { what: "mmap", cause: std::io::Error::other("mapped at null") })?;
    Ok(Mapping { ptr, len, capacity, fd })
}

/// Writes the peer's incoming ring. One thread at a time (`&mut self`).
#[derive(Debug)]
pub struct RingSender {
    map: Arc<Mapping>,
    ring: usize,
    /// Bytes written ever: ours, never read back from the mapping.
    tail: u64,
}

impl RingSender {
    /// Copies as much of `bytes` as fits and publishes it; returns how many
    /// bytes went (0 when the ring is full).
    pub fn write(&mut self, bytes: &[u8]) -> Result<usize, RingError> {
        let cap = self.map.capacity;
        let head = self.map.head(self.ring).load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > cap as u64 {
            return Err(RingError::Corrupt { index: "head", value: head, ours: self.tail, capacity: cap });
        }
        let n = bytes.len().min(cap - used as usize);
        if n == 0 {
            return Ok(0);
        }
        let data = self.map.data(self.ring);
        let start = (self.tail % cap as u64) as usize;
        let first = n.min(cap - start);
        // SAFETY: both spans lie inside this ring's `cap` bytes.
        unsafe {
            store_bytes(data.add(start), &bytes[..first]);
            store_bytes(data, &bytes[first..n]);
        }
        self.tail = self.tail.wrapping_add(n as u64);
        // SeqCst, not only Release: the load of the sleeping flag after it
        // must not be ordered before it (module doc, "Sleeping").
        self.map.tail(self.ring).store(self.tail, Ordering::SeqCst);
        Ok(n)
    }

    /// Writes all of `bytes` if they fit now, else nothing: `Ok(false)`.
    /// For a writer that must not wait and must not leave half a message.
    pub fn try_write_all(&mut self, bytes: &[u8]) -> Result<bool, RingError> {
        let cap = self.map.capacity;
        let head = self.map.head(self.ring).load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > cap as u64 {
            return Err(RingError::Corrupt { index: "head", value: head, ours: self.tail, capacity: cap });
        }
        if cap - (used as usize) < bytes.len() {
            return Ok(false);
        }
        // The room can only have grown since: all of it goes.
        let n = self.write(bytes)?;
        debug_assert_eq!(n, bytes.len());
        Ok(n == bytes.len())
    }

    /// Whether the reader went to sleep (and so needs a doorbell); the flag
    /// is cleared, so one doorbell answers one sleep. Call after [`RingSender::write`].
    pub fn take_sleeper(&self) -> bool {
        let flag = self.map.sleeping(self.ring);
        flag.load(Ordering::SeqCst) != 0 && flag.swap(0, Ordering::SeqCst) != 0
    }

    /// Bytes written and not yet read by the peer (as it says).
    pub fn pending(&self) -> u64 {
        self.tail.wrapping_sub(self.map.head(self.ring).load(Ordering::Acquire))
    }
}

/// Reads our incoming ring. One thread at a time (`&mut self`).
#[derive(Debug)]
pub struct RingReceiver {
    map: Arc<Mapping>,
    ring: usize,
    /// Bytes read ever: ours, never read back from the mapping.
    head: u64,
}

impl RingReceiver {
    /// Bytes published and not yet read (checked against the capacity).
    pub fn available(&self) -> Result<usize, RingError> {
        let cap = self.map.capacity;
        let tail = self.map.tail(self.ring).load(Ordering::Acquire);
        let avail = tail.wrapping_sub(self.head);
        if avail > cap as u64 {
            return Err(RingError::Corrupt { index: "tail", value: tail, ours: self.head, capacity: cap });
        }
        Ok(avail as usize)
    }

    /// Appends everything published so far to `out` (at most `max` bytes)
    /// and frees its room; returns how many bytes came.
    pub fn read_into(&mut self, out: &mut Vec<u8>, max: usize) -> Result<usize, RingError> {
        let n = self.available()?.min(max);
        if n == 0 {
            return Ok(0);
        }
        let cap = self.map.capacity;
        let data = self.map.data(self.ring);
        let start = (self.head % cap as u64) as usize;
        let first = n.min(cap - start);
        let at = out.len();
        out.resize(at + n, 0);
        // SAFETY: both spans lie inside this ring's `cap` bytes.
        unsafe {
            load_bytes(data.add(start), &mut out[at..at + first]);
            load_bytes(data, &mut out[at + first..at + n]);
        }
        self.head = self.head.wrapping_add(n as u64);
        self.map.head(self.ring).store(self.head, Ordering::Release);
        Ok(n)
    }

    /// Says we are about to sleep; `true` if the ring is still empty after
    /// that (sleep, then call [`RingReceiver::woke`]), `false` if bytes came
    /// meanwhile (the flag is cleared: read them instead).
    pub fn prepare_sleep(&self) -> bool {
        let flag = self.map.sleeping(self.ring);
        flag.store(1, Ordering::SeqCst);
        let tail = self.map.tail(self.ring).load(Ordering::SeqCst);
        if tail != self.head {
            flag.store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Awake again: writers need not ring.
    pub fn woke(&self) {
        self.map.sleeping(self.ring).store(0, Ordering::SeqCst);
    }

    /// Sleeps on `sock` (the socket beside the rings) until the writer rings
    /// its doorbell, the peer closes it, or `timeout` passes (`None`: no
    /// limit); returns at once if bytes came meanwhile ([`RingReceiver::prepare_sleep`],
    /// then [`RingReceiver::woke`]). The caller reads the socket afterwards
    /// (the doorbell byte, or the end).
    pub fn sleep_on(&self, sock: BorrowedFd<'_>, timeout: Option<std::time::Duration>) -> std::io::Result<()> {
        if !self.prepare_sleep() {
            return Ok(());
        }
        let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: libc::c_long::from(d.subsec_nanos() as i32),
        });
        let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: one valid pollfd; `ts_ptr` is null or points to a live timespec.
        let rc = unsafe { libc::ppoll(&mut pfd, 1, ts_ptr, std::ptr::null()) };
        let failed = (rc < 0).then(std::io::Error::last_os_error);
        self.woke();
        match failed {
            Some(e) if e.kind() != std::io::ErrorKind::Interrupted => Err(e),
            _ => Ok(()),
        }
    }
}

/// Looks a poller makes with the core held ([`relax`]) before it starts
/// giving the core up between looks.
pub const HOT_LOOKS: u32 = 64;

/// What a thread polling for a message (a ring, a channel, a socket) does
/// between two looks, the `looks`th of its wait (from 0): for the first
/// [`HOT_LOOKS`] it only pauses the core (`spin_loop`), so that a message
/// arriving is seen within a look; after them it gives the core up
/// (`sched_yield`), so that on a
/// machine with fewer free cores than polling threads the threads with work
/// still run. A `sched_yield` enters the kernel's scheduler each time (1-2 µs
/// on the H100 machine's virtual CPUs, `__schedule` the largest symbol of the
/// daemon's profiles), and a message that arrives meanwhile waits for it to
/// return: on every hop of a request. The hot looks keep that off the start
/// of a wait: 64 looks are 6-16 µs, which cover the gaps between the
/// messages of a round. Tried and removed: one yield in 32 looks past the
/// hot ones, which measured no different on one H200 (docs/daemon.md,
/// "Where a launch + sync's time goes"; the code is in git: 026a0d1,
/// `GPUMUX_YIELD_EVERY`).
pub fn relax(looks: u32) {
    if looks >= HOT_LOOKS {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// Wakes a peer sleeping on the socket beside the rings: one byte (0),
/// sent without waiting. A full socket already holds bytes that will wake it
/// (not an error); a peer that closed its end is (`BrokenPipe`,
/// `ConnectionReset`), with no SIGPIPE.
pub fn ring_doorbell(sock: BorrowedFd<'_>) -> std::io::Result<()> {
    loop {
        // SAFETY: sends one byte from a live array on a descriptor the caller holds open.
        let n =
            unsafe { libc::send(sock.as_raw_fd(), [0u8].as_ptr().cast(), 1, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        if n >= 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => {}
            std::io::ErrorKind::WouldBlock => return Ok(()),
            _ => return Err(e),
        }
    }
}

/// Stores `src` at `dst` with relaxed atomic stores (8 bytes at a time
/// where `dst` is aligned): the peer may read concurrently.
///
/// # Safety
/// `dst..dst + src.len()` must lie inside the mapping.
unsafe fn store_bytes(dst: *mut u8, src: &[u8]) {
    let mut i = 0;
    while i < src.len() && !(dst as usize + i).is_multiple_of(8) {
        AtomicU8::from_ptr(dst.add(i)).store(src[i], Ordering::Relaxed);
        i += 1;
    }
    while i + 8 <= src.len() {
        let mut w = [0u8; 8];
        w.copy_from_slice(&src[i..i + 8]);
        AtomicU64::from_ptr(dst.add(i).cast()).store(u64::from_ne_bytes(w), Ordering::Relaxed);
        i += 8;
    }
    while i < src.len() {
        AtomicU8::from_ptr(dst.add(i)).store(src[i], Ordering::Relaxed);
        i += 1;
    }
}

/// Loads `dst.len()` bytes from `src` with relaxed atomic loads (see
/// [`store_bytes`]): a peer that writes meanwhile gives us garbage, not UB.
///
/// # Safety
/// `src..src + dst.len()` must lie inside the mapping.
unsafe fn load_bytes(src: *const u8, dst: &mut [u8]) {
    let mut i = 0;
    while i < dst.len() && !(src as usize + i).is_multiple_of(8) {
        dst[i] = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Ordering::Relaxed);
        i += 1;
    }
    while i + 8 <= dst.len() {
        let w = AtomicU64::from_ptr(src.add(i).cast_mut().cast()).load(Ordering::Relaxed);
        dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
        i += 8;
    }
    while i < dst.len() {
        dst[i] = AtomicU8::from_ptr(src.add(i).cast_mut()).load(Ordering::Relaxed);
        i += 1;
    }
}

#[cfg(test)]
mod tests;

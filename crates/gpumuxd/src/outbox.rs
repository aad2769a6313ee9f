//! A client's way out, shared by the core and the connection's writer thread.
//!
//! Every frame used to go from the core through a channel to the writer
//! thread, which wrote it to the socket or, once the client's rings were
//! open, into its ring: a hand-off per reply, and a wake-up of the writer
//! (tens of µs in a virtual machine) when it had gone to sleep. Once the
//! rings are open the core writes a frame into the ring itself, without
//! waiting, when two things hold: nothing is queued for the writer (frames
//! keep their order: the writer decrements its count only after writing), and
//! the whole frame fits now (a full ring, a client that does not read, never
//! holds up the core). Otherwise the frame goes to the writer as before, which
//! waits for room up to its write timeout.
//!
//! It also keeps the connection's backlog for the `outstanding` limit
//! (`config::ServerLimits`): requests its reader handed to the core that the
//! core has not taken yet, plus frames queued for the writer and not yet
//! written, each by its cost. The reader stops reading the client while the
//! backlog is at the limit ([`Outbox::wait_for_room`]): a client that does not
//! read its replies stops being read, instead of queueing without bound. On
//! the path of every request this is an atomic add in the reader and an
//! atomic subtract in the core; nothing waits unless the client is over.

use crate::conn::COST_UNIT_BYTES;
use gpumux_proto::{encode_frame, Notice, Reply, ServerFrame};
use gpumux_ring::RingSender;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The ring of a client whose rings are open, and its socket for doorbells.
#[derive(Debug)]
struct RingOut {
    ring: Mutex<RingSender>,
    sock: UnixStream,
}

/// See the module doc.
#[derive(Debug, Default)]
pub struct Outbox {
    ring: OnceLock<RingOut>,
    /// Frames handed to the writer thread and not yet written by it, by
    /// their [`frame_cost`] (non-zero exactly while some are queued).
    queued: AtomicU64,
    /// Requests the reader handed to the core and the core has not taken, by
    /// their cost (`Inbound::cost`).
    requests: AtomicU64,
    /// The writer has ended: the connection is going, nothing more will be written.
    closed: AtomicBool,
}

/// What a frame counts against its connection's `outstanding` limit while it
/// waits for the writer: one, plus one per [`COST_UNIT_BYTES`] of its lists
/// and texts, estimated (a `Status` row as 128 bytes, a kernel entry as 64).
pub fn frame_cost(frame: &ServerFrame) -> u64 {
    let bytes = match frame {
        ServerFrame::Reply { result: Ok(Reply::Status(s)), .. } => {
            s.clients.iter().map(|c| 128 + c.name.len()).sum::<usize>()
        }
        ServerFrame::Reply { result: Ok(Reply::Module { kernels, log, .. }), .. } => {
            log.len() + kernels.iter().map(|k| 64 + k.name.len()).sum::<usize>()
        }
        ServerFrame::Reply { result: Err(e), .. } => e.message.len(),
        ServerFrame::Notice(Notice::ContextLost { what, lost, .. }) => {
            what.len() + lost.launches.iter().map(|l| 8 + l.len()).sum::<usize>() + 8 * lost.buffers.len()
        }
        _ => 0,
    };
    1 + (bytes / COST_UNIT_BYTES) as u64
}

impl Outbox {
    /// The client's rings are open: frames go into `ring` from now on (the
    /// reader calls this before the answer to `UseRings` is sent).
    pub fn open(&self, ring: RingSender, sock: UnixStream) {
        let _ = self.ring.set(RingOut { ring: Mutex::new(ring), sock });
    }

    /// The core: writes `frame` straight into the client's ring if its rings
    /// are open, nothing is queued for the writer and the frame fits; `false`:
    /// hand it to the writer (after [`Outbox::queue`]).
    pub fn try_direct(&self, frame: &ServerFrame) -> bool {
        let Some(out) = self.ring.get() else { return false };
        if self.queued.load(Ordering::Acquire) != 0 {
            return false;
        }
        // The writer holds the lock only while it writes a queued frame.
        let Ok(mut ring) = out.ring.try_lock() else { return false };
        let Ok(bytes) = encode_frame(frame) else { return false };
        match ring.try_write_all(&bytes) {
            Ok(true) => {
                if ring.take_sleeper() {
                    // A closed socket is the reader's to notice.
                    let _ = gpumux_ring::ring_doorbell(out.sock.as_fd());
                }
                true
            }
            // No room, or a ring the client broke: the writer finds out.
            Ok(false) | Err(_) => false,
        }
    }

    /// A frame of `cost` ([`frame_cost`]) is about to go to the writer.
    pub fn queue(&self, cost: u64) {
        self.queued.fetch_add(cost, Ordering::AcqRel);
    }

    /// The writer: writes `frame` into the ring if the rings are open
    /// (`None`: write it to the socket), waiting for room up to `timeout`,
    /// polling for `spin` first. Call [`Outbox::written`] after either.
    pub fn write_ring(&self, frame: &ServerFrame, spin: Duration, timeout: Duration) -> Option<std::io::Result<()>> {
        let out = self.ring.get()?;
        let mut ring = out.ring.lock().unwrap_or_else(PoisonError::into_inner);
        Some(write_waiting(&mut ring, &out.sock, frame, spin, timeout))
    }

    /// The writer wrote a queued frame of `cost` (or gave up on it).
    pub fn written(&self, cost: u64) {
        self.queued.fetch_sub(cost, Ordering::AcqRel);
    }

    /// The writer has ended (the client is going): a reader waiting for room stops waiting.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// Whether the writer has ended ([`Outbox::close`]).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The reader hands the core a request of `cost`.
    pub fn sent_request(&self, cost: u64) {
        self.requests.fetch_add(cost, Ordering::Relaxed);
    }

    /// The core took a request of `cost` from the connection.
    pub fn took_request(&self, cost: u64) {
        self.requests.fetch_sub(cost, Ordering::Relaxed);
    }

    /// Requests the core has not taken and frames the writer has not
    /// written, by their cost.
    pub fn backlog(&self) -> u64 {
        self.requests.load(Ordering::Relaxed) + self.queued.load(Ordering::Acquire)
    }

    /// The reader, before it hands the core more: returns at once while the
    /// backlog is under `limit`; else waits (polling, then napping up to a
    /// millisecond) until it is, and says how long it waited. `None`: the
    /// writer ended meanwhile (the connection is going).
    pub fn wait_for_room(&self, limit: u64) -> Option<Duration> {
        if self.backlog() < limit {
            return Some(Duration::ZERO);
        }
        let start = Instant::now();
        let mut looks = 0u32;
        let mut nap = Duration::from_micros(20);
        loop {
            if self.closed.load(Ordering::Acquire) {
                return None;
            }
            if self.backlog() < limit {
                return Some(start.elapsed());
            }
            if looks < gpumux_ring::HOT_LOOKS {
                gpumux_ring::relax(looks);
                looks += 1;
            } else {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(1));
            }
        }
    }
}

/// Writes a frame into `ring`, waiting (polling for `spin`, then napping)
/// while it is full for at most `timeout`, and rings the client's doorbell if
/// it sleeps.
fn write_waiting(
    ring: &mut RingSender,
    sock: &UnixStream,
    frame: &ServerFrame,
    spin: Duration,
    timeout: Duration,
) -> std::io::Result<()> {
    let bytes = encode_frame(frame).map_err(std::io::Error::other)?;
    let mut sent = 0;
    let start = Instant::now();
    loop {
        sent += ring.write(&bytes[sent..]).map_err(std::io::Error::other)?;
        if ring.take_sleeper() {
            // A closed socket is the reader's to notice.
            let _ = gpumux_ring::ring_doorbell(sock.as_fd());
        }
        if sent == bytes.len() {
            return Ok(());
        }
        let waited = start.elapsed();
        if waited > timeout {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the client does not read its ring"));
        }
        if waited < spin {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

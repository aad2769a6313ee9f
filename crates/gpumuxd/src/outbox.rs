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

use gpumux_proto::{encode_frame, ServerFrame};
use gpumux_ring::RingSender;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Frames handed to the writer thread and not yet written by it.
    queued: AtomicU64,
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

    /// A frame is about to go to the writer.
    pub fn queue(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    /// The writer: writes `frame` into the ring if the rings are open
    /// (`None`: write it to the socket), waiting for room up to `timeout`,
    /// polling for `spin` first. Call [`Outbox::written`] after either.
    pub fn write_ring(&self, frame: &ServerFrame, spin: Duration, timeout: Duration) -> Option<std::io::Result<()>> {
        let out = self.ring.get()?;
        let mut ring = out.ring.lock().unwrap_or_else(PoisonError::into_inner);
        Some(write_waiting(&mut ring, &out.sock, frame, spin, timeout))
    }

    /// The writer wrote a queued frame (or gave up on it).
    pub fn written(&self) {
        self.queued.fetch_sub(1, Ordering::AcqRel);
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

//! The daemon's ring of replies, read by whichever thread of the client
//! needs it: a call waiting for its reply reads it itself while it polls, and
//! the reader thread reads it the rest of the time.
//!
//! Why: with only the reader thread reading the ring, every reply crossed two
//! threads of the client (the reader saw it and handed it to the waiting
//! call through a channel), and on a loaded machine the two polling threads
//! took turns on the same cores. Now a call that waits reads the ring while
//! it polls (issue 35: the hop of the reader thread gone from a launch +
//! sync), and the reader thread parks meanwhile, so one thread of the client
//! polls, not two; once no call polls, the reader thread takes the ring over
//! again, with today's windows, its sleep on the socket and its watch for the
//! daemon's end.
//!
//! **Order.** Frames are read and routed under one lock ([`ReplyRing::side`]),
//! so they are routed in the order the daemon wrote them whichever thread
//! reads them: a launch's refusal is kept before the reply of the sync after
//! it reaches its caller, as before. A caller that reads another caller's
//! reply hands it on through that caller's channel.
//!
//! **Doorbells.** The reader thread sets the ring's sleeping flag only when it
//! sleeps on the socket, after its window; within its window it polls if a
//! call sleeps waiting for a reply, and parks otherwise (no flag, no CPU), so
//! a daemon answering a call that polls rings no doorbell and no thread of
//! the client is woken. A call that starts polling while the reader already
//! sleeps reads its reply from the ring at once; the doorbell that the
//! daemon rings for it wakes the reader off the call's path.
//!
//! **Frames no call waits for** (a launch's refusal, a notice) are read by
//! the next call that polls or by the reader when its window ends, at most a
//! window later than before: they are reported at the next call that waits
//! for stream work either way.

use crate::conn::{
    close_routing, drain_socket, lock, origin_ns, spin_window, Routed, Routing, READER_SPIN, READ_CHUNK, SOCKET_EVERY,
};
use crate::error::ClientError;
use gpumux_proto::{decode_frame_body, FrameReader, ServerFrame};
use gpumux_ring::RingReceiver;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

/// Whether waiting calls read the ring themselves: unless
/// `GPUMUX_CALLER_READS=0` in the client's environment (read once), which
/// leaves every read to the reader thread as before, for an A/B in one run.
pub(crate) fn callers_read() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPUMUX_CALLER_READS").map_or(true, |v| v.trim() != "0"))
}

/// The read end of the ring and what has been read from it but not yet routed.
struct Side {
    rx: RingReceiver,
    frames: FrameReader,
    /// Bytes of one read, kept to spare an allocation per read.
    inbox: Vec<u8>,
    /// A read failed (a corrupt ring, a frame that does not decode): nothing
    /// past it can be trusted; the reader thread closes the connection.
    broken: bool,
}

/// What the reader thread and the waiting calls share to read the replies.
pub(crate) struct ReplyRing {
    side: Mutex<Side>,
    routing: Arc<Mutex<Routing>>,
    /// Calls polling the ring now: while there are any, the reader thread parks.
    pollers: AtomicU32,
    /// The reader thread, unparked when the last poller stops.
    reader: OnceLock<std::thread::Thread>,
    /// When a frame was last routed (ns after `origin`): the reader thread's
    /// window counts from it, whichever thread read the frame.
    last_frame: AtomicU64,
    /// The connection is being dropped (its socket shut): the reader stops
    /// parking and goes to the socket, where it finds the end at once.
    closing: AtomicBool,
}

/// The longest the reader thread parks before it looks again at whether a
/// call still polls (an unpark ends the park earlier: this only bounds a
/// missed one).
const PARK: Duration = Duration::from_millis(5);

impl ReplyRing {
    /// Shares the ring `rx` (with `frames`, what was read from it already)
    /// between the reader thread and the calls waiting for `routing`'s replies.
    pub(crate) fn new(rx: RingReceiver, frames: FrameReader, routing: Arc<Mutex<Routing>>) -> Arc<ReplyRing> {
        Arc::new(ReplyRing {
            side: Mutex::new(Side { rx, frames, inbox: Vec::new(), broken: false }),
            routing,
            pollers: AtomicU32::new(0),
            reader: OnceLock::new(),
            last_frame: AtomicU64::new(origin_ns()),
            closing: AtomicBool::new(false),
        })
    }

    /// Reads what the ring holds and routes every whole frame in it; the
    /// frames routed, or `Err` once a read failed (then and ever after).
    /// `by_reader`: the reader thread reads (its stage stamp says so).
    fn pump(&self, side: &mut Side, by_reader: bool) -> Result<usize, ()> {
        if side.broken {
            return Err(());
        }
        let routed = Self::read_and_route(side, &self.routing, by_reader);
        match routed {
            Ok(n) => {
                if n > 0 {
                    self.last_frame.store(origin_ns(), Ordering::Relaxed);
                }
                Ok(n)
            }
            Err(_) => {
                side.broken = true;
                Err(())
            }
        }
    }

    /// One read of the ring into `side`'s frames, and each whole frame
    /// routed, under one hold of the routing lock.
    fn read_and_route(side: &mut Side, routing: &Mutex<Routing>, by_reader: bool) -> Result<usize, ClientError> {
        side.inbox.clear();
        side.rx
            .read_into(&mut side.inbox, usize::MAX)
            .map_err(|e| ClientError::Protocol { request: "a reply", got: e.to_string() })?;
        side.frames.extend(&side.inbox);
        let mut routed = 0;
        let mut held = None;
        while let Some(body) = side.frames.next_body()? {
            let frame = decode_frame_body(&body)?;
            if let ServerFrame::Reply { id, .. } = &frame {
                gpumux_stamps::stamp(gpumux_stamps::Stage::ReplySeen, *id, u64::from(by_reader));
            }
            held.get_or_insert_with(|| lock(routing)).route(frame);
            routed += 1;
        }
        Ok(routed)
    }

    /// [`ReplyRing::pump`] with the ring's lock taken, waiting for it.
    fn pump_locked(&self) -> Result<usize, ()> {
        self.pump(&mut lock(&self.side), true)
    }

    /// A call's poll for its answer on `rx`: reads the ring itself (when no
    /// other thread is reading it) for up to `spin`. `None`: no answer within
    /// the window, or the ring broke; the caller then sleeps on `rx`, and
    /// the reader thread (unparked here) reads on.
    pub(crate) fn poll_for(&self, rx: &Receiver<Routed>, spin: Duration) -> Option<Result<Routed, ()>> {
        self.pollers.fetch_add(1, Ordering::SeqCst);
        let start = Instant::now();
        let mut looks = 0u32;
        let got = loop {
            match rx.try_recv() {
                Ok(answer) => break Some(Ok(answer)),
                Err(TryRecvError::Disconnected) => break Some(Err(())),
                Err(TryRecvError::Empty) => {}
            }
            if start.elapsed() >= spin {
                break None;
            }
            let routed = match self.side.try_lock() {
                Ok(mut side) => self.pump(&mut side, false),
                Err(TryLockError::Poisoned(p)) => self.pump(&mut p.into_inner(), false),
                // Another thread is reading: what it routes to us shows on `rx`.
                Err(TryLockError::WouldBlock) => Ok(0),
            };
            match routed {
                Ok(0) => {
                    gpumux_ring::relax(looks);
                    looks = looks.saturating_add(1);
                }
                Ok(_) => looks = 0,
                Err(()) => break None,
            }
        };
        self.pollers.fetch_sub(1, Ordering::SeqCst);
        // A call that goes to sleep needs the reader thread reading for it
        // (it may be parked for the rest of its window): woken here, and only
        // here, so that a call answered while it polled costs no wake-up.
        if got.is_none() {
            if let Some(reader) = self.reader.get() {
                reader.unpark();
            }
        }
        got
    }

    /// The connection's socket was shut: the reader thread, parked for its
    /// window, goes to the socket now and ends (the drop joins it).
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(reader) = self.reader.get() {
            reader.unpark();
        }
    }

    /// Starts the reader thread on `stream` (the socket beside the rings).
    pub(crate) fn spawn_reader(
        self: &Arc<Self>,
        stream: UnixStream,
        urgent: Arc<AtomicBool>,
        spin_until: Arc<AtomicU64>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let shared = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name("gpumux-client-reader".into())
            .spawn(move || shared.read_loop(stream, &urgent, &spin_until))?;
        // No call can poll yet: the connection is not handed out before this returns.
        let _ = self.reader.set(handle.thread().clone());
        Ok(handle)
    }

    /// The reader thread: reads the ring while no call does. For its window
    /// after the last frame (`spin_window` of [`READER_SPIN`], or the
    /// connection's `spin_until`) it stays off the ring's sleeping flag, so
    /// that the daemon rings no doorbell for a reply that a call reads
    /// itself: it polls if a call sleeps waiting for a reply (as every reader
    /// did before calls read the ring), else it parks until the window ends
    /// (a call that comes reads its reply itself; nothing else needs handing
    /// on soon). After the window it sleeps on the socket until a doorbell.
    /// Ends at the daemon's end of the socket or a read that failed, telling
    /// every waiting call.
    fn read_loop(&self, stream: UnixStream, urgent: &AtomicBool, spin_until: &AtomicU64) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut tries = 0u32;
        loop {
            let closing = self.closing.load(Ordering::SeqCst);
            if self.pollers.load(Ordering::SeqCst) > 0 && !closing {
                std::thread::park_timeout(PARK);
                tries = 0;
                continue;
            }
            match self.pump_locked() {
                Ok(0) => {}
                Ok(_) => {
                    tries = 0;
                    continue;
                }
                Err(()) => break,
            }
            tries = tries.wrapping_add(1);
            let now = origin_ns();
            let window = spin_window(READER_SPIN, urgent.load(Ordering::Relaxed)).as_nanos() as u64;
            let end = (self.last_frame.load(Ordering::Relaxed) + window).max(spin_until.load(Ordering::Relaxed));
            let spinning = now < end && !closing;
            if spinning && callers_read() && !lock(&self.routing).awaited() {
                std::thread::park_timeout(Duration::from_nanos(end - now).min(PARK));
                continue;
            }
            if spinning && !tries.is_multiple_of(SOCKET_EVERY) {
                gpumux_ring::relax(tries);
                continue;
            }
            if !spinning && lock(&self.side).rx.prepare_sleep() {
                // Until the daemon's doorbell or end, without the ring's lock:
                // a call that starts polling meanwhile reads the ring itself.
                let mut pfd = libc::pollfd { fd: stream.as_fd().as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one pollfd, valid for the call; -1: no timeout.
                unsafe { libc::poll(&mut pfd, 1, -1) };
                gpumux_stamps::stamp(gpumux_stamps::Stage::ClientReaderWake, 0, 0);
                lock(&self.side).rx.woke();
            }
            // Doorbells say nothing more; the end is read once the ring is empty.
            let mut doorbells = FrameReader::new();
            if let Err(ClientError::DaemonGone) = drain_socket(&stream, &mut doorbells, &mut buf) {
                // What the ring holds was written before the end.
                let _ = self.pump_locked();
                break;
            }
        }
        close_routing(&stream, &self.routing);
    }
}

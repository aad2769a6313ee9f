//! The simulated device's copy engine: the bytes of a finished copy are
//! moved on a thread of its own, as a GPU's DMA engines move them beside its
//! host thread. Moved on the core's thread, a client's 32 MiB chunk held
//! every other client's launches for the milliseconds of its `memcpy`
//! (issue 35: "no client's copy stalls another client's launch").
//!
//! The simulator decides *when* a copy is done (its copy engines'
//! bandwidth); this thread only does the moving, and the copy is reported
//! done to the core once its bytes are there. The memory it touches stays
//! valid meanwhile: the daemon frees a buffer or unmaps a shared region only
//! once no bound operation uses it, and an operation stays bound until the
//! core hears that it is done.

use crate::shm::ShmRegion;
use gpumux_engine::ids::CopyId;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Copies smaller than this are moved on the caller's thread: a hand-off
/// costs more than the `memcpy`.
pub const ON_THREAD_FROM: u64 = 256 << 10;

/// What a fill writes: a byte (a memset), or a little-endian word of
/// `width` bytes (2 or 4) over and over (`cuMemsetD16` / `D32`).
#[derive(Clone, Copy, Debug)]
pub enum Fill {
    /// Every byte.
    Byte(u8),
    /// Every `width` bytes, from the first.
    Word {
        /// The word (its low bytes for `width` 2).
        value: u32,
        /// Bytes a word.
        width: u8,
    },
}

/// One copy's move: `bytes` from `src` to `dst`, or `bytes` of `fill` at `dst`.
pub struct Move {
    /// The copy it finishes.
    pub copy: CopyId,
    /// Source (ignored for a fill).
    pub src: *const u8,
    /// Destination.
    pub dst: *mut u8,
    /// How many bytes (a row's, for a pitched copy).
    pub bytes: usize,
    /// How the bytes lie: one row, or a pitched copy's rows.
    pub rows: Rows,
    /// A memset's byte, or a fill's word.
    pub fill: Option<Fill>,
    /// The shared region it reads or writes, kept mapped until it is done.
    pub region: Option<Arc<ShmRegion>>,
}

/// The rows of a move: `count` rows of [`Move::bytes`] each, the source's
/// `src_pitch` and the destination's `dst_pitch` bytes apart (a pitched
/// copy, `Request::Copy2D`); a plain move is [`Rows::ONE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rows {
    /// How many rows.
    pub count: usize,
    /// Bytes between the source's row starts.
    pub src_pitch: usize,
    /// Bytes between the destination's row starts.
    pub dst_pitch: usize,
}

impl Rows {
    /// One row.
    pub const ONE: Rows = Rows { count: 1, src_pitch: 0, dst_pitch: 0 };
}

// SAFETY: the pointers stay valid until the move is reported done (module
// doc); nothing else touches those bytes meanwhile (the copy's operation
// owns them until the core hears it is done).
unsafe impl Send for Move {}

impl Move {
    /// All the bytes it moves (every row's).
    pub fn total_bytes(&self) -> usize {
        self.bytes.saturating_mul(self.rows.count)
    }

    /// Does it.
    ///
    /// # Safety
    /// `src` (unless a fill) and `dst` are valid for `bytes` bytes (for each
    /// row, at its pitch); they may overlap.
    pub unsafe fn run(&self) {
        if self.rows.count != 1 && self.fill.is_none() {
            for r in 0..self.rows.count {
                // SAFETY: the caller's guarantee, row by row.
                unsafe {
                    std::ptr::copy(
                        self.src.add(r * self.rows.src_pitch),
                        self.dst.add(r * self.rows.dst_pitch),
                        self.bytes,
                    )
                }
            }
            return;
        }
        // SAFETY: the caller's guarantee.
        unsafe {
            match self.fill {
                Some(Fill::Byte(v)) => std::ptr::write_bytes(self.dst, v, self.bytes),
                Some(Fill::Word { value, width }) => {
                    // One page word by word, then doubled by copies (a page
                    // is whole words of 2 or 4 bytes, so the pattern runs on).
                    let word = value.to_le_bytes();
                    let first = self.bytes.min(4096);
                    for i in 0..first {
                        self.dst.add(i).write(word[i % width as usize]);
                    }
                    let mut filled = first;
                    while filled < self.bytes {
                        let n = filled.min(self.bytes - filled);
                        std::ptr::copy_nonoverlapping(self.dst, self.dst.add(filled), n);
                        filled += n;
                    }
                }
                None => std::ptr::copy(self.src, self.dst, self.bytes),
            }
        }
    }
}

/// The thread and its queues (module doc).
pub struct CopyEngine {
    jobs: Option<Sender<Move>>,
    done: Receiver<CopyId>,
    thread: Option<JoinHandle<()>>,
    in_flight: usize,
}

impl CopyEngine {
    /// Starts the thread (or moves on the caller's thread if it cannot start).
    pub fn new() -> CopyEngine {
        let (jobs, queue) = channel::<Move>();
        let (report, done) = channel();
        let thread = std::thread::Builder::new()
            .name("gpumuxd-sim-copy".into())
            .spawn(move || {
                for m in queue {
                    // SAFETY: `Move`'s contract, kept by `start`'s caller.
                    unsafe { m.run() };
                    let copy = m.copy;
                    drop(m);
                    if report.send(copy).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| tracing::warn!("the simulated copy engine's thread did not start ({e}): copies move inline"))
            .ok();
        let jobs = thread.as_ref().map(|_| jobs);
        CopyEngine { jobs, done, thread, in_flight: 0 }
    }

    /// Moves `m` on the thread; [`CopyEngine::take_done`] reports it. `false`:
    /// it was moved here and now (no thread), and is done.
    ///
    /// # Safety
    /// As [`Move::run`], until the copy is reported done.
    pub unsafe fn start(&mut self, m: Move) -> bool {
        let Some(jobs) = self.jobs.as_ref() else {
            // SAFETY: the caller's guarantee.
            unsafe { m.run() };
            return false;
        };
        match jobs.send(m) {
            Ok(()) => {
                self.in_flight += 1;
                true
            }
            Err(std::sync::mpsc::SendError(m)) => {
                // The thread is gone: move here from now on.
                self.jobs = None;
                // SAFETY: the caller's guarantee.
                unsafe { m.run() };
                false
            }
        }
    }

    /// Appends the copies moved since the last call.
    pub fn take_done(&mut self, out: &mut Vec<CopyId>) {
        let before = out.len();
        out.extend(self.done.try_iter());
        self.in_flight = self.in_flight.saturating_sub(out.len() - before);
    }

    /// Copies handed to the thread and not yet reported done.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Waits until every move handed over is done (before the memory goes),
    /// and forgets them: a rebuild drops every operation.
    pub fn settle(&mut self) {
        while self.in_flight > 0 {
            match self.done.recv() {
                Ok(_) => self.in_flight -= 1,
                Err(_) => break,
            }
        }
    }
}

impl Default for CopyEngine {
    fn default() -> Self {
        CopyEngine::new()
    }
}

impl Drop for CopyEngine {
    fn drop(&mut self) {
        // Every move done before the memory it touches is unmapped.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

//! What CUDA programs use beyond one stream of launches and copies (issue
//! 40; the table of CUDA runtime calls and their gpumux equivalents is
//! docs/cuda-runtime-calls.md): cross-stream waits, event timing, host
//! functions in stream order, device queries, 16- and 32-bit fills and
//! pitched (2-D) copies and memsets.
//!
//! Waits, event times, host functions, device queries, fills and pitched
//! copies are requests of their own (a pitched copy is one `Copy2D`
//! between a buffer and a buffer or a host buffer). 2-D memsets, and 2-D
//! copies from other host memory, are built here from the requests the
//! daemon has (all on the caller's stream, so in stream order); how, and
//! what each costs, is in each one's doc.

use crate::client::{expect_done, unexpected, Client, Event};
use crate::conn::PendingReply;
use crate::error::{ClientError, Result};
use crate::handles::{Buffer, Kernel};
use gpumux_proto::{DeviceProperties, ErrorKind, ErrorReply, Place2D, Reply, Request, StreamId};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Requests a 2-D operation keeps unanswered at once: enough to keep the
/// daemon busy, few enough that their replies wait in no queue for long.
const WINDOW: usize = 256;

/// A pitched region of a buffer: `height` rows of `width` bytes, each
/// `pitch` bytes after the one before, from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pitched {
    /// Bytes from the buffer's start to the first row.
    pub offset: u64,
    /// Bytes from one row's start to the next's (≥ the width).
    pub pitch: u64,
}

impl Pitched {
    /// Rows `pitch` bytes apart from `offset`.
    pub fn new(offset: u64, pitch: u64) -> Pitched {
        Pitched { offset, pitch }
    }
}

/// Checks `height` rows of `width` bytes, `pitch` apart from `offset`, lie
/// within `len` bytes; returns the end of the last row.
fn rows_fit(what: &str, offset: u64, pitch: u64, width: u64, height: u64, len: u64) -> Result<u64> {
    if pitch < width {
        return Err(ClientError::Invalid(format!(
            "{what}: a pitch of {pitch} bytes is less than the width of {width}"
        )));
    }
    let end = height
        .checked_sub(1)
        .and_then(|rows| rows.checked_mul(pitch))
        .and_then(|n| n.checked_add(offset))
        .and_then(|n| n.checked_add(width));
    match end {
        Some(end) if end <= len => Ok(end),
        _ => Err(ClientError::Invalid(format!(
            "{what}: {height} rows of {width} bytes, {pitch} apart from offset {offset}, run past the end of {len} bytes"
        ))),
    }
}

impl Client {
    /// Makes `stream`'s later work wait until `event`'s work is done,
    /// without blocking the caller (`cudaStreamWaitEvent`). The event as
    /// recorded now counts. The daemon starts none of that later work
    /// before then, under any policy and whatever it preempts.
    pub fn stream_wait_event(&self, stream: StreamId, event: Event) -> Result<()> {
        self.done(Request::StreamWaitEvent { stream, event: event.0 })
    }

    /// Nanoseconds from `start`'s end to `end`'s (`cudaEventElapsedTime`,
    /// which gives ms): each event's time is the device time at which the
    /// daemon saw the work before it end (docs/daemon.md, "Event timing").
    /// [`ErrorKind::NotReady`] while either has not ended: wait first.
    pub fn event_elapsed_ns(&self, start: Event, end: Event) -> Result<i64> {
        match self.conn.call(Request::EventElapsed { start: start.0, end: end.0 })? {
            Reply::Elapsed(ns) => Ok(ns),
            other => Err(unexpected("EventElapsed", &other)),
        }
    }

    /// What the device is (`cudaGetDeviceProperties`).
    pub fn device_properties(&self) -> Result<DeviceProperties> {
        match self.conn.call(Request::DeviceProperties)? {
            Reply::Properties(p) => Ok(p),
            other => Err(unexpected("DeviceProperties", &other)),
        }
    }

    /// Blocks of `kernel` one SM holds at once when launched with
    /// `block_threads` threads and `dynamic_shared_bytes` of dynamic shared
    /// memory per block (`cudaOccupancyMaxActiveBlocksPerMultiprocessor`);
    /// 0 when one block does not fit.
    pub fn occupancy(&self, kernel: &Kernel, block_threads: u32, dynamic_shared_bytes: u32) -> Result<u32> {
        let request = Request::Occupancy { kernel: kernel.id, block_threads, dynamic_shared_bytes };
        match self.conn.call(request)? {
            Reply::Occupancy(n) => Ok(n),
            other => Err(unexpected("Occupancy", &other)),
        }
    }

    /// Runs `f` on a thread of the library once `stream`'s work queued before
    /// now is done, and holds the stream's later work until `f` returns
    /// (`cudaLaunchHostFunc`); returns at once. The daemon answers when the
    /// stream reaches the function and holds the stream until the library
    /// says `f` returned, so the order is the daemon's, not the host's: two
    /// functions on one stream run one after the other, in order. `f` is not
    /// run if an error is sticky on the stream then (as CUDA does not); the
    /// error, or a refusal, is reported at the next call that waits for
    /// stream work, as a launch's is. A panic in `f` is caught (the stream
    /// goes on) and reported the same way. Each function waits on a thread
    /// of its own, so functions of different streams never wait for each
    /// other.
    pub fn launch_host_func(&self, stream: StreamId, f: impl FnOnce() + Send + 'static) -> Result<()> {
        if let Some(e) = self.conn.take_deferred_error() {
            return Err(e);
        }
        // The thread first: once the request is sent, only it can let the stream go.
        let (tx, rx) = std::sync::mpsc::channel::<PendingReply>();
        let conn = Arc::clone(&self.conn);
        std::thread::Builder::new()
            .name("gpumux-host-fn".into())
            .spawn(move || {
                let Ok(pending) = rx.recv() else { return };
                let token = match pending.wait() {
                    Ok(Reply::HostFunc(token)) => token,
                    Ok(other) => return conn.defer_error(as_daemon_error("HostFunc", unexpected("HostFunc", &other))),
                    // The reader thread kept a refusal for the next call
                    // (`send_reporting`); a closed connection every call sees.
                    Err(_) => return,
                };
                let ran = catch_unwind(AssertUnwindSafe(f));
                if let Err(e) = conn.send(Request::EndHostFunc { token }, None).and_then(expect_done) {
                    conn.defer_error(e);
                }
                if ran.is_err() {
                    let e = ClientError::Invalid("a host function panicked (the stream went on)".into());
                    conn.defer_error(as_daemon_error("HostFunc", e));
                }
            })
            .map_err(ClientError::Io)?;
        let pending = self.conn.send_reporting(Request::HostFunc(stream))?;
        // The thread waits on `rx` until this arrives; it cannot have gone.
        let _ = tx.send(pending);
        Ok(())
    }

    /// Fills `count` 32-bit words of `buffer` from `offset` (a multiple of
    /// 4) with `value`, in stream order (`cuMemsetD32`); answered when the
    /// daemon accepts it, as [`Client::memset`] is.
    pub fn memset_d32(&self, buffer: &Buffer, offset: u64, value: u32, count: u64, stream: StreamId) -> Result<()> {
        self.fill(buffer, offset, value, 4, count, stream)
    }

    /// Fills `count` 16-bit words of `buffer` from `offset` (a multiple of
    /// 2) with `value`, in stream order (`cuMemsetD16`).
    pub fn memset_d16(&self, buffer: &Buffer, offset: u64, value: u16, count: u64, stream: StreamId) -> Result<()> {
        self.fill(buffer, offset, u32::from(value), 2, count, stream)
    }

    fn fill(&self, buffer: &Buffer, offset: u64, value: u32, width: u8, count: u64, stream: StreamId) -> Result<()> {
        let bytes = count
            .checked_mul(u64::from(width))
            .ok_or_else(|| ClientError::Invalid(format!("a fill of {count} words of {width} bytes overflows")))?;
        let dst = buffer.slice(offset, bytes, "fill")?;
        if count == 0 {
            return Ok(());
        }
        self.done(Request::Fill { dst, value, width, count, stream })
    }

    /// Sets `height` rows of `width` bytes of `buffer`, `dst.pitch` apart
    /// from `dst.offset`, to `value`, in stream order (`cudaMemset2D`). Rows
    /// with no gap between them are one memset; otherwise one memset per row,
    /// `WINDOW` requests in flight at once, the stream synced every
    /// quarter of the client's queued-ops limit of rows.
    pub fn memset_2d(
        &self,
        buffer: &Buffer,
        dst: Pitched,
        value: u8,
        width: u64,
        height: u64,
        stream: StreamId,
    ) -> Result<()> {
        rows_fit("memset_2d", dst.offset, dst.pitch, width, height, buffer.len())?;
        if width == 0 || height == 0 {
            return Ok(());
        }
        if dst.pitch == width {
            return self.memset(buffer, dst.offset, value, width * height, stream);
        }
        self.rows(height, stream, |row| {
            let dst = buffer.slice(dst.offset + row * dst.pitch, width, "memset_2d")?;
            Ok(Request::Memset { dst, value, bytes: width, stream })
        })
    }

    /// Copies `height` rows of `width` bytes between two of this client's
    /// buffers (or within one), each side with its own pitch, in stream
    /// order (`cudaMemcpy2D`, device to device): one request (`Copy2D`, one
    /// copy per row queued at once on a GPU), answered when accepted, as
    /// [`Client::copy_device`].
    #[allow(clippy::too_many_arguments)]
    pub fn copy_device_2d(
        &self,
        src: &Buffer,
        from: Pitched,
        dst: &Buffer,
        to: Pitched,
        width: u64,
        height: u64,
        stream: StreamId,
    ) -> Result<()> {
        rows_fit("copy_device_2d source", from.offset, from.pitch, width, height, src.len())?;
        rows_fit("copy_device_2d destination", to.offset, to.pitch, width, height, dst.len())?;
        if width == 0 || height == 0 {
            return Ok(());
        }
        if from.pitch == width && to.pitch == width {
            return self.copy_device(src, from.offset, dst, to.offset, width * height, stream);
        }
        self.done(Request::Copy2D {
            src: Place2D::Device { at: src.slice(from.offset, 0, "copy_device_2d source")?, pitch: from.pitch },
            dst: Place2D::Device { at: dst.slice(to.offset, 0, "copy_device_2d destination")?, pitch: to.pitch },
            width,
            height,
            stream,
            wait: false,
        })
    }

    /// Copies `height` rows of `width` bytes from `src` (rows `src_pitch`
    /// apart) to `buffer` (rows `dst.pitch` apart from `dst.offset`), in
    /// stream order; returns when they are on the device (`cudaMemcpy2D`,
    /// host to device). From a [`crate::HostBuffer`]: one request and one
    /// DMA of the rows as they lie (`Copy2D`). From other memory the rows
    /// are packed on the host and copied once, and, into rows with gaps
    /// between them, go through a temporary device buffer of
    /// `width × height` bytes (counted against the quota while the call
    /// lasts) and one pitched device copy.
    #[allow(clippy::too_many_arguments)]
    pub fn copy_to_device_2d(
        &self,
        buffer: &Buffer,
        dst: Pitched,
        src: &[u8],
        src_pitch: u64,
        width: u64,
        height: u64,
        stream: StreamId,
    ) -> Result<()> {
        let extent = rows_fit("copy_to_device_2d source", 0, src_pitch, width, height, src.len() as u64)?;
        rows_fit("copy_to_device_2d destination", dst.offset, dst.pitch, width, height, buffer.len())?;
        if width == 0 || height == 0 {
            return Ok(());
        }
        if src_pitch != width || dst.pitch != width {
            if let Some(at) = self.hosts.find(src.as_ptr(), extent as usize) {
                return self.done_copy(
                    Request::Copy2D {
                        src: Place2D::Host { at, pitch: src_pitch },
                        dst: Place2D::Device {
                            at: buffer.slice(dst.offset, 0, "copy_to_device_2d destination")?,
                            pitch: dst.pitch,
                        },
                        width,
                        height,
                        stream,
                        wait: true,
                    },
                    width * height,
                );
            }
        }
        // Rows without gaps go as they are (from a `HostBuffer`: one DMA).
        let packed = pack(src, src_pitch, width, height);
        if dst.pitch == width {
            return self.copy_to_device(buffer, dst.offset, &packed, stream);
        }
        let temp = self.alloc(width * height)?;
        let r = self
            .copy_to_device(&temp, 0, &packed, stream)
            .and_then(|()| self.copy_device_2d(&temp, Pitched::new(0, width), buffer, dst, width, height, stream));
        // Freed once the copies queued before are done (the daemon defers it).
        let freed = self.free(temp);
        r.and(freed)
    }

    /// Copies `height` rows of `width` bytes from `buffer` (rows
    /// `src.pitch` apart from `src.offset`) into `dst` (rows `dst_pitch`
    /// apart), after the stream's earlier work; returns when they are there
    /// (`cudaMemcpy2D`, device to host). The reverse of
    /// [`Client::copy_to_device_2d`]: into a [`crate::HostBuffer`] one
    /// request, else through a packed copy (and the same temporary buffer
    /// for rows with gaps between them).
    #[allow(clippy::too_many_arguments)]
    pub fn copy_to_host_2d(
        &self,
        buffer: &Buffer,
        src: Pitched,
        dst: &mut [u8],
        dst_pitch: u64,
        width: u64,
        height: u64,
        stream: StreamId,
    ) -> Result<()> {
        rows_fit("copy_to_host_2d source", src.offset, src.pitch, width, height, buffer.len())?;
        let extent = rows_fit("copy_to_host_2d destination", 0, dst_pitch, width, height, dst.len() as u64)?;
        if width == 0 || height == 0 {
            return Ok(());
        }
        if src.pitch == width && dst_pitch == width {
            // Into a `HostBuffer`: one DMA.
            return self.copy_to_host(buffer, src.offset, &mut dst[..(width * height) as usize], stream);
        }
        if let Some(at) = self.hosts.find(dst.as_ptr(), extent as usize) {
            return self.done_copy(
                Request::Copy2D {
                    src: Place2D::Device {
                        at: buffer.slice(src.offset, 0, "copy_to_host_2d source")?,
                        pitch: src.pitch,
                    },
                    dst: Place2D::Host { at, pitch: dst_pitch },
                    width,
                    height,
                    stream,
                    wait: true,
                },
                width * height,
            );
        }
        let mut packed = vec![0u8; (width * height) as usize];
        if src.pitch == width {
            self.copy_to_host(buffer, src.offset, &mut packed, stream)?;
        } else {
            let temp = self.alloc(width * height)?;
            let r = self
                .copy_device_2d(buffer, src, &temp, Pitched::new(0, width), width, height, stream)
                .and_then(|()| self.copy_to_host(&temp, 0, &mut packed, stream));
            let freed = self.free(temp);
            r.and(freed)?;
        }
        for (row, chunk) in packed.chunks_exact(width as usize).enumerate() {
            let at = row * dst_pitch as usize;
            dst[at..at + width as usize].copy_from_slice(chunk);
        }
        Ok(())
    }

    /// Sends one request per row (`request(row)`), at most [`WINDOW`]
    /// unanswered at once and, since each accepted one stays queued on the
    /// device until done, a sync of the stream after every quarter of the
    /// client's queued-ops limit (a 2-D operation alone never hits it).
    /// After an error the replies in flight are awaited, and the first
    /// error returned.
    fn rows(&self, height: u64, stream: StreamId, request: impl Fn(u64) -> Result<Request>) -> Result<()> {
        let batch = u64::from(self.welcome().limits.queued_ops / 4).max(1);
        let mut in_flight: VecDeque<PendingReply> = VecDeque::new();
        let outcome = (|| {
            for row in 0..height {
                if in_flight.len() >= WINDOW {
                    if let Some(p) = in_flight.pop_front() {
                        expect_done(p)?;
                    }
                }
                if row > 0 && row % batch == 0 {
                    while let Some(p) = in_flight.pop_front() {
                        expect_done(p)?;
                    }
                    self.sync(stream)?;
                }
                in_flight.push_back(self.conn.send(request(row)?, None)?);
            }
            while let Some(p) = in_flight.pop_front() {
                expect_done(p)?;
            }
            Ok(())
        })();
        for p in in_flight {
            let _ = p.wait();
        }
        outcome
    }
}

/// `height` rows of `width` bytes from `src`, `pitch` apart, packed (checked
/// by the caller); rows without gaps are borrowed as they are.
fn pack(src: &[u8], pitch: u64, width: u64, height: u64) -> std::borrow::Cow<'_, [u8]> {
    if pitch == width {
        return std::borrow::Cow::Borrowed(&src[..(width * height) as usize]);
    }
    let mut out = Vec::with_capacity((width * height) as usize);
    for row in 0..height as usize {
        let at = row * pitch as usize;
        out.extend_from_slice(&src[at..at + width as usize]);
    }
    std::borrow::Cow::Owned(out)
}

/// A library-side error in the form deferred errors take (a daemon's
/// refusal of `request`), so the next waiting call reports it.
fn as_daemon_error(request: &'static str, e: ClientError) -> ClientError {
    match e {
        d @ ClientError::Daemon { .. } => d,
        other => ClientError::Daemon { request, error: ErrorReply::new(ErrorKind::Invalid, other.to_string()) },
    }
}

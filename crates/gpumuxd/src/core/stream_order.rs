//! Issue 40's requests: orders between streams and with the host
//! (`StreamWaitEvent`, `HostFunc` / `EndHostFunc`), event timing
//! (`EventElapsed`), device queries (`DeviceProperties`, `Occupancy`) and
//! 16/32-bit fills (`Fill`).
//!
//! The orders are the engine's: a wait is a `StreamOp::WaitFor` and a host
//! function a `StreamOp::Sync` (answered when the stream reaches it) then a
//! `StreamOp::Hold` (released by the client's `EndHostFunc`). Only the head
//! of a stream is ever active in the engine, so no policy can start the work
//! behind either early, whatever it preempts. Neither is a kernel or a copy,
//! so the kernel after one is not queued ahead behind the kernel before it
//! (`submit_op`'s `last_kernel`).

use super::requests::no_event;
use super::*;
use gpumux_proto::DeviceProperties;

impl Core {
    /// `StreamWaitEvent`: `stream`'s later work waits for `event`'s.
    pub(super) fn stream_wait_event(
        &mut self,
        client: u64,
        stream: StreamId,
        event: EventId,
    ) -> Result<Reply, ErrorReply> {
        let s = self.session(client)?;
        let ev = s.events.get(&event).ok_or_else(|| no_event(event))?;
        // The engine process (stream) of the event's marker, while it has
        // not completed; one that has orders nothing (CUDA: a no-op).
        let awaited = ev.op.and_then(|op| {
            let e = self.ops.get(&op)?;
            Some((s.streams.get(&e.stream)?.slot, op))
        });
        match awaited {
            Some((slot, op)) => {
                self.submit_op(client, stream, StreamOp::WaitFor { slot, op }, None, OpKind::Wait)?;
            }
            None if s.streams.get(&stream).is_some_and(|st| !st.closing) => {}
            None => return Err(no_stream(stream)),
        }
        Ok(Reply::Done)
    }

    /// `EventElapsed`: the device time from `start`'s end to `end`'s, in ns.
    pub(super) fn event_elapsed(&self, client: u64, start: EventId, end: EventId) -> Result<Reply, ErrorReply> {
        let s = self.session(client)?;
        let at = |e: EventId| -> Result<Nanos, ErrorReply> {
            let ev = s.events.get(&e).ok_or_else(|| no_event(e))?;
            match (ev.op, ev.ended_at) {
                (None, Some(t)) => Ok(t),
                (Some(_), _) => Err(err(
                    ErrorKind::NotReady,
                    format!("event {} has not completed: wait for it (or query it) before asking its time", e.0),
                )),
                (None, None) => Err(err(
                    ErrorKind::ContextLost,
                    format!("event {}'s work was lost with the device context: it has no time; record it again", e.0),
                )),
            }
        };
        let (a, b) = (at(start)?, at(end)?);
        // Device times are ns since the backend opened: far below 2^63.
        Ok(Reply::Elapsed(i64::try_from(b).unwrap_or(i64::MAX) - i64::try_from(a).unwrap_or(i64::MAX)))
    }

    /// `DeviceProperties`: what the engine knows of the device, in CUDA's terms.
    pub(super) fn device_properties(&self) -> DeviceProperties {
        let info = self.backend.info();
        let name = self.backend.describe();
        DeviceProperties {
            simulated: name.starts_with("sim:"),
            name,
            compute_capability: self.backend.compute_capability(),
            sms: u32::from(info.num_sms),
            memory_bytes: info.mem_bytes,
            memory_bandwidth: info.mem_bandwidth,
            // What every launch is checked against (`validate::launch`).
            max_threads_per_block: 1024,
            max_block_dims: gpumux_cuda::client::MAX_BLOCK,
            max_grid_dims: gpumux_cuda::client::MAX_GRID,
            max_threads_per_sm: info.sm.max_threads,
            max_blocks_per_sm: info.sm.max_blocks,
            registers_per_sm: info.sm.registers,
            shared_bytes_per_sm: info.sm.smem_bytes,
            warp_size: 32,
        }
    }

    /// `Occupancy`: resident blocks per SM of `kernel` launched with
    /// `block_threads` threads and `dynamic` bytes of dynamic shared memory
    /// per block, from its registers and static shared memory (the kernel as
    /// written: what a program sizes its grid with, as with CUDA's call).
    pub(super) fn occupancy(
        &self,
        client: u64,
        kernel: KernelId,
        block_threads: u32,
        dynamic: u32,
    ) -> Result<Reply, ErrorReply> {
        let s = self.session(client)?;
        let image = s
            .kernels
            .get(&kernel)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("kernel {} is not yours", kernel.0)))?;
        let max = image.max_threads_per_block.min(1024);
        if block_threads == 0 || block_threads > max {
            return Err(err(
                ErrorKind::Invalid,
                format!("a block of {block_threads} threads: `{}` takes 1 to {max}", image.name),
            ));
        }
        if dynamic > image.max_dynamic_smem {
            return Ok(Reply::Occupancy(0));
        }
        let smem = image.static_smem.saturating_add(dynamic);
        let shape = KernelShape::new(1, block_threads, image.regs_per_thread).with_smem_per_block(smem);
        let desc = KernelDesc::new(image.name.clone(), shape);
        Ok(Reply::Occupancy(self.backend.info().blocks_per_sm(&desc).unwrap_or(0)))
    }

    /// `HostFunc`: a marker answered when the stream reaches it, then a hold
    /// the client releases. Refused whole (nothing submitted) if the two
    /// operations do not fit under the client's queued-ops limit.
    pub(super) fn host_func(&mut self, client: u64, id: u64, stream: StreamId) -> Result<(), ErrorReply> {
        let s = self.session(client)?;
        if s.in_flight.saturating_add(2) > s.limits.queued_ops {
            return Err(err(
                ErrorKind::Quota,
                format!(
                    "{} operations queued or running, your limit is {} (a host function takes 2): sync first",
                    s.in_flight, s.limits.queued_ops
                ),
            ));
        }
        let marker =
            self.submit_op(client, stream, StreamOp::Sync, None, OpKind::HostFunc { reply: id, hold: None })?;
        // The marker's completion, if the stream was idle, waits in the
        // engine until `drain_completions`, by which time it knows its hold.
        let hold = self.submit_op(client, stream, StreamOp::Hold, None, OpKind::Hold);
        let (kind, result) = match hold {
            Ok(hold) => (OpKind::HostFunc { reply: id, hold: Some(hold) }, Ok(())),
            // The marker then answers nobody; the request's error says why.
            Err(e) => (OpKind::Wait, Err(e)),
        };
        if let Some(e) = self.ops.get_mut(&marker) {
            e.kind = kind;
        }
        result
    }

    /// The marker of a host function completed: the client runs it now,
    /// unless an error is sticky on the stream (then it hears the error, as
    /// a CUDA host function is not called after one, and the stream goes on).
    pub(super) fn host_func_reached(&mut self, client: u64, stream: StreamId, reply: u64, hold: OpId) {
        let sticky = self.sessions.get(&client).and_then(|s| s.streams.get(&stream)).and_then(|st| st.error.clone());
        match sticky {
            None => self.reply(client, reply, Ok(Reply::HostFunc(hold.0))),
            Some(e) => {
                self.reply(client, reply, Err(e));
                if let Err(e) = self.release_hold(client, hold) {
                    tracing::error!("client {client}: releasing a host function's hold after an error: {e}");
                }
            }
        }
    }

    /// `Fill`: `count` words of `width` bytes from `dst`, in stream order.
    pub(super) fn fill(
        &mut self,
        client: u64,
        dst: gpumux_proto::BufferSlice,
        value: u32,
        width: u8,
        count: u64,
        stream: StreamId,
    ) -> Result<Reply, ErrorReply> {
        if width != 2 && width != 4 {
            return Err(err(ErrorKind::Invalid, format!("a fill of {width}-byte words: 2 or 4 (a byte is Memset)")));
        }
        if !dst.offset.is_multiple_of(u64::from(width)) {
            return Err(err(
                ErrorKind::Invalid,
                format!("a fill of {width}-byte words at offset {}: it must be a multiple of {width}", dst.offset),
            ));
        }
        let bytes = count
            .checked_mul(u64::from(width))
            .ok_or_else(|| err(ErrorKind::OutOfRange, format!("{count} words of {width} bytes overflow")))?;
        let addr = validate::device_span(self.session(client)?, dst, bytes)?;
        let work = OpWork::Fill { dst: addr, value, width, bytes };
        self.submit_copy(client, stream, CopyDirection::DeviceToDevice, bytes, work, None)?;
        Ok(Reply::Done)
    }

    /// `EndHostFunc`: the hold `token` of one of the client's host functions goes.
    pub(super) fn end_host_func(&mut self, client: u64, token: u64) -> Result<Reply, ErrorReply> {
        self.release_hold(client, OpId(token))?;
        Ok(Reply::Done)
    }

    fn release_hold(&mut self, client: u64, op: OpId) -> Result<(), ErrorReply> {
        let not_yours = || err(ErrorKind::NoSuchHandle, format!("no host function of yours waits with token {}", op.0));
        let e =
            self.ops.get(&op).filter(|e| e.client == client && matches!(e.kind, OpKind::Hold)).ok_or_else(not_yours)?;
        let slot = self.session(client)?.streams.get(&e.stream).map(|st| st.slot).ok_or_else(not_yours)?;
        let now = self.backend.now();
        match self.engine.release(now, slot, op) {
            Ok(true) => Ok(()),
            Ok(false) => Err(not_yours()),
            Err(e) => Err(err(ErrorKind::Invalid, e.to_string())),
        }
    }
}

fn no_stream(stream: StreamId) -> ErrorReply {
    err(ErrorKind::NoSuchHandle, format!("stream {} is not yours (or was destroyed)", stream.0))
}

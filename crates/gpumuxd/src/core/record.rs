//! `gpumuxd --record FILE`: the core's notes of what its clients did
//! ([`crate::recording`] is the format), for `gpumux replay`.
//!
//! The core calls the hooks below where it already sees things happen: a
//! client greeted or gone, an operation submitted, sent to the device,
//! completed. A disabled recorder costs one branch a hook. An enabled one
//! formats a line into a buffer on the core; the buffer goes to a writer
//! thread at most once a millisecond (and when the core is idle, at its next
//! turn), so the core never waits for the disk. A write error ends the
//! recording, logged once; the daemon serves on. The writer thread flushes
//! after each batch, and everything at shutdown.

use super::OpKind;
use crate::backend::OpWork;
use crate::recording::{Line, OpLine, What, FORMAT};
use gpumux_engine::device::CopyDirection;
use gpumux_engine::ids::OpId;
use gpumux_engine::time::Nanos;
use gpumux_engine::StreamOp;
use gpumux_proto::StreamId;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often at most the core hands its lines to the writer.
const SEND_EVERY: Duration = Duration::from_millis(1);
/// Batches the writer may be behind before the core keeps lines itself.
const QUEUED_BATCHES: usize = 256;
/// Lines the core keeps while the writer is behind; past this the writer is
/// not keeping up with the disk at all, and recording stops (logged) rather
/// than let the daemon's memory grow.
const MAX_HELD_BYTES: usize = 64 << 20;

/// An operation submitted and not yet completed.
struct Pending {
    client: u64,
    stream: u32,
    what: What,
    reply: bool,
    submitted: Nanos,
    started: Option<Nanos>,
    launches: u32,
    sms: u32,
}

/// The writer thread and what the core has not handed it yet.
struct Sink {
    path: PathBuf,
    tx: Option<SyncSender<String>>,
    thread: Option<JoinHandle<()>>,
    /// Set by the writer when a write failed (it logged it).
    failed: Arc<AtomicBool>,
    held: String,
    last_sent: Instant,
}

/// The recorder; [`Recorder::off`] records nothing.
pub(crate) struct Recorder {
    sink: Option<Sink>,
    pending: crate::core::id_map::IdMap<OpId, Pending>,
    /// Clients that said hello (a connection that never did leaves no line).
    greeted: std::collections::HashSet<u64>,
}

/// Why recording could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot record to {path}: {source}")]
pub struct RecordError {
    path: String,
    #[source]
    source: std::io::Error,
}

impl Recorder {
    pub(crate) fn off() -> Recorder {
        Recorder { sink: None, pending: Default::default(), greeted: Default::default() }
    }

    /// Records to `path` (created, or appended to), starting with a `daemon` line.
    pub(crate) fn to_file(
        path: &Path,
        device: String,
        policy: String,
        sms: u32,
        now: Nanos,
    ) -> Result<Recorder, RecordError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| RecordError { path: path.display().to_string(), source })?;
        let (tx, rx) = sync_channel::<String>(QUEUED_BATCHES);
        let failed = Arc::new(AtomicBool::new(false));
        let flag = failed.clone();
        let shown = path.display().to_string();
        let thread = std::thread::Builder::new()
            .name("gpumuxd-record".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
                for batch in rx {
                    if let Err(e) = out.write_all(batch.as_bytes()).and_then(|()| out.flush()) {
                        tracing::error!("recording to {shown} stopped: {e} (the daemon serves on)");
                        flag.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            })
            .map_err(|source| RecordError { path: path.display().to_string(), source })?;
        let mut r = Recorder {
            sink: Some(Sink {
                path: path.to_path_buf(),
                tx: Some(tx),
                thread: Some(thread),
                failed,
                held: String::new(),
                last_sent: Instant::now(),
            }),
            pending: Default::default(),
            greeted: Default::default(),
        };
        r.line(&Line::Daemon { format: FORMAT, device, policy, sms, at_ns: now });
        r.send();
        Ok(r)
    }

    /// Whether it records (the core builds an operation's description only then).
    pub(crate) fn on(&self) -> bool {
        self.sink.is_some()
    }

    fn line(&mut self, line: &Line) {
        let Some(s) = &mut self.sink else { return };
        s.held.push_str(&line.to_json());
        s.held.push('\n');
        if s.last_sent.elapsed() >= SEND_EVERY {
            self.send();
        }
    }

    /// Hands the lines held to the writer (or stops recording if it failed or
    /// fell hopelessly behind).
    fn send(&mut self) {
        let Some(s) = &mut self.sink else { return };
        s.last_sent = Instant::now();
        if s.failed.load(Ordering::Relaxed) {
            self.stop();
            return;
        }
        if s.held.is_empty() {
            return;
        }
        let Some(tx) = &s.tx else { return };
        match tx.try_send(std::mem::take(&mut s.held)) {
            Ok(()) => {}
            Err(TrySendError::Full(batch)) => {
                s.held = batch;
                if s.held.len() > MAX_HELD_BYTES {
                    tracing::error!(
                        "recording to {} stopped: the disk took less than the daemon recorded ({} MiB waiting); \
                         the daemon serves on",
                        s.path.display(),
                        s.held.len() >> 20
                    );
                    self.stop();
                }
            }
            Err(TrySendError::Disconnected(_)) => self.stop(),
        }
    }

    /// Ends recording: the writer writes what it was given and stops.
    fn stop(&mut self) {
        if let Some(mut s) = self.sink.take() {
            drop(s.tx.take());
            if let Some(t) = s.thread.take() {
                let _ = t.join();
            }
        }
        self.pending.clear();
    }

    /// The core's turn: lines held for more than [`SEND_EVERY`] go out (an
    /// idle core would otherwise keep its last lines until the next hook).
    pub(crate) fn tick(&mut self) {
        if self.sink.as_ref().is_some_and(|s| !s.held.is_empty() && s.last_sent.elapsed() >= SEND_EVERY) {
            self.send();
        }
    }

    pub(crate) fn hello(&mut self, client: u64, name: &str, priority: i32, weight: f64, now: Nanos) {
        if self.on() {
            self.greeted.insert(client);
            self.line(&Line::Hello { client, name: name.to_string(), priority, weight, at_ns: now });
        }
    }

    pub(crate) fn priority(&mut self, client: u64, priority: i32, now: Nanos) {
        if self.on() {
            self.line(&Line::Priority { client, priority, at_ns: now });
        }
    }

    pub(crate) fn gone(&mut self, client: u64, now: Nanos) {
        if self.greeted.remove(&client) {
            self.line(&Line::Gone { client, at_ns: now });
        }
    }

    /// Operation `op` was submitted to `client`'s `stream`.
    pub(crate) fn submitted(&mut self, op: OpId, client: u64, stream: StreamId, what: (What, bool), now: Nanos) {
        if !self.on() {
            return;
        }
        let (what, reply) = what;
        self.pending.insert(
            op,
            Pending { client, stream: stream.0, what, reply, submitted: now, started: None, launches: 0, sms: 0 },
        );
    }

    /// `op` went to the device (a launch on `sms` SMs, or a copy with 0).
    pub(crate) fn started(&mut self, op: OpId, sms: u32, now: Nanos) {
        // Off (the usual case), nothing is pending: no lookup at each launch.
        if self.pending.is_empty() {
            return;
        }
        if let Some(p) = self.pending.get_mut(&op) {
            if p.started.is_none() {
                p.started = Some(now);
                p.sms = sms;
            }
            p.launches += u32::from(sms > 0);
        }
    }

    /// The engine completed `op` (`completed`: it ran; else it was dropped).
    pub(crate) fn completed(&mut self, op: OpId, completed: bool, now: Nanos) {
        if self.pending.is_empty() {
            return;
        }
        let Some(p) = self.pending.remove(&op) else { return };
        self.line(&Line::Op(OpLine {
            client: p.client,
            op: op.0,
            stream: p.stream,
            what: p.what,
            submitted_ns: p.submitted,
            started_ns: p.started,
            ended_ns: now,
            reply: p.reply,
            launches: p.launches,
            sms: p.sms,
            completed,
        }));
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.send();
        self.stop();
    }
}

/// What an operation is, for the recording, and whether its end answers the client.
pub(super) fn describe(op: &StreamOp, work: Option<&OpWork>, kind: &OpKind) -> (What, bool) {
    let what = match (op, work) {
        (StreamOp::Kernel { desc, .. }, work) => {
            let (grid, block) = match work {
                Some(OpWork::Kernel { grid, block, .. }) => (*grid, *block),
                _ => ([desc.shape.blocks.min(u64::from(u32::MAX)) as u32, 1, 1], [desc.shape.threads_per_block, 1, 1]),
            };
            What::Kernel {
                name: desc.name.clone(),
                grid,
                block,
                shared_bytes: desc.shape.smem_per_block,
                regs_per_thread: desc.shape.regs_per_thread,
                block_time_ns: desc.sim_timing.map_or(0, |t| t.block_time_ns),
            }
        }
        (StreamOp::Copy { direction: CopyDirection::HostToDevice, bytes }, _) => What::H2d { bytes: *bytes },
        (StreamOp::Copy { direction: CopyDirection::DeviceToHost, bytes }, _) => What::D2h { bytes: *bytes },
        (StreamOp::Copy { bytes, .. }, _) => What::D2d { bytes: *bytes },
        (StreamOp::WaitFor { .. }, _) => What::Wait,
        _ => match kind {
            OpKind::Sync { .. } => What::Sync,
            OpKind::Event(_) => What::Event,
            OpKind::Wait => What::Wait,
            _ => What::HostFunc,
        },
    };
    let reply = matches!(kind, OpKind::Copy { reply: Some(_) } | OpKind::Sync { .. } | OpKind::HostFunc { .. });
    (what, reply)
}

//! A client moving to another GPU (`gpumuxd --rebalance`; docs/multi-gpu.md,
//! "Moving a client between GPUs"): its old core hands over its session,
//! with its buffers' bytes read back to host memory, and its new core
//! adopts it on its own device, as a rebuilt context puts a client back
//! (`recovery.rs`): the same handles (buffers, modules, kernels, streams,
//! events), new addresses, its modules loaded again, its bytes written in.
//!
//! Only an idle client moves: nothing of it queued, running or being moved
//! to or from host memory, so nothing ever moves under a kernel. A client
//! that is not idle is told `NotNow`, and stays. The route (`gpus.rs`)
//! asks only when one GPU has no client while this one has two or more.

use super::*;

/// The most bytes of buffers a moving client may hold. Each core copies
/// them without serving anything else (the old one reads them back, the
/// new one writes them in; `backend::pieces` bounds a device process's
/// hold to one piece, not the core's), so this bounds how long a move
/// holds a core: 1 GiB is one pass over the host link plus a host copy of
/// the same bytes on each side.
pub const MOVE_MAX: u64 = 1 << 30;

/// A client's state on its way from one core to another.
pub struct Handover {
    session: Session,
    /// Each buffer's bytes, in the session's buffer order.
    bytes: Vec<Vec<u8>>,
    /// The GPU it leaves (logged by the new core).
    from: u32,
    /// How long the old core took to read its bytes back (logged by the
    /// new core, with its own time: how long the move held each core).
    read_took: std::time::Duration,
}

impl std::fmt::Debug for Handover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let bytes: usize = self.bytes.iter().map(Vec::len).sum();
        write!(f, "Handover {{ client: {}, buffers: {}, bytes: {bytes} }}", self.session.id, self.bytes.len())
    }
}

impl Handover {
    /// Whose.
    pub fn client(&self) -> u64 {
        self.session.id
    }
}

/// Why a client was not handed over: it stays where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotNow {
    /// Something of it is queued, running, compiling, being pinned or moved.
    #[error("client {0} has work under way")]
    Busy(u64),
    /// It is not (or no longer) an open client of this core.
    #[error("client {0} is not an open client here")]
    Unknown(u64),
    /// Its buffers would not fit in the other GPU's free memory.
    #[error("client {client}'s {bytes} bytes do not fit in the other GPU's {room} free")]
    NoRoom {
        /// Whose.
        client: u64,
        /// Its buffers' bytes.
        bytes: u64,
        /// The other GPU's free memory.
        room: u64,
    },
    /// It holds more than [`MOVE_MAX`] bytes of buffers: copying them would
    /// hold both cores too long.
    #[error("client {client}'s {bytes} bytes are more than a move copies ({MOVE_MAX})")]
    TooLarge {
        /// Whose.
        client: u64,
        /// Its buffers' bytes.
        bytes: u64,
    },
    /// This device cannot read buffers back at once, or a read failed.
    #[error("client {client}'s buffers cannot be read back: {why}")]
    Device {
        /// Whose.
        client: u64,
        /// Why.
        why: String,
    },
}

impl Core {
    /// Hands `client` over if it is idle and its buffers fit in `room`
    /// bytes: its bytes read back, its memory here freed, its streams out
    /// of this engine. Anything short of that leaves it as it was.
    pub fn hand_over(&mut self, client: u64, room: u64) -> Result<Handover, NotNow> {
        let s = self.sessions.get(&client).filter(|s| s.phase == Phase::Open).ok_or(NotNow::Unknown(client))?;
        let busy = s.in_flight > 0
            || s.memory_evicted > 0
            || s.streams.values().any(|st| st.pending > 0 || st.closing)
            || s.events.values().any(|e| e.op.is_some() || !e.waiters.is_empty())
            || self.ops.values().any(|e| e.client == client)
            || self.loads.values().any(|l| l.client == client)
            || self.pins.values().any(|p| p.client == client)
            || self.swap.restoring.contains_key(&client)
            // A move between device and host memory may be one of its buffers'.
            || !self.swap.moving.is_empty();
        if busy {
            return Err(NotNow::Busy(client));
        }
        let total: u64 = s.buffers.values().map(|b| b.bytes).sum();
        if total > MOVE_MAX {
            return Err(NotNow::TooLarge { client, bytes: total });
        }
        if total > room {
            return Err(NotNow::NoRoom { client, bytes: total, room });
        }
        let began = Instant::now();
        let mut bytes = Vec::with_capacity(s.buffers.len());
        for (id, b) in &s.buffers {
            match self.backend.read_back(b.addr, b.bytes) {
                Some(Ok(data)) => bytes.push(data),
                Some(Err(e)) => return Err(NotNow::Device { client, why: format!("buffer {}: {e}", id.0) }),
                None => {
                    return Err(NotNow::Device { client, why: format!("{} has no read-back", self.backend.describe()) })
                }
            }
        }
        let Some(mut s) = self.sessions.remove(&client) else { return Err(NotNow::Unknown(client)) };
        let now = self.backend.now();
        for st in s.streams.values() {
            // Its slots are live and idle: removing one cannot fail.
            if let Err(e) = self.engine.remove_process(now, st.slot) {
                tracing::error!("client {client} moving: removing a stream from the engine: {e}");
            }
        }
        self.release_on_device(&s);
        // Kernel images are this device's: the new core loads its own.
        s.kernels.clear();
        // Its kept time and when it got its memory (none of it is evicted: idle).
        self.forget_evicted(client, s.memory_evicted);
        self.update_urgent();
        Ok(Handover { session: s, bytes, from: self.gpu, read_took: began.elapsed() })
    }

    /// Takes over a client another core handed over (module doc). A buffer
    /// that cannot be allocated or written here, or a module that does not
    /// load, is dropped and logged, as after a rebuilt context; the client
    /// learns it from its next use of the handle (`NoSuchHandle`).
    pub fn adopt(&mut self, h: Handover) {
        let Handover { session: mut s, bytes, from, read_took } = h;
        let began = Instant::now();
        let client = s.id;
        let per_stream = s.stream_weight();
        for (sid, st) in s.streams.iter_mut() {
            let info = ProcessInfo::new(ProcessId(client as u32), format!("{}#{client}.{}", s.name, sid.0))
                .with_priority(s.priority)
                .with_weight(per_stream);
            match self.engine.add_process(info) {
                Ok(slot) => st.slot = slot,
                Err(e) => tracing::error!("client {client} moving in: its stream {} has no engine slot: {e}", sid.0),
            }
            st.pending = 0;
            st.last_kernel = None;
            st.last_done = self.backend.now();
        }
        let mut dropped = Vec::new();
        for ((id, b), data) in s.buffers.iter_mut().zip(bytes) {
            // Until its allocation here, `b.addr` is the old GPU's: never freed here.
            let addr = match self.backend.alloc(b.bytes) {
                Ok(addr) => addr,
                Err(e) => {
                    tracing::error!("client {client} moving in: its buffer {} is lost: {e}", id.0);
                    dropped.push(*id);
                    continue;
                }
            };
            b.addr = addr;
            let written = match self.backend.write_in(addr, &data) {
                Some(r) => r.map_err(|e| e.to_string()),
                None => Err(format!("{} has no write-in", self.backend.describe())),
            };
            if let Err(e) = written {
                tracing::error!("client {client} moving in: its buffer {} is lost: {e}", id.0);
                let _ = self.backend.free(addr);
                dropped.push(*id);
            }
        }
        for id in dropped {
            if let Some(b) = s.buffers.remove(&id) {
                s.memory_used -= b.bytes;
            }
        }
        // Its kernel images were the old device's (`hand_over` cleared them).
        self.reattach(&mut s, "moving in");
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        tracing::info!(
            "client {client} `{}` moved from GPU {from} to GPU {}: {} buffer(s), {} bytes, {} module(s); \
             held GPU {from}'s core {:.1} ms (read back), GPU {}'s {:.1} ms (written in, modules loaded)",
            s.name,
            self.gpu,
            s.buffers.len(),
            s.memory_used,
            s.modules.len(),
            ms(read_took),
            self.gpu,
            ms(began.elapsed())
        );
        self.sessions.insert(client, s);
        self.update_urgent();
    }
}

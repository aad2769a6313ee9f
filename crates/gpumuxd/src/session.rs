//! A client's state in the core: who it is, its limits, and the handles it
//! holds. Every handle table is per session, so another client's handle is
//! simply unknown here (`NoSuchHandle`), never someone else's buffer.

use crate::backend::{DevAddr, KernelImage};
use crate::config::ClientLimits;
use crate::latency::StageTimes;
use crate::shm::ShmRegion;
use crate::spin::ConnSpin;
use gpumux_engine::ids::{OpId, Slot};
use gpumux_engine::time::Nanos;
use gpumux_proto::{BufferId, ErrorReply, EventId, HostRegionId, KernelId, ModuleId, ServerFrame, StreamId};
use std::collections::BTreeMap;
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// The peer's credentials, as `SO_PEERCRED` reported them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Process id.
    pub pid: i32,
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// Where a session is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Connected; its `Hello` has not come yet.
    AwaitingHello,
    /// Welcomed; requests are served.
    Open,
    /// Disconnected; kept only until none of its work is on the device, then
    /// its memory is freed and the session dropped.
    Gone,
}

/// A device buffer.
#[derive(Clone, Copy, Debug)]
pub struct Buffer {
    /// Where it lives now (a rebuilt context gives a new one).
    pub addr: DevAddr,
    /// Its size.
    pub bytes: u64,
    /// Its bytes are in host memory, its address kept (`core/swap.rs`).
    pub evicted: bool,
    /// Born evicted and never resident since: its bytes are zeros, and its
    /// restore is a memset on the device, no copy over the host link (the
    /// link's rate leaves it out: `core/swap.rs`, "Kept").
    pub zeros: bool,
}

/// A loaded module, kept so it can be reloaded into a rebuilt context.
#[derive(Clone, Debug)]
pub struct LoadedModule {
    /// Its name, for errors.
    pub name: String,
    /// Its source.
    pub source: String,
    /// Its compile options.
    pub options: Vec<String>,
    /// Its kernels' handles, in the order the device listed them.
    pub kernels: Vec<KernelId>,
}

/// A stream: one engine process.
#[derive(Clone, Debug)]
pub struct Stream {
    /// The engine's handle.
    pub slot: Slot,
    /// Operations submitted to the engine and not yet completed there.
    pub pending: u32,
    /// `DestroyStream` came: removed once `pending` is 0.
    pub closing: bool,
    /// The last kernel submitted, if only markers (recorded events, syncs)
    /// came after it: the next kernel is bound as following it
    /// (`OpWork::Kernel::after`). A copy or memset after it clears it.
    pub last_kernel: Option<OpId>,
    /// When an operation of it last completed (the core's clock): the next
    /// could run from then (`latency`'s `behind` stage).
    pub last_done: Nanos,
    /// An operation of it that the device ended without doing its work
    /// (`backend::OpFailed`): sticky, as CUDA's errors are. Every reply of
    /// an operation completed on the stream after it reports it, and the
    /// first `SyncStream` that does so clears it.
    pub error: Option<ErrorReply>,
}

/// An event: a sync operation on a stream.
#[derive(Clone, Debug, Default)]
pub struct EventState {
    /// The sync operation, while it has not completed.
    pub op: Option<OpId>,
    /// Ids of `WaitEvent` requests to answer when it completes.
    pub waiters: Vec<u64>,
    /// When it completed: the engine's (the device's) time when the core
    /// learnt that the work before it ended (`EventElapsed`).
    pub ended_at: Option<Nanos>,
}

/// Counters for `Status`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    /// Retreat commands against its launches.
    pub preemptions: u64,
    /// Kernels completed.
    pub kernels_done: u64,
}

/// One client (module doc).
#[derive(Debug)]
pub struct Session {
    /// Its number.
    pub id: u64,
    /// Its credentials.
    pub peer: Peer,
    /// Its limits, from the config.
    pub limits: ClientLimits,
    /// Frames to its writer; `None` once it is gone.
    pub out: Option<Sender<ServerFrame>>,
    /// Shared with its writer: once its rings are open, frames are written
    /// into them directly when nothing is queued (`crate::outbox`).
    pub outbox: Option<std::sync::Arc<crate::outbox::Outbox>>,
    /// Where it is in its life.
    pub phase: Phase,
    /// From its `Hello`.
    pub name: String,
    /// Priority of all its streams.
    pub priority: i32,
    /// Weight, split evenly among its streams.
    pub weight: f64,
    /// Its buffers.
    pub buffers: BTreeMap<BufferId, Buffer>,
    /// Bytes of its buffers, resident and evicted (freed ones no longer count).
    pub memory_used: u64,
    /// Bytes of its evicted buffers (part of `memory_used`).
    pub memory_evicted: u64,
    /// Its shared region.
    pub region: Option<Arc<ShmRegion>>,
    /// Its host regions (`AttachHost`), mapped and registered with the device.
    pub host_regions: BTreeMap<HostRegionId, Arc<ShmRegion>>,
    /// Bytes of its host regions (detached ones no longer count).
    pub host_used: u64,
    /// Its modules.
    pub modules: BTreeMap<ModuleId, LoadedModule>,
    /// Its kernels.
    pub kernels: BTreeMap<KernelId, KernelImage>,
    /// Its streams (stream 0 from the handshake).
    pub streams: BTreeMap<StreamId, Stream>,
    /// Its events.
    pub events: BTreeMap<EventId, EventState>,
    /// Kernels whose every launch is split over GPUs (`SplitKernel`, core/split.rs).
    /// With the analysis's verdict of what it does with each argument
    /// (read, written or both; checked once, at `SplitKernel`, not at every launch).
    pub split_kernels: BTreeMap<KernelId, (gpumux_proto::Split, Option<Vec<gpumux_cuda::split::merge::Role>>)>,
    /// Operations of it the core tracks (in the engine or on the device).
    pub in_flight: u32,
    /// When it last submitted an operation (the device's clock), if ever:
    /// with `in_flight`, whether it counts as busy beside a copying client
    /// (`Core::others_busy`).
    pub last_submit: Option<Nanos>,
    /// Its staging copies' chunks in flight (`CopyToDevice`, `CopyToHost`),
    /// by request id: their reply is [`gpumux_proto::Reply::Copied`]. Those
    /// whose operation is gone are dropped at the next chunk, so it holds
    /// no more than the client's operations in flight, and one more.
    pub chunks: BTreeMap<u64, OpId>,
    /// For `Status`.
    pub counters: Counters,
    /// Where its kernels spent their time in the daemon (logged when it leaves).
    pub stages: StageTimes,
    /// Its reader's and writer's poll window: urgent while its priority is above 0.
    pub spin: ConnSpin,
    /// The engine's description of its last kernel launched: its next
    /// launch of the same kernel with the same shape shares it
    /// (`Core::launch_whole`), where each launch built one, its name copied,
    /// and the engine dropped it (issue 35's callgrind). Each client's own:
    /// one for the whole core was replaced at every launch of 8 clients
    /// launching in turn, so none of theirs was shared.
    pub last_desc: Option<Arc<gpumux_engine::kernel::KernelDesc>>,
    next_handle: u64,
    /// The next stream id (`next_stream`); a test sets it to run out.
    pub(crate) next_stream: u32,
}

impl Session {
    /// A session for a peer that connected and was admitted with `limits`.
    pub fn new(id: u64, peer: Peer, limits: ClientLimits, out: Sender<ServerFrame>) -> Session {
        Session {
            id,
            peer,
            limits,
            out: Some(out),
            outbox: None,
            phase: Phase::AwaitingHello,
            name: String::new(),
            priority: 0,
            weight: 1.0,
            buffers: BTreeMap::new(),
            memory_used: 0,
            memory_evicted: 0,
            region: None,
            host_regions: BTreeMap::new(),
            host_used: 0,
            modules: BTreeMap::new(),
            kernels: BTreeMap::new(),
            streams: BTreeMap::new(),
            events: BTreeMap::new(),
            split_kernels: BTreeMap::new(),
            in_flight: 0,
            last_submit: None,
            chunks: BTreeMap::new(),
            counters: Counters::default(),
            stages: StageTimes::default(),
            spin: ConnSpin::default(),
            last_desc: None,
            next_handle: 1,
            next_stream: 1,
        }
    }

    /// A fresh handle number (buffers, modules, kernels, events and host regions share the
    /// counter, so a handle of one kind is never valid as another by accident).
    pub fn next_handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// A fresh stream id.
    pub fn next_stream(&mut self) -> Option<StreamId> {
        let s = self.next_stream;
        self.next_stream = s.checked_add(1)?;
        Some(StreamId(s))
    }

    /// Sends a frame: into its ring directly if it can go now, else to its
    /// writer (dropped if it is gone).
    pub fn send(&self, frame: ServerFrame) {
        if let Some(out) = &self.out {
            // Issue 35's stage stamps: the reply leaves the core (aux 1: to
            // the writer thread), timed before the write, which the client
            // may read before this thread stamps.
            let stamped = match &frame {
                ServerFrame::Reply { id, .. } => {
                    gpumux_stamps::now_if_on().map(|t| (t, gpumux_stamps::frame_key(self.peer.pid.max(0) as u64, *id)))
                }
                _ => None,
            };
            if let Some(outbox) = &self.outbox {
                if outbox.try_direct(&frame) {
                    if let Some((t, key)) = stamped {
                        gpumux_stamps::at(t, gpumux_stamps::Stage::CoreReply, key, 0);
                    }
                    return;
                }
                outbox.queue(crate::outbox::frame_cost(&frame));
            }
            if let Some((t, key)) = stamped {
                gpumux_stamps::at(t, gpumux_stamps::Stage::CoreReply, key, 1);
            }
            // A writer that has ended means the client is going away; its
            // reader's disconnect will follow.
            let _ = out.send(frame);
        }
    }

    /// The weight each of its streams gets in the engine.
    pub fn stream_weight(&self) -> f64 {
        self.weight / self.streams.len().max(1) as f64
    }
}

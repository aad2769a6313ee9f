//! The daemon's request path with no socket: a [`Core`] on the simulated
//! device fed bytes through a [`Connection`], as the reader thread would.
//! The bad-frame property test and the cargo-fuzz target drive it.
//!
//! Bytes carry no descriptors, so an `AttachShm` or `AttachHost` gets one
//! here, as a client would send it: a memfd sealed against shrinking, as long
//! as the request claims up to [`MEMFD_CAP`] (longer claims get a file of
//! that size, which the daemon refuses as too short).

use crate::backend::sim::SimBackend;
use crate::config::ClientLimits;
use crate::conn::{Connection, Inbound};
use crate::core::{Core, CoreError};
use crate::session::Peer;
use gpumux_proto::{Request, ServerFrame};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::mpsc::channel;

/// The longest memfd the harness makes for an `AttachShm` or `AttachHost`.
pub const MEMFD_CAP: u64 = 1 << 20;

/// A memfd of `bytes` bytes sealed against shrinking, as the client library
/// makes one; `None` if the system refuses (the request then has none).
fn memfd(bytes: u64) -> Option<OwnedFd> {
    // SAFETY: memfd_create with a NUL-terminated name; the result is checked.
    let raw = unsafe { libc::memfd_create(c"gpumux-harness".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain syscalls on a descriptor we own (the length is at most MEMFD_CAP).
    let ok = unsafe {
        libc::ftruncate(raw, bytes as libc::off_t) == 0 && libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) == 0
    };
    ok.then_some(fd)
}

/// Gives an `AttachShm` or `AttachHost` that came without a descriptor the
/// memfd a client would have sent (module doc).
fn with_memfd(inbound: Inbound) -> Inbound {
    match inbound {
        Inbound::Request { id, request, fd: None } => {
            let fd = match request {
                Request::AttachShm { bytes } | Request::AttachHost { bytes } => memfd(bytes.min(MEMFD_CAP)),
                _ => None,
            };
            Inbound::Request { id, request, fd }
        }
        other => other,
    }
}

/// A core on `sim:h100` serving in-process connections.
pub struct Harness {
    core: Core,
    limits: ClientLimits,
    next_client: u64,
}

impl Harness {
    /// A fresh core; every connection gets `limits`.
    pub fn new(limits: ClientLimits) -> Result<Harness, CoreError> {
        let backend = SimBackend::with_info(gpumux_sim::presets::h100());
        Ok(Harness { core: Core::new(Box::new(backend), None)?, limits, next_client: 1 })
    }

    /// The core, to look at its state.
    pub fn core(&self) -> &Core {
        &self.core
    }

    /// One connection: its bytes arrive in `chunks`, then it closes. Returns
    /// every frame the daemon sent it.
    pub fn connection(&mut self, chunks: &[&[u8]]) -> Result<Vec<ServerFrame>, CoreError> {
        let client = self.next_client;
        self.next_client += 1;
        let (tx, rx) = channel();
        self.core.connect(client, Peer { pid: 1, uid: 1000, gid: 1000 }, self.limits.clone(), tx);
        let mut conn = Connection::new();
        let mut inbound: Vec<Inbound> = Vec::new();
        for chunk in chunks {
            conn.receive(chunk, Vec::new(), &mut inbound);
            for i in inbound.drain(..) {
                self.core.inbound(client, with_memfd(i));
            }
            self.core.pump()?;
            if conn.is_broken() {
                break;
            }
        }
        self.core.disconnect(client);
        self.core.pump()?;
        Ok(rx.try_iter().collect())
    }
}

//! The daemon's request path with no socket: a [`Core`] on the simulated
//! device fed bytes through a [`Connection`], as the reader thread would.
//! The bad-frame property test and the cargo-fuzz target drive it.

use crate::backend::sim::SimBackend;
use crate::config::ClientLimits;
use crate::conn::{Connection, Inbound};
use crate::core::{Core, CoreError};
use crate::session::Peer;
use gpumux_proto::ServerFrame;
use std::sync::mpsc::channel;

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
                self.core.inbound(client, i);
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

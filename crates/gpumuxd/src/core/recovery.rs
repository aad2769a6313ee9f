//! A device failure: a fatal one stops the daemon; a lost context fails the
//! work that was on the device, rebuilds it and puts every client back.

use super::*;

impl Core {
    pub(super) fn failure(&mut self, f: Failure) -> Result<(), CoreError> {
        match f {
            Failure::Fatal(e) => Err(CoreError::Device(e)),
            Failure::ContextLost { suspects, what } => self.context_lost(&suspects, &what),
        }
    }

    /// A kernel broke the context: tell every client what of its was lost,
    /// fail what it waits for, and rebuild everything on a fresh context.
    fn context_lost(&mut self, suspects: &[OpId], what: &str) -> Result<(), CoreError> {
        self.rebuilds += 1;
        tracing::warn!("the device context was lost ({what}); rebuilding it");
        // A rebuild (a device process started afresh) can hold this core past
        // a `Status`'s wait: meanwhile `gpumux ps` shows the GPU restarting.
        let _restarting = self.board.as_ref().map(|(b, _)| b.restarting(self.rebuilds));
        let culprits: HashSet<u64> = suspects.iter().filter_map(|op| self.ops.get(op)).map(|e| e.client).collect();
        let mut ops: Vec<(OpId, OpEntry)> = self.ops.drain().collect();
        ops.sort_by_key(|(op, _)| *op);
        let mut lost: BTreeMap<u64, LostWork> = BTreeMap::new();
        for (_, e) in &ops {
            let l = lost.entry(e.client).or_default();
            match &e.kind {
                OpKind::Kernel { desc } if !e.ended || e.launches > 0 => l.launches.push(desc.name.clone()),
                OpKind::Copy { .. } if !e.ended || e.copying => l.copies += 1,
                _ => {}
            }
        }
        // Notices first, then the failed waits, so a client reads why before what.
        // Evicted buffers are in host memory: they come back with their
        // contents where the backend keeps them across the rebuild.
        let kept = self.backend.evicted_survive_rebuild();
        for s in self.sessions.values().filter(|s| s.phase == Phase::Open) {
            let mut work = lost.get(&s.id).cloned().unwrap_or_default();
            work.buffers = s.buffers.iter().filter(|(_, b)| !(kept && b.evicted)).map(|(k, _)| *k).collect();
            s.send(ServerFrame::Notice(Notice::ContextLost {
                caused_by_you: culprits.contains(&s.id),
                what: what.to_string(),
                lost: work,
            }));
        }
        for (_, e) in &ops {
            let kind = if culprits.contains(&e.client) { ErrorKind::KernelFault } else { ErrorKind::ContextLost };
            let launches = lost.get(&e.client).map(|l| l.launches.join(", ")).unwrap_or_default();
            let message = if kind == ErrorKind::KernelFault && culprits.len() == 1 {
                format!("your kernel broke the device context ({what}); lost launches: [{launches}]; buffers must be re-filled")
            } else if kind == ErrorKind::KernelFault {
                // The driver names no kernel: every client with one running is a suspect.
                format!(
                    "the device context broke while your kernel ran beside kernels of {} other client(s); \
                     the driver does not say which faulted ({what}); lost launches: [{launches}]; buffers must be re-filled",
                    culprits.len() - 1
                )
            } else {
                format!("another client's kernel broke the device context ({what}); your lost launches: [{launches}]; buffers must be re-filled")
            };
            match &e.kind {
                OpKind::Copy { reply: Some(id) } | OpKind::Sync { reply: id } | OpKind::HostFunc { reply: id, .. }
                    if !e.ended =>
                {
                    self.reply(e.client, *id, Err(err(kind, message)))
                }
                OpKind::Event(ev) => {
                    let waiters = self
                        .sessions
                        .get_mut(&e.client)
                        .and_then(|s| s.events.get_mut(ev))
                        .map(|st| {
                            st.op = None;
                            std::mem::take(&mut st.waiters)
                        })
                        .unwrap_or_default();
                    for w in waiters {
                        self.reply(e.client, w, Err(err(kind.clone(), message.clone())));
                    }
                }
                _ => {}
            }
        }
        self.launches.clear();
        self.copies.clear();
        // Their memory went with the context; regions waiting to be
        // unpinned are unpinned now (a rebuilt context pins again what is
        // still registered).
        for d in std::mem::take(&mut self.deferred) {
            if let Release::Region(r) | Release::Host(r) = d.release {
                self.backend.unregister_host(&r);
            }
        }
        // Moves under way end first, so that the account says which buffers
        // are out; restores under way: their gates were in the old engine.
        self.settle_moves();
        self.swap.restoring.clear();
        // Gone clients' evicted buffers: their host copies go now.
        let gone_evicted: Vec<(u64, DevAddr, u64)> = self
            .sessions
            .values()
            .filter(|s| s.phase == Phase::Gone)
            .flat_map(|s| s.buffers.values().filter(|b| b.evicted).map(move |b| (s.id, b.addr, b.bytes)))
            .collect();
        for (client, addr, bytes) in gone_evicted {
            self.forget_evicted_bytes(bytes);
            if let Err(e) = self.backend.free(addr) {
                tracing::warn!("freeing gone client {client}'s evicted buffer: {e}");
            }
        }
        // Gone clients' regions too: they are dropped here, not reaped.
        let gone = self.sessions.values().filter(|s| s.phase == Phase::Gone);
        let regions: Vec<Arc<ShmRegion>> =
            gone.flat_map(|s| s.region.iter().chain(s.host_regions.values())).cloned().collect();
        for r in regions {
            self.backend.unregister_host(&r);
        }
        self.sessions.retain(|_, s| s.phase != Phase::Gone);
        self.backend.rebuild().map_err(CoreError::Rebuild)?;
        self.engine = new_engine(self.backend.as_ref(), &self.policy)?;
        self.next_op = 0;
        let ids: Vec<u64> = self.sessions.keys().copied().collect();
        for id in ids {
            self.restore(id)?;
        }
        Ok(())
    }

    /// Puts a client back on a fresh context: its streams, buffers (same
    /// handles, new addresses, contents undefined), region and modules.
    fn restore(&mut self, client: u64) -> Result<(), CoreError> {
        let Some(mut s) = self.sessions.remove(&client) else { return Ok(()) };
        s.in_flight = 0;
        s.streams.retain(|_, st| !st.closing);
        let per_stream = s.stream_weight();
        for (sid, st) in s.streams.iter_mut() {
            let info = ProcessInfo::new(ProcessId(client as u32), format!("{}#{client}.{}", s.name, sid.0))
                .with_priority(s.priority)
                .with_weight(per_stream);
            st.slot = self.engine.add_process(info)?;
            st.pending = 0;
        }
        let mut dropped = Vec::new();
        for (id, b) in s.buffers.iter_mut() {
            if b.evicted {
                match self.backend.readdress_evicted(b.addr) {
                    Ok(addr) => {
                        b.addr = addr;
                        continue;
                    }
                    Err(e) => {
                        // Its host copy went with the device process: as lost as a resident one.
                        tracing::warn!("client {client}'s evicted buffer {} lost its contents: {e}", id.0);
                        b.evicted = false;
                        s.memory_evicted -= b.bytes;
                        self.swap.evicted = self.swap.evicted.saturating_sub(b.bytes);
                    }
                }
            }
            match self.backend.alloc(b.bytes) {
                Ok(addr) => b.addr = addr,
                Err(e) => {
                    tracing::error!("client {client}'s buffer {} cannot be re-allocated: {e}", id.0);
                    dropped.push(*id);
                }
            }
        }
        for id in dropped {
            if let Some(b) = s.buffers.remove(&id) {
                s.memory_used -= b.bytes;
            }
        }
        self.reattach(&mut s, "on a rebuilt context");
        self.sessions.insert(client, s);
        Ok(())
    }

    /// Registers a session's regions with this core's device again and
    /// loads its modules there (a rebuilt context; a client moving in from
    /// another GPU, `handover.rs`). A region or module that fails is dropped
    /// and logged, `when` saying in which case; the client learns it from
    /// its next use of the handle.
    pub(super) fn reattach(&mut self, s: &mut Session, when: &str) {
        let client = s.id;
        if let Some(r) = &s.region {
            if let Err(e) = self.backend.register_host(r) {
                tracing::error!("client {client} {when}: its shared region cannot be registered: {e}");
                s.region = None;
            }
        }
        let mut unpinned = Vec::new();
        for (id, r) in &s.host_regions {
            if let Err(e) = self.backend.register_host(r) {
                tracing::error!("client {client} {when}: its host region {} cannot be registered: {e}", id.0);
                unpinned.push(*id);
            }
        }
        for id in unpinned {
            if let Some(r) = s.host_regions.remove(&id) {
                s.host_used -= r.len() as u64;
            }
        }
        for m in s.modules.values() {
            match self.backend.load_module(&m.name, &m.source, &m.options) {
                Ok(image) => {
                    for (kid, k) in m.kernels.iter().zip(image.kernels) {
                        s.kernels.insert(*kid, k);
                    }
                }
                Err(e) => {
                    tracing::error!("client {client} {when}: its module `{}` does not load: {e}", m.name);
                    for kid in &m.kernels {
                        s.kernels.remove(kid);
                    }
                }
            }
        }
    }
}

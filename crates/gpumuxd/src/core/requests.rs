//! The core's side of the protocol: each client request checked, carried out
//! (streams, memory, modules, launches and copies submitted to the engine and
//! bound on the device), and answered.

use super::*;

impl Core {
    /// A request (or a broken rule) from `client`.
    pub fn inbound(&mut self, client: u64, inbound: Inbound) {
        let phase = match self.sessions.get(&client) {
            Some(s) => s.phase,
            None => return,
        };
        if phase == Phase::Gone {
            return;
        }
        match inbound {
            Inbound::Violation(e) => self.refuse(client, 0, e),
            Inbound::Answered { id, result } => self.reply(client, id, result),
            Inbound::Refused { id, error } => self.refuse(client, id, error),
            // `gpu` was the route's to read (gpus.rs): the client is on this core's GPU.
            Inbound::Request { id, request: Request::Hello { magic, version, name, priority, weight, .. }, .. } => {
                match self.hello(client, magic, version, name, priority, weight) {
                    Ok(w) => self.reply(client, id, Ok(Reply::Welcome(w))),
                    Err(e) => self.refuse(client, id, e),
                }
            }
            Inbound::Request { id, .. } if phase == Phase::AwaitingHello => {
                // The connection state machine lets nothing but Hello through first.
                self.refuse(client, id, err(ErrorKind::Protocol, "the first request must be Hello"))
            }
            Inbound::Request { id, request: Request::Goodbye, .. } => {
                self.reply(client, id, Ok(Reply::Done));
                self.disconnect(client);
            }
            Inbound::Request { id, request, fd } => {
                if let Some(result) = self.request(client, id, request, fd) {
                    self.reply(client, id, result);
                }
            }
        }
    }

    fn hello(
        &mut self,
        client: u64,
        magic: [u8; 4],
        version: u16,
        name: String,
        priority: i32,
        weight: f64,
    ) -> Result<Welcome, ErrorReply> {
        if magic != MAGIC {
            return Err(err(ErrorKind::Protocol, "Hello without the GMUX magic: not a gpumux client"));
        }
        if version != VERSION {
            return Err(err(
                ErrorKind::Version { daemon: VERSION, client: version },
                format!("the daemon speaks protocol version {VERSION}, the client {version}: use matching versions"),
            ));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(err(ErrorKind::Invalid, format!("a name of {} bytes, over {MAX_NAME_BYTES}", name.len())));
        }
        // Before it is stored, logged or shown: every user's `gpumux ps`
        // prints it (issue 36, case 6; why here: `printable_name`).
        let name = gpumux_proto::printable_name(&name);
        let device_memory = self.backend.info().mem_bytes;
        let sms = self.backend.info().num_sms as u32;
        let (device, policy) = (self.backend.describe(), self.policy.clone());
        let now = self.backend.now();
        let Some(s) = self.sessions.get_mut(&client) else {
            return Err(err(ErrorKind::Protocol, "unknown client"));
        };
        check_priority(&s.limits, priority)?;
        check_weight(&s.limits, weight)?;
        let info = ProcessInfo::new(ProcessId(client as u32), format!("{name}#{client}"))
            .with_priority(priority)
            .with_weight(weight);
        let slot = self.engine.add_process(info).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?;
        s.streams.insert(
            StreamId::DEFAULT,
            Stream { slot, pending: 0, closing: false, last_kernel: None, last_done: 0, error: None },
        );
        s.name = name;
        s.priority = priority;
        s.weight = weight;
        s.phase = Phase::Open;
        s.spin.set_urgent(priority > 0);
        self.record.hello(client, &s.name, priority, weight, now);
        // With several GPUs, which one (the multi-GPU check reads it: scripts/multi-gpu-daemon-check.sh).
        let on = if self.board.is_some() { format!(" on GPU {}", self.gpu) } else { String::new() };
        tracing::info!("client {client} `{}` (pid {}, uid {}) connected{on}", s.name, s.peer.pid, s.peer.uid);
        let limits = s.limits.to_proto(device_memory);
        self.update_urgent();
        Ok(Welcome { version: VERSION, client, device, policy, sms, limits, gpu: self.gpu })
    }

    /// Serves one request; `None` when the answer comes later (from a completion).
    fn request(
        &mut self,
        client: u64,
        id: u64,
        request: Request,
        fd: Option<OwnedFd>,
    ) -> Option<Result<Reply, ErrorReply>> {
        let r = match request {
            Request::Hello { .. } | Request::Goodbye => Err(err(ErrorKind::Protocol, "out of turn")),
            // The connection's reader thread answers it (server.rs); one that
            // reaches the core came some other way (a test's direct feed).
            Request::UseRings { .. } => Err(err(ErrorKind::Protocol, "UseRings is answered by the connection")),
            Request::SetPriority(p) => self.set_priority(client, p),
            Request::SetWeight(w) => self.set_weight(client, w),
            // Answered once the region is pinned (`Core::region_pinned`).
            Request::AttachShm { bytes } => return self.attach_shm(client, id, bytes, fd).err().map(Err),
            Request::AttachHost { bytes } => return self.attach_host(client, id, bytes, fd).err().map(Err),
            Request::DetachHost(h) => self.detach_host(client, h),
            copy @ (Request::CopyFromHostRegion { .. }
            | Request::CopyToHostRegion { .. }
            | Request::CopyFromHostRegionAsync { .. }
            | Request::CopyToHostRegionAsync { .. }) => {
                return self.host_copy(client, id, copy);
            }
            // Answered when done if it waits, else when accepted (core/copy_2d.rs).
            Request::Copy2D { src, dst, width, height, stream, wait } => {
                return self.copy_2d(client, id, src, dst, width, height, stream, wait);
            }
            Request::Alloc { bytes } => self.alloc(client, bytes),
            Request::Free(b) => self.free(client, b),
            Request::Memset { dst, value, bytes, stream } => self
                .session(client)
                .and_then(|s| validate::device_span(s, dst, bytes))
                .and_then(|dst| {
                    let work = OpWork::Memset { dst, value, bytes };
                    self.submit_copy(client, stream, CopyDirection::DeviceToDevice, bytes, work, None)
                })
                .map(|_| Reply::Done),
            Request::CopyDevice { src, dst, bytes, stream } => self
                .session(client)
                .and_then(|s| Ok((validate::device_span(s, src, bytes)?, validate::device_span(s, dst, bytes)?)))
                .and_then(|(src, dst)| {
                    let work = OpWork::DeviceCopy { src, dst, bytes };
                    self.submit_copy(client, stream, CopyDirection::DeviceToDevice, bytes, work, None)
                })
                .map(|_| Reply::Done),
            Request::CopyToDevice { dst, shm_offset, bytes, stream } => {
                let checked = self.session(client).and_then(|s| {
                    Ok((validate::device_span(s, dst, bytes)?, validate::shm_span(s, shm_offset, bytes)?))
                });
                return match checked.and_then(|(dst, region)| {
                    let work = OpWork::ToDevice { dst, src: HostSpan { region, offset: shm_offset }, bytes };
                    self.submit_chunk(client, id, stream, CopyDirection::HostToDevice, bytes, work)
                }) {
                    Ok(()) => None,
                    Err(e) => Some(Err(e)),
                };
            }
            Request::CopyToHost { src, shm_offset, bytes, stream } => {
                let checked = self.session(client).and_then(|s| {
                    Ok((validate::device_span(s, src, bytes)?, validate::shm_span(s, shm_offset, bytes)?))
                });
                return match checked.and_then(|(src, region)| {
                    let work = OpWork::ToHost { src, dst: HostSpan { region, offset: shm_offset }, bytes };
                    self.submit_chunk(client, id, stream, CopyDirection::DeviceToHost, bytes, work)
                }) {
                    Ok(()) => None,
                    Err(e) => Some(Err(e)),
                };
            }
            Request::LoadModule { name, source, options } => {
                return self.load_module(client, id, name, source, options).err().map(Err);
            }
            // Answered only when refused (the protocol's `Launch`).
            Request::Launch(l) => {
                // Issue 35's stage stamps: the request read, keyed by its
                // operation, with the client's pid and frame id that key the
                // client's own stamps (`gpumux_stamps::analysis`).
                let read = gpumux_stamps::now_if_on();
                let launched = self.launch(client, &l);
                if let (Some(t), Ok(())) = (read, &launched) {
                    let pid = self.session(client).map_or(0, |s| s.peer.pid.max(0) as u64);
                    let aux = (pid << 40) | (id & ((1 << 40) - 1));
                    gpumux_stamps::at(t, gpumux_stamps::Stage::CoreRead, self.next_op.saturating_sub(1), aux);
                }
                return launched.err().map(Err);
            }
            Request::CreateStream => self.create_stream(client),
            Request::DestroyStream(st) => self.destroy_stream(client, st),
            Request::SyncStream(st) => {
                if gpumux_stamps::on() {
                    let pid = self.session(client).map_or(0, |s| s.peer.pid.max(0) as u64);
                    gpumux_stamps::stamp(gpumux_stamps::Stage::CoreSync, gpumux_stamps::frame_key(pid, id), 0);
                }
                return match self.submit_op(client, st, StreamOp::Sync, None, OpKind::Sync { reply: id }) {
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                };
            }
            Request::RecordEvent(st) => self.record_event(client, st),
            Request::QueryEvent(e) => self.event(client, e).map(|ev| Reply::Query(ev.op.is_none())),
            Request::WaitEvent(e) => {
                return match self.sessions.get_mut(&client).and_then(|s| s.events.get_mut(&e)) {
                    Some(ev) if ev.op.is_none() => Some(Ok(Reply::Done)),
                    Some(ev) => {
                        ev.waiters.push(id);
                        None
                    }
                    None => Some(Err(no_event(e))),
                }
            }
            Request::DestroyEvent(e) => match self.sessions.get_mut(&client).and_then(|s| s.events.remove(&e)) {
                Some(ev) => {
                    for w in ev.waiters {
                        self.reply(client, w, Err(err(ErrorKind::Invalid, format!("event {} was destroyed", e.0))));
                    }
                    Ok(Reply::Done)
                }
                None => Err(no_event(e)),
            },
            Request::Status => Ok(Reply::Status(self.status())),
            // Issue 40's requests (core/stream_order.rs).
            Request::StreamWaitEvent { stream, event } => self.stream_wait_event(client, stream, event),
            Request::EventElapsed { start, end } => self.event_elapsed(client, start, end),
            Request::DeviceProperties => Ok(Reply::Properties(self.device_properties())),
            Request::Occupancy { kernel, block_threads, dynamic_shared_bytes } => {
                self.occupancy(client, kernel, block_threads, dynamic_shared_bytes)
            }
            Request::HostFunc(stream) => return self.host_func(client, id, stream).err().map(Err),
            Request::EndHostFunc { token } => self.end_host_func(client, token),
            Request::Fill { dst, value, width, count, stream } => self.fill(client, dst, value, width, count, stream),
            // Issue 38's split (core/split.rs).
            Request::SplitKernel { kernel, split } => self.split_kernel(client, kernel, split),
            Request::LaunchSplit { launch, split } => return self.launch_split(client, &launch, &split).err().map(Err),
        };
        Some(r)
    }

    pub(super) fn session(&self, client: u64) -> Result<&Session, ErrorReply> {
        self.sessions.get(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))
    }

    pub(super) fn session_mut(&mut self, client: u64) -> Result<&mut Session, ErrorReply> {
        self.sessions.get_mut(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))
    }

    fn event(&self, client: u64, e: EventId) -> Result<&EventState, ErrorReply> {
        self.session(client)?.events.get(&e).ok_or_else(|| no_event(e))
    }

    fn set_priority(&mut self, client: u64, p: i32) -> Result<Reply, ErrorReply> {
        let s = self.sessions.get_mut(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))?;
        check_priority(&s.limits, p)?;
        s.priority = p;
        s.spin.set_urgent(p > 0);
        self.record.priority(client, p, self.backend.now());
        for st in s.streams.values() {
            self.engine.set_priority(st.slot, p).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?;
        }
        self.update_urgent();
        Ok(Reply::Done)
    }

    /// Whether an urgent client (priority above 0) is connected changed:
    /// the core and the device process poll [`URGENT_WINDOW`] after traffic
    /// while one is (`crate::spin`).
    pub(super) fn update_urgent(&mut self) {
        let any = self.sessions.values().any(|s| s.phase == Phase::Open && s.priority > 0);
        if any != self.urgent_connected {
            self.urgent_connected = any;
            let cadence = self.cadence.awake(std::time::Instant::now());
            self.sync_device_spin(cadence);
        }
    }

    /// Asks the device process to poll [`URGENT_WINDOW`] after each message
    /// while an urgent client is connected or a client's cadence window is
    /// open (`cadence`), its own window otherwise; a message only when that
    /// changes.
    pub(super) fn sync_device_spin(&mut self, cadence: bool) {
        let wanted = if self.urgent_connected || cadence {
            crate::spin::window_for(URGENT_WINDOW, true)
        } else {
            // ZERO: the device process's own window (`--spin-us` included).
            Duration::ZERO
        };
        if wanted != self.device_spin {
            self.device_spin = wanted;
            self.backend.spin_for(wanted);
        }
    }

    fn set_weight(&mut self, client: u64, w: f64) -> Result<Reply, ErrorReply> {
        let s = self.sessions.get_mut(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))?;
        check_weight(&s.limits, w)?;
        s.weight = w;
        let per_stream = s.stream_weight();
        for st in s.streams.values() {
            self.engine.set_weight(st.slot, per_stream).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?;
        }
        Ok(Reply::Done)
    }

    /// `AttachShm`: maps and checks the memfd, and starts pinning it; the
    /// region replaces the client's once pinned ([`Core::region_pinned`]).
    fn attach_shm(&mut self, client: u64, id: u64, bytes: u64, fd: Option<OwnedFd>) -> Result<(), ErrorReply> {
        let limit = self.session(client)?.limits.shm;
        let fd =
            fd.ok_or_else(|| err(ErrorKind::Invalid, "AttachShm came without a memfd (send it with SCM_RIGHTS)"))?;
        if bytes > limit {
            return Err(err(
                ErrorKind::Quota,
                format!("a shared region of {bytes} bytes is over your limit of {limit} bytes"),
            ));
        }
        let region = Arc::new(ShmRegion::map(fd, bytes).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?);
        self.start_pin(client, id, region, PinFor::Shared)
    }

    /// Starts pinning `region` for `client`'s request `id` (`Backend::start_register`):
    /// a large region takes long (1 GiB: 716 ms on the H100 machine), and
    /// the core serves everyone else meanwhile.
    pub(super) fn start_pin(
        &mut self,
        client: u64,
        id: u64,
        region: Arc<ShmRegion>,
        what: PinFor,
    ) -> Result<(), ErrorReply> {
        let under_way = self.pins.values().filter(|p| p.client == client).count();
        under_limit(under_way, MAX_PINS_UNDER_WAY, "regions of yours are being pinned")?;
        let token = self.next_pin;
        self.next_pin += 1;
        self.backend.start_register(token, &region);
        self.pins.insert(token, PendingPin { client, id, region, what, since: Instant::now() });
        Ok(())
    }

    /// A pin of [`Core::start_pin`] finished: the region joins its client's
    /// session and the client hears of it. A client gone meanwhile has it
    /// unregistered again.
    pub(super) fn region_pinned(&mut self, token: u64, result: Result<(), MemError>) {
        let Some(PendingPin { client, id, region, what, since }) = self.pins.remove(&token) else {
            tracing::warn!("a pin no one waits for finished (token {token})");
            return;
        };
        let took = since.elapsed();
        if took > SLOW_ROUND {
            tracing::info!(
                "client {client}: pinning a region of {} bytes took {:.0} µs (off the core)",
                region.len(),
                took.as_secs_f64() * 1e6
            );
        }
        let open = self.sessions.get(&client).is_some_and(|s| s.phase == Phase::Open);
        if !open {
            if result.is_ok() {
                self.backend.unregister_host(&region);
            }
            return;
        }
        let reply = match (result, what) {
            (Err(e), PinFor::Host { bytes }) => {
                if let Ok(s) = self.session_mut(client) {
                    s.host_used = s.host_used.saturating_sub(bytes);
                }
                Err(err(ErrorKind::Device, format!("pinning the host region: {e}")))
            }
            (Err(e), PinFor::Shared) => Err(err(ErrorKind::Device, format!("pinning the shared region: {e}"))),
            (Ok(()), PinFor::Shared) => {
                let waiting_for = self.client_ops(client);
                let old = self.session_mut(client).ok().and_then(|s| s.region.replace(region));
                if let Some(old) = old {
                    self.defer(waiting_for, Release::Region(old));
                }
                Ok(Reply::Done)
            }
            (Ok(()), PinFor::Host { .. }) => self.add_host_region(client, region),
        };
        self.reply(client, id, reply);
    }

    fn alloc(&mut self, client: u64, bytes: u64) -> Result<Reply, ErrorReply> {
        let s = self.session(client)?;
        if bytes == 0 {
            return Err(err(ErrorKind::Invalid, "an allocation of 0 bytes"));
        }
        // Beyond the quota, the device's own memory is the limit (OutOfMemory).
        let quota = s.limits.memory;
        if s.memory_used.checked_add(bytes).is_none_or(|total| total > quota) {
            return Err(err(
                ErrorKind::Quota,
                format!(
                    "allocating {bytes} bytes would bring your device memory to {} bytes, over your quota of {quota} bytes (you hold {} bytes)",
                    s.memory_used as u128 + bytes as u128,
                    s.memory_used
                ),
            ));
        }
        // Evicted buffers come back all together before the client's next
        // kernel (core/swap.rs): more than the device holds could never run.
        let total = self.backend.info().mem_bytes;
        if bytes > total {
            // Larger than the device itself: its own refusal says why (and
            // what bounds a simulated device's memory); it is never born evicted.
            let e = match self.backend.alloc(bytes) {
                Ok(addr) => {
                    // Cannot be (the device has less); give it back.
                    if let Err(e) = self.backend.free(addr) {
                        tracing::error!("freeing an allocation larger than the device: {e}");
                    }
                    MemError::OutOfMemory { bytes, free: 0, total, bound: String::new() }
                }
                Err(e) => e,
            };
            return Err(match e {
                MemError::OutOfMemory { .. } => err(ErrorKind::OutOfMemory, e.to_string()),
                MemError::Device(m) => err(ErrorKind::Device, m),
            });
        }
        if s.memory_used.saturating_add(bytes) > total {
            return Err(err(
                ErrorKind::OutOfMemory,
                format!(
                    "allocating {bytes} bytes would bring your buffers to {} bytes, more than the device's {total}: \
                     they could never be resident together (you hold {} bytes)",
                    s.memory_used as u128 + bytes as u128,
                    s.memory_used
                ),
            ));
        }
        // The device first; else a buffer born evicted, its room made when
        // its owner next runs; else room made now (core/swap.rs, "Lazy").
        let (addr, evicted) = match self.backend.alloc(bytes) {
            Ok(addr) => (addr, false),
            Err(e @ MemError::OutOfMemory { .. }) => self.place_elsewhere(client, bytes, e)?,
            Err(MemError::Device(m)) => return Err(err(ErrorKind::Device, m)),
        };
        if !evicted {
            self.keep_after_alloc(client, bytes);
        }
        let s = self.session_mut(client)?;
        let id = BufferId(s.next_handle());
        s.buffers.insert(id, Buffer { addr, bytes, evicted, zeros: evicted });
        s.memory_used += bytes;
        Ok(Reply::Buffer(id))
    }

    fn free(&mut self, client: u64, b: BufferId) -> Result<Reply, ErrorReply> {
        let waiting_for = self.client_ops(client);
        let s = self.session_mut(client)?;
        let buf = s
            .buffers
            .remove(&b)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("buffer {} is not yours (or was freed)", b.0)))?;
        s.memory_used -= buf.bytes;
        if buf.evicted {
            // Nothing can touch it (work queued since is gated behind its
            // restore, which no longer includes it): its host copy goes now.
            s.memory_evicted -= buf.bytes;
            self.forget_evicted_bytes(buf.bytes);
            if let Err(e) = self.backend.free(buf.addr) {
                tracing::error!("freeing client {client}'s evicted buffer {}: {e}", b.0);
            }
            return Ok(Reply::Done);
        }
        self.defer(waiting_for, Release::Buffer(buf.addr));
        Ok(Reply::Done)
    }

    /// The client's operations tracked now (what a release must wait for).
    pub(super) fn client_ops(&self, client: u64) -> Vec<OpId> {
        let mut v: Vec<OpId> = self.ops.iter().filter(|(_, e)| e.client == client).map(|(op, _)| *op).collect();
        v.sort_unstable();
        v
    }

    pub(super) fn defer(&mut self, waiting_for: Vec<OpId>, release: Release) {
        self.deferred.push(Deferred { waiting_for, release });
        self.release_ready();
    }

    /// Carries out the deferred releases whose operations have all ended.
    pub(super) fn release_ready(&mut self) {
        // Called at every operation's end: with nothing deferred (the usual
        // case) the partition below still cost ~160 instructions a launch.
        if self.deferred.is_empty() {
            return;
        }
        let ops = &self.ops;
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|d| d.waiting_for.iter().all(|op| !ops.contains_key(op)));
        self.deferred = waiting;
        for d in ready {
            match d.release {
                Release::Buffer(addr) => {
                    if let Err(e) = self.backend.free(addr) {
                        tracing::error!("freeing a buffer: {e}");
                    }
                }
                Release::Region(r) | Release::Host(r) => self.backend.unregister_host(&r),
            }
        }
    }

    /// Checks a module load and starts it on the device; answered when it
    /// is loaded ([`Core::module_loaded`]), while the core serves everyone
    /// else (`Backend::start_load`).
    fn load_module(
        &mut self,
        client: u64,
        id: u64,
        name: String,
        source: String,
        options: Vec<String>,
    ) -> Result<(), ErrorReply> {
        if name.len() > MAX_NAME_BYTES || source.len() > MAX_SOURCE_BYTES || options.len() > MAX_OPTIONS {
            return Err(err(ErrorKind::Invalid, "module name, source or options over the protocol's limits"));
        }
        if options.iter().any(|o| o.len() > MAX_NAME_BYTES) {
            return Err(err(ErrorKind::Invalid, format!("a compile option over {MAX_NAME_BYTES} bytes")));
        }
        // It is logged (`printable_name`).
        let name = gpumux_proto::printable_name(&name);
        self.session(client)?;
        let under_way = self.loads.values().filter(|l| l.client == client).count();
        under_limit(under_way, MAX_LOADS_UNDER_WAY, "module loads of yours are compiling")?;
        let token = self.next_load;
        self.next_load += 1;
        self.backend.start_load(token, &name, &source, &options);
        self.loads.insert(token, PendingLoad { client, id, name, source, options, since: Instant::now() });
        Ok(())
    }

    /// A load of [`Core::load_module`] finished: the module joins its
    /// client's, and the client hears of it. A client gone meanwhile has its
    /// kernels unloaded again.
    pub(super) fn module_loaded(&mut self, token: u64, result: Result<ModuleImage, LoadError>) {
        let Some(load) = self.loads.remove(&token) else {
            tracing::warn!("a module load no one waits for finished (token {token})");
            return;
        };
        let PendingLoad { client, id, name, source, options, since } = load;
        tracing::debug!("client {client}'s module {name} loaded in {:.1} ms", since.elapsed().as_secs_f64() * 1e3);
        let open = self.sessions.get(&client).is_some_and(|s| s.phase == Phase::Open);
        let result = match result {
            Ok(image) if !open => {
                let codes: Vec<_> = image.kernels.iter().map(|k| k.code).collect();
                self.backend.unload_module(&codes);
                return;
            }
            Ok(image) => self.add_module(client, name, source, options, image),
            Err(e) => Err(load_error(&name, e)),
        };
        if open {
            self.reply(client, id, result);
        }
    }

    /// Gives a loaded module's kernels handles in `client`'s session.
    fn add_module(
        &mut self,
        client: u64,
        name: String,
        source: String,
        options: Vec<String>,
        image: ModuleImage,
    ) -> Result<Reply, ErrorReply> {
        let s = self.session_mut(client)?;
        let module = ModuleId(s.next_handle());
        let mut entries = Vec::new();
        let mut handles = Vec::new();
        for k in image.kernels {
            let kid = KernelId(s.next_handle());
            entries.push(KernelEntry { name: k.name.clone(), kernel: kid, param_sizes: k.param_sizes.clone() });
            handles.push(kid);
            s.kernels.insert(kid, k);
        }
        s.modules.insert(module, LoadedModule { name, source, options, kernels: handles });
        Ok(Reply::Module { module, kernels: entries, log: image.log, cached: image.cached })
    }

    /// Checks and submits a launch, split where its kernel asks for it
    /// (`SplitKernel`); an accepted one is not answered.
    fn launch(&mut self, client: u64, l: &gpumux_proto::Launch) -> Result<(), ErrorReply> {
        let split = self.session(client)?.split_kernels.get(&l.kernel).cloned();
        match split {
            Some((sp, written)) => self.launch_split_checked(client, l, &sp, written),
            None => self.launch_whole(client, l),
        }
    }

    /// Checks and submits a launch on this GPU.
    pub(super) fn launch_whole(&mut self, client: u64, l: &gpumux_proto::Launch) -> Result<(), ErrorReply> {
        // Looked up once, for the checks and the description kept (two before).
        let s = self.sessions.get_mut(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))?;
        // The quota first: a client that launches flat out without a sync
        // (issue 36's huge-grids abuser: ~200k launches a second) is refused
        // most of them, and each refusal is one turn of the core's inbox;
        // checked first, it costs a comparison and its reply, not the
        // launch's validation and the kernel's description built for nothing.
        under_queued_ops(s)?;
        let image = s
            .kernels
            .get(&l.kernel)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("kernel {} is not yours", l.kernel.0)))?;
        let c = validate::launch(s, image, self.backend.info(), l)?;
        let shape = KernelShape::new(c.blocks, c.threads, image.regs_per_thread).with_smem_per_block(c.smem);
        let timing = SimTiming::new(c.block_time_ns);
        let same = |d: &KernelDesc| {
            d.name == image.name && d.shape == shape && d.sim_timing.as_ref() == Some(&timing) && !d.idempotent
        };
        // The client's launch before it may share its description (`Session::last_desc`).
        let desc = match &s.last_desc {
            Some(d) if same(d) => Arc::clone(d),
            // A client's kernel may write in place: a dropped block must not rerun.
            _ => Arc::new(KernelDesc::new(image.name.clone(), shape).with_idempotent(false).with_sim_timing(timing)),
        };
        let work = OpWork::Kernel {
            code: image.code,
            grid: l.grid,
            block: l.block,
            shared_bytes: l.shared_bytes,
            params: c.params,
            after: None,
            range: None,
        };
        s.last_desc = Some(Arc::clone(&desc));
        let op = StreamOp::Kernel { desc: Arc::clone(&desc), time_key: self.next_op };
        self.submit_op(client, l.stream, op, Some(work), OpKind::Kernel { desc })?;
        Ok(())
    }

    pub(super) fn submit_copy(
        &mut self,
        client: u64,
        stream: StreamId,
        direction: CopyDirection,
        bytes: u64,
        work: OpWork,
        reply: Option<u64>,
    ) -> Result<(), ErrorReply> {
        self.submit_op(client, stream, StreamOp::Copy { direction, bytes }, Some(work), OpKind::Copy { reply })
            .map(|_| ())
    }

    /// Submits a staging copy's chunk (`CopyToDevice`, `CopyToHost`), request
    /// `id`, answered when done with [`Reply::Copied`] (core/beside.rs).
    fn submit_chunk(
        &mut self,
        client: u64,
        id: u64,
        stream: StreamId,
        direction: CopyDirection,
        bytes: u64,
        work: OpWork,
    ) -> Result<(), ErrorReply> {
        let op = self.submit_op(
            client,
            stream,
            StreamOp::Copy { direction, bytes },
            Some(work),
            OpKind::Copy { reply: Some(id) },
        )?;
        self.note_chunk(client, id, op);
        Ok(())
    }

    /// Submits an operation to a client's stream after the queued-ops check,
    /// binding its work before the engine can start it.
    pub(super) fn submit_op(
        &mut self,
        client: u64,
        stream: StreamId,
        op: StreamOp,
        work: Option<OpWork>,
        kind: OpKind,
    ) -> Result<OpId, ErrorReply> {
        if work.is_some() {
            // Its memory must be on the device before it runs (core/swap.rs).
            self.gate_if_evicted(client, stream);
        }
        // The session and the stream are looked up once, held to the end
        // (only the engine, the backend and the core's own maps are called
        // meanwhile): twice each before (issue 35's callgrind).
        let s = self.sessions.get_mut(&client).ok_or_else(|| err(ErrorKind::Protocol, "unknown client"))?;
        // The stream's refusal comes first, as it always did.
        let quota = under_queued_ops(s);
        let st = s.streams.get_mut(&stream).filter(|st| !st.closing).ok_or_else(|| {
            err(ErrorKind::NoSuchHandle, format!("stream {} is not yours (or was destroyed)", stream.0))
        })?;
        quota?;
        let (slot, priority, last_kernel) = (st.slot, s.priority, st.last_kernel);
        let is_kernel = matches!(op, StreamOp::Kernel { .. });
        // A recorded event or a sync is a marker: it orders nothing on the
        // GPU, so the next kernel still follows the kernel before it (and may
        // be queued behind it: a client that records an event after each
        // kernel, as the bench's low-priority one does, had none of its
        // kernels queued ahead; with them queued, it and every co-run pair
        // did better: docs/history/benchmarks.md, runs 206-207). A copy or memset
        // orders the next kernel after itself.
        let marker = matches!(op, StreamOp::Sync);
        let described = self.record.on().then(|| super::record::describe(&op, work.as_ref(), &kind));
        // One clock read ends the engine's part and starts the bind's (as in
        // `drain_commands`), and the engine's part starts at the operation's
        // device time: three reads for the two parts and that time, not four.
        let t = Instant::now();
        let now = self.backend.now_at(t);
        let submitted = self.engine.submit(now, slot, op);
        let engine_done = Instant::now();
        count_call(&self.calls, |c| &mut c.engine, engine_done.saturating_duration_since(t));
        let id = submitted.map_err(|e| match e {
            EngineError::DoesNotFit(d) => err(ErrorKind::Invalid, d.to_string()),
            other => err(ErrorKind::Invalid, other.to_string()),
        })?;
        self.next_op = id.0 + 1;
        if let Some(d) = described {
            self.record.submitted(id, client, stream, d, now);
        }
        if let Some(mut w) = work {
            if let OpWork::Kernel { after, .. } = &mut w {
                *after = last_kernel;
            }
            self.backend.bind(id, w);
            count_call(&self.calls, |c| &mut c.sends, engine_done.elapsed());
        }
        self.ops.insert(id, OpEntry::queued(client, stream, kind, priority, now, self.request_waited));
        s.in_flight += 1;
        s.last_submit = Some(now);
        st.pending += 1;
        st.last_kernel = match (is_kernel, marker) {
            (true, _) => Some(id),
            (false, true) => st.last_kernel,
            (false, false) => None,
        };
        Ok(id)
    }

    fn create_stream(&mut self, client: u64) -> Result<Reply, ErrorReply> {
        let s = self.session_mut(client)?;
        if s.streams.len() >= s.limits.queued_ops as usize {
            return Err(err(ErrorKind::Quota, "as many streams as your queued-ops limit"));
        }
        self.add_stream(client, client as u32, "").map(Reply::Stream)
    }

    /// A new stream of `client`'s in the engine (as process `pid`, its name
    /// ending in `label`), then the client's weight split again over all its
    /// streams (`reweigh`); no quota checked (`create_stream` checks its own).
    pub(super) fn add_stream(&mut self, client: u64, pid: u32, label: &str) -> Result<StreamId, ErrorReply> {
        let s = self.session_mut(client)?;
        let id = s.next_stream().ok_or_else(|| err(ErrorKind::Quota, "no stream ids left"))?;
        let info = ProcessInfo::new(ProcessId(pid), format!("{}#{client}.{}{label}", s.name, id.0))
            .with_priority(s.priority)
            .with_weight(0.0);
        let slot = self.engine.add_process(info).map_err(|e| err(ErrorKind::Invalid, e.to_string()))?;
        let s = self.session_mut(client)?;
        s.streams.insert(id, Stream { slot, pending: 0, closing: false, last_kernel: None, last_done: 0, error: None });
        self.reweigh(client);
        Ok(id)
    }

    /// Splits a client's weight evenly among its streams again.
    fn reweigh(&mut self, client: u64) {
        let Some(s) = self.sessions.get(&client) else { return };
        let w = s.stream_weight();
        for st in s.streams.values() {
            if let Err(e) = self.engine.set_weight(st.slot, w) {
                tracing::error!("re-weighing client {client}: {e}");
            }
        }
    }

    fn destroy_stream(&mut self, client: u64, stream: StreamId) -> Result<Reply, ErrorReply> {
        if stream == StreamId::DEFAULT {
            return Err(err(ErrorKind::Invalid, "stream 0 lives as long as the connection"));
        }
        let s = self.session_mut(client)?;
        let st = s
            .streams
            .get_mut(&stream)
            .filter(|st| !st.closing)
            .ok_or_else(|| err(ErrorKind::NoSuchHandle, format!("stream {} is not yours", stream.0)))?;
        st.closing = true;
        self.close_stream_if_idle(client, stream);
        Ok(Reply::Done)
    }

    pub(super) fn close_stream_if_idle(&mut self, client: u64, stream: StreamId) {
        let Some(s) = self.sessions.get_mut(&client) else { return };
        let Some(st) = s.streams.get(&stream) else { return };
        if !st.closing || st.pending > 0 {
            return;
        }
        let slot = st.slot;
        s.streams.remove(&stream);
        if let Err(e) = self.engine.remove_process(self.backend.now(), slot) {
            tracing::error!("removing client {client}'s stream {}: {e}", stream.0);
        }
        self.reweigh(client);
    }

    fn record_event(&mut self, client: u64, stream: StreamId) -> Result<Reply, ErrorReply> {
        let e = EventId(self.session_mut(client)?.next_handle());
        let op = self.submit_op(client, stream, StreamOp::Sync, None, OpKind::Event(e))?;
        self.session_mut(client)?.events.insert(e, EventState { op: Some(op), waiters: Vec::new(), ended_at: None });
        Ok(Reply::Event(e))
    }
}

/// Refuses one more of `under_way` things a client has under way (`what`)
/// once it has `most` (`MAX_LOADS_UNDER_WAY`, `MAX_PINS_UNDER_WAY`).
/// Whether `s` may queue one more operation (its `queued_ops` limit).
fn under_queued_ops(s: &Session) -> Result<(), ErrorReply> {
    if s.in_flight < s.limits.queued_ops {
        return Ok(());
    }
    Err(err(
        ErrorKind::Quota,
        format!("{} operations queued or running, your limit is {}: sync first", s.in_flight, s.limits.queued_ops),
    ))
}

fn under_limit(under_way: usize, most: usize, what: &str) -> Result<(), ErrorReply> {
    if under_way < most {
        return Ok(());
    }
    Err(err(
        ErrorKind::Quota,
        format!("{under_way} {what}, the most a client may have at once is {most}: wait for their answers"),
    ))
}

fn check_priority(limits: &ClientLimits, p: i32) -> Result<(), ErrorReply> {
    if p > limits.max_priority {
        return Err(err(
            ErrorKind::NotPermitted,
            format!("priority {p} is over your limit of {}", limits.max_priority),
        ));
    }
    Ok(())
}

fn check_weight(limits: &ClientLimits, w: f64) -> Result<(), ErrorReply> {
    if !(w.is_finite() && w > 0.0) {
        return Err(err(ErrorKind::Invalid, format!("a weight must be a number > 0, not {w}")));
    }
    if w > limits.max_weight {
        return Err(err(ErrorKind::NotPermitted, format!("weight {w} is over your limit of {}", limits.max_weight)));
    }
    Ok(())
}

pub(super) fn no_event(e: EventId) -> ErrorReply {
    err(ErrorKind::NoSuchHandle, format!("event {} is not yours (or was destroyed)", e.0))
}

fn load_error(name: &str, e: LoadError) -> ErrorReply {
    match e {
        LoadError::Transform { line, message } => err(ErrorKind::Transform { line }, format!("{name}: {message}")),
        LoadError::Compile { log } => err(ErrorKind::Compile, format!("{name} does not compile:\n{log}")),
        LoadError::Device(m) => err(ErrorKind::Device, m),
    }
}

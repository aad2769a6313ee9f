//! The device process: what `gpumuxd --device-host SPEC --host-fd N` runs,
//! started by the daemon ([`crate::backend::remote`]), never by hand.
//!
//! It opens the device in-process and serves it over the socket it
//! inherited as descriptor N, in lockstep with the daemon: it carries out
//! each message in the order sent (calls, bindings, commands, polls) and
//! sends only answers. It never polls or advances its device on its own:
//! the device must see `submit`s and `poll`s in exactly the order the
//! daemon's core makes them, as it would in-process (the engine's device
//! contract relies on it; [`crate::backend::remote`] has the race that
//! polling on its own caused). Between messages it sleeps on the socket.
//!
//! A failure of a command (or of a binding) is kept and is the answer to the
//! next `Poll`. After the device reports a lost context it touches the
//! device no more (a faulted CUDA process cannot recover) and waits to be
//! killed. It exits when the daemon closes its end.
//!
//! A `PollHeld` is a poll that waits for news while the device is busy
//! (`hold`): still only inside the message's handling, so lockstep holds,
//! and it ends as soon as the daemon sends anything else.
//!
//! **Between messages** (`device_host/between.rs`; `GPUMUX_DEEPEN_BETWEEN=0`
//! turns it off), it looks at its device's runs of kernels queued natively
//! when an end landed, after a message and while no message waits: their
//! ends seen from host memory, the runs on by a few kernels. No event and no
//! answer: the device still sees commands and polls in the daemon's order,
//! launches end only at polls, and the ends a look saw go with the next
//! poll's answer.
//!
//! A `Retire` (unless the daemon's `GPUMUX_RETIRE_ANSWERED=0`) is an answered
//! launch command and its operation's unbind at once: the device drops what it kept
//! of the kernel it had seen end ([`Backend::retire_answered`]), with no
//! launch and no event; counted, and the count logged at close.

mod between;
mod hold;

use crate::backend::ends_ahead::Silenced;
use crate::backend::exchange_clock::{self, mono_ns, HostClock};
use crate::backend::link::{self, Link, LinkError};
use crate::backend::wire::{FromDevice, RegionId, SwapCall, ToDevice};
use crate::backend::{Backend, Failure, MemError, Moved, Registered, Wake};
use crate::load::LoadClock;
use crate::shm::ShmRegion;
use anyhow::{bail, Context, Result};
use between::Between;
pub use between::{DEEPEN_BETWEEN_VAR, LOOK_POSTS};
use gpumux_engine::device::{Command, DeviceError};
use hold::{Ended, HoldClock};
use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// What the load clock counts: launch commands, launch commands the daemon
/// answered itself, the other commands (grows, retreats, copies), polls,
/// binds and unbinds of operations, and the rest (`exchange_clock::HOST_PARTS`,
/// also what each poll's answer accounts for).
const LOAD_PARTS: [&str; exchange_clock::HOST_PARTS.len()] = exchange_clock::HOST_PARTS;

/// How long the device process waits for the daemon to offer the link's
/// rings (sent right after the daemon starts it).
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves device `spec` over the inherited socket `fd` until the daemon lets
/// go. `Ok(false)`: the device could not be opened, and the daemon was told
/// why (it reports it; the process should just exit with a failure).
pub fn serve(spec: &str, fd: RawFd) -> Result<bool> {
    // Ctrl-C in a terminal (and a service manager's stop) signal the whole
    // process group: the daemon stops its device process itself, after
    // telling its clients, so the device must not die first.
    // SAFETY: setting signal dispositions to "ignore" at start-up, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    let mut link = Link::accept(inherited_socket(fd)?, SETUP_TIMEOUT).context("the device link")?;
    let backend = match crate::daemon::open_in_process(spec) {
        Ok(b) => b,
        Err(e) => {
            link.send(&FromDevice::Unavailable { message: format!("{e:#}") }, None)
                .with_context(|| format!("telling the daemon the device is unavailable ({e:#})"))?;
            return Ok(false);
        }
    };
    let mut backend = backend;
    // The daemon answers launches of kernels that ended ahead itself (`backend::ends_ahead`).
    backend.report_ends_ahead();
    let ready = FromDevice::Ready {
        describe: backend.describe(),
        info: backend.info().clone(),
        frees_retreats_at_once: backend.frees_retreats_at_once(),
        compute_capability: backend.compute_capability(),
        swap_granularity: backend.swap_granularity(),
    };
    link.send(&ready, None).context("telling the daemon the device is ready")?;
    let spin = crate::spin::window(link::SPIN);
    // Read once, at start (issue 35's A/B: both sides from one build).
    let between =
        between::where_from(std::env::var(DEEPEN_BETWEEN_VAR).ok().as_deref()).map(|at| Between::new(at, LOOK_POSTS));
    if let Some(b) = &between {
        let at = if b.at == between::Where::Always { "after each message and while idle" } else { "while idle" };
        tracing::info!(
            "device process: runs go on between messages ({DEEPEN_BETWEEN_VAR}: {at}), at most {LOOK_POSTS} \
             kernels queued a look"
        );
    }
    let mut host = DeviceHost {
        backend,
        link,
        regions: HashMap::new(),
        pinning: HashMap::new(),
        registered: Vec::new(),
        moved: Vec::new(),
        failure: None,
        broken: false,
        spin,
        load: LoadClock::new(&LOAD_PARTS),
        silenced: Silenced::default(),
        clock: HostClock::default(),
        poll_read: 0,
        polls: 0,
        holds: HoldClock::default(),
        submitted: 0,
        between,
        retired: 0,
    };
    let ran = host.run();
    // This process's stage stamps, if on (issue 35).
    gpumux_stamps::flush_or_say();
    ran?;
    Ok(true)
}

/// Takes the descriptor the daemon passed, after checking it is a socket.
fn inherited_socket(fd: RawFd) -> Result<OwnedFd> {
    // SAFETY: fstat fills a zeroed stat; a bad descriptor is an error, not UB.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        bail!("--host-fd {fd}: {}", std::io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        bail!("--host-fd {fd} is not a socket (the daemon starts the device process itself)");
    }
    // SAFETY: the daemon made this descriptor for us alone; it is open (fstat above).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The device and what the daemon told us about it.
struct DeviceHost {
    backend: Box<dyn Backend>,
    link: Link,
    regions: HashMap<RegionId, Arc<ShmRegion>>,
    /// Regions being pinned ([`ToDevice::StartRegister`]), by token.
    pinning: HashMap<u64, (RegionId, Arc<ShmRegion>)>,
    /// Pins that failed before they started, for the next poll.
    registered: Vec<Registered>,
    /// Buffer moves the device made in the call, for the next poll.
    moved: Vec<Moved>,
    /// A failure since the last poll, the answer to the next one.
    failure: Option<Failure>,
    /// The context is lost: nothing more is done with the device.
    broken: bool,
    /// How long to poll the link after each message (`ToDevice::Spin`).
    spin: Duration,
    /// Where this process's time goes (logged when the daemon lets go).
    load: LoadClock,
    /// Launches the daemon answered itself ([`crate::backend::ends_ahead`]).
    silenced: Silenced,
    /// What it did since its last poll's answer, sent with the next ([`exchange_clock`]).
    clock: HostClock,
    /// When the poll being answered was read ([`mono_ns`]).
    poll_read: u64,
    /// Polls received, numbering the exchanges' stage stamps as the daemon's
    /// side does (`gpumux_stamps`).
    polls: u64,
    /// How the held polls ended ([`hold`]).
    holds: HoldClock,
    /// When the last command was handled ([`mono_ns`]; a hold's pace, [`hold::poll_due`]).
    submitted: u64,
    /// Looks between messages, if asked ([`between`]).
    between: Option<Between>,
    /// Answered launches retired with their unbind ([`ToDevice::Retire`]).
    retired: u64,
}

impl DeviceHost {
    /// Carries out the daemon's messages in order; polls the socket for a
    /// while after each (the next poll comes within µs while work is in
    /// flight: [`link::SPIN`]), then sleeps on it.
    fn run(&mut self) -> Result<()> {
        loop {
            let got = match self.between.as_mut() {
                None => self.link.recv_spin::<ToDevice>(self.spin),
                Some(between) => {
                    let (backend, clock, load) = (&mut self.backend, &mut self.clock, &mut self.load);
                    let (broken, failure) = (&mut self.broken, &mut self.failure);
                    self.link.recv_spin_between::<ToDevice>(self.spin, || {
                        between.look(backend.as_mut(), clock, load, broken, failure)
                    })
                }
            };
            match got {
                Ok(Some(msg)) => {
                    use exchange_clock as x;
                    let kind = match msg {
                        ToDevice::Submit(Command::Launch { .. }) => x::HOST_LAUNCHES,
                        ToDevice::SubmitAnswered(_) => x::HOST_ANSWERED,
                        ToDevice::Retire { .. } => x::HOST_RETIRED,
                        ToDevice::Submit(_) => x::HOST_COMMANDS,
                        ToDevice::Poll | ToDevice::PollHeld { .. } => x::HOST_POLLS,
                        ToDevice::Bind { .. } => x::HOST_BINDS,
                        ToDevice::Unbind { .. } => x::HOST_UNBINDS,
                        _ => x::HOST_OTHER,
                    };
                    let began = mono_ns();
                    self.poll_read = began;
                    self.handle(msg)?;
                    let ended = mono_ns();
                    // A poll's own time goes with the next answer: its
                    // answer says when it was read and ready.
                    self.clock.did(kind, began, ended);
                    self.load.add(kind, 1, Duration::from_nanos(ended.saturating_sub(began)));
                    // A busy link is no reason for the runs to wait ([`between`]).
                    if let Some(between) = self.between.as_mut() {
                        let (backend, clock, load) = (self.backend.as_mut(), &mut self.clock, &mut self.load);
                        between.after_message(ended, backend, clock, load, &mut self.broken, &mut self.failure);
                    }
                    if let Some(lap) = self.load.lap() {
                        tracing::debug!(target: "gpumuxd::load", "device process: {lap}");
                    }
                }
                Ok(None) => {
                    self.clock.slept();
                    self.link.wait_readable(None).context("waiting for the daemon")?
                }
                Err(LinkError::Closed) => {
                    if let Some(load) = self.load.summary() {
                        tracing::info!("device process: {load}");
                    }
                    if let Some(holds) = self.holds.summary() {
                        tracing::info!("device process: {holds}");
                    }
                    if let Some(between) = &self.between {
                        tracing::info!("device process: {}", between.summary());
                    }
                    if self.retired > 0 {
                        tracing::info!(
                            "device process: {} answered launches retired with their unbind, no launch made",
                            self.retired
                        );
                    }
                    return Ok(());
                }
                Err(e) => return Err(e).context("reading the daemon's messages"),
            }
        }
    }

    /// One poll of the device, as the daemon's core would make it
    /// in-process; held up to `hold` while the device is busy and has no news
    /// ([`hold`]): polled again and again until it has, the daemon sends
    /// another message, or nothing can come before the hold's end.
    fn poll(&mut self, hold: Duration) -> FromDevice {
        if let Some(f) = self.failure.take() {
            return failure_message(f);
        }
        let mut events = Vec::new();
        if self.broken {
            // Reported already; the daemon is about to replace this process.
            let (failed, loaded, registered, ends_ahead) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let moved = Vec::new();
            let times = self.clock.answer(self.poll_read, 0);
            return FromDevice::Polled {
                events,
                failed,
                loaded,
                registered,
                moved,
                ends_ahead,
                wake: Wake::Idle,
                times,
            };
        }
        let (mut failed, mut loaded, mut ends_ahead) = (Vec::new(), Vec::new(), Vec::new());
        let mut registered = Vec::new();
        let mut moved = std::mem::take(&mut self.moved);
        let deadline = self.poll_read.saturating_add(hold.as_nanos() as u64);
        let mut looks = 0u32;
        let wake = loop {
            let polled = mono_ns();
            if let Err(f) = self.backend.poll(&mut events) {
                self.broken = true;
                return failure_message(f);
            }
            if let Err(what) = self.silenced.filter(&mut events) {
                self.broken = true;
                return FromDevice::Fatal { what };
            }
            self.backend.take_failed(&mut failed);
            self.backend.take_loaded(&mut loaded);
            self.backend.take_ends_ahead(&mut ends_ahead);
            registered.append(&mut self.take_registered());
            self.backend.take_moved(&mut moved);
            let wake = self.backend.next_wake();
            if hold.is_zero() {
                break wake;
            }
            let news = !(events.is_empty()
                && failed.is_empty()
                && loaded.is_empty()
                && ends_ahead.is_empty()
                && registered.is_empty()
                && moved.is_empty());
            let now = mono_ns();
            let ended = if news {
                Err(Ended::News)
            } else if !matches!(self.link.has_message(), Ok(false)) {
                // A message (or the link's failure, which the next read reports).
                Err(Ended::Message)
            } else {
                hold::keep_holding(wake, now, deadline)
            };
            if let Err(how) = ended {
                self.holds.ended(how, now.saturating_sub(self.poll_read));
                break wake;
            }
            // Until the device's next poll is due (`hold::PACE`), the link alone.
            let message = loop {
                looks = looks.wrapping_add(1);
                gpumux_ring::relax(looks);
                let now = mono_ns();
                let landed = self.backend.run_end_landed();
                if hold::poll_due_watching(now, polled, self.submitted, landed) || now >= deadline {
                    break false;
                }
                if !matches!(self.link.has_message(), Ok(false)) {
                    break true;
                }
            };
            if message {
                self.holds.ended(Ended::Message, mono_ns().saturating_sub(self.poll_read));
                break wake;
            }
        };
        // The ends this poll saw (issue 35's stage stamps).
        if gpumux_stamps::on() {
            for e in &events {
                if let gpumux_engine::device::Event::LaunchEnded { launch, .. } = e {
                    gpumux_stamps::stamp(gpumux_stamps::Stage::EndSeen, launch.0, 0);
                }
            }
            for e in &ends_ahead {
                gpumux_stamps::stamp(gpumux_stamps::Stage::EndSeenAhead, e.op.0, 0);
            }
        }
        let device_poll_ns = mono_ns().saturating_sub(self.poll_read);
        let times = self.clock.answer(self.poll_read, device_poll_ns);
        FromDevice::Polled { events, failed, loaded, registered, moved, ends_ahead, wake, times }
    }

    fn send(&mut self, msg: FromDevice) -> Result<()> {
        match self.link.send(&msg, None) {
            // The daemon is gone: the next read ends the loop.
            Ok(()) | Err(LinkError::Closed) => Ok(()),
            Err(e) => Err(e).context("writing to the daemon"),
        }
    }

    /// Keeps a device failure for the next poll; after it the device is left alone.
    fn failed(&mut self, f: Failure) {
        self.broken = true;
        self.failure.get_or_insert(f);
    }

    fn handle(&mut self, msg: ToDevice) -> Result<()> {
        match msg {
            ToDevice::Poll => {
                self.polls += 1;
                let key = (u64::from(std::process::id()) << 40) | self.polls;
                gpumux_stamps::at(self.poll_read, gpumux_stamps::Stage::HostPoll, key, 0);
                let r = self.poll(Duration::ZERO);
                let sent = self.send(r);
                gpumux_stamps::stamp(gpumux_stamps::Stage::HostAnswer, key, 0);
                sent
            }
            ToDevice::PollHeld { us } => {
                self.polls += 1;
                let key = (u64::from(std::process::id()) << 40) | self.polls;
                gpumux_stamps::at(self.poll_read, gpumux_stamps::Stage::HostPoll, key, 0);
                let r = self.poll(Duration::from_micros(u64::from(us)));
                let sent = self.send(r);
                gpumux_stamps::stamp(gpumux_stamps::Stage::HostAnswer, key, 0);
                sent
            }
            // Read: the hold it was meant to end is over.
            ToDevice::EndHold => Ok(()),
            ToDevice::Spin { us } => {
                self.spin = if us == 0 { crate::spin::window(link::SPIN) } else { Duration::from_micros(us) };
                Ok(())
            }
            ToDevice::Alloc { bytes } => {
                let r = self.backend.alloc(bytes);
                self.send(FromDevice::Alloc(r))
            }
            ToDevice::Free { addr } => {
                let r = self.backend.free(addr);
                self.send(FromDevice::Free(r))
            }
            ToDevice::MemInfo => {
                let r = self.backend.mem_info();
                self.send(FromDevice::MemInfo(r))
            }
            ToDevice::Swap(call) => {
                let r = match call {
                    SwapCall::Reserve(bytes) => self.backend.reserve(bytes),
                    SwapCall::Evict(addr) => self.backend.evict(addr),
                    SwapCall::Restore(addr) => self.backend.restore(addr),
                    SwapCall::Readdress(addr) => self.backend.readdress_evicted(addr),
                };
                self.send(FromDevice::Swapped(r))
            }
            ToDevice::StartMove { token, what } => {
                if let Some(result) = self.backend.start_move(token, what) {
                    self.moved.push(Moved { token, result });
                }
                Ok(())
            }
            ToDevice::SettleMoves => {
                let mut moved = std::mem::take(&mut self.moved);
                self.backend.settle_moves(&mut moved);
                self.send(FromDevice::Settled(moved))
            }
            ToDevice::RegisterHost { region, bytes } => {
                let r = self.register(region, bytes);
                self.send(FromDevice::Registered(r))
            }
            ToDevice::StartRegister { token, region, bytes } => {
                match self.map(bytes) {
                    Ok(mapped) => {
                        self.backend.start_register(token, &mapped);
                        self.pinning.insert(token, (region, mapped));
                    }
                    Err(e) => self.registered.push(Registered { token, result: Err(e) }),
                }
                Ok(())
            }
            ToDevice::UnregisterHost { region } => {
                if let Some(r) = self.regions.remove(&region) {
                    self.backend.unregister_host(&r);
                }
                Ok(())
            }
            ToDevice::LoadModule { name, source, options } => {
                let r = self.backend.load_module(&name, &source, &options);
                self.send(FromDevice::Module(r))
            }
            ToDevice::StartLoad { token, name, source, options } => {
                self.backend.start_load(token, &name, &source, &options);
                Ok(())
            }
            ToDevice::Bind { op, work } => {
                gpumux_stamps::at(self.poll_read, gpumux_stamps::Stage::HostBind, op.0, 0);
                let work = work.map_spans(|span| match self.regions.get(&span.region) {
                    Some(region) => Ok(crate::backend::HostSpan { region: region.clone(), offset: span.offset }),
                    None => Err(span.region),
                });
                match work {
                    Ok(work) => self.backend.bind(op, work),
                    Err(region) => {
                        // The daemon registers a region before it names it: a bug.
                        let what = format!("operation {op} names shared region {} that was never registered", region.0);
                        self.failed(Failure::Fatal(DeviceError::backend("the device process", what)));
                    }
                }
                Ok(())
            }
            ToDevice::Unbind { op } => {
                self.backend.unbind(op);
                Ok(())
            }
            ToDevice::UnloadModule { kernels } => {
                self.backend.unload_module(&kernels);
                Ok(())
            }
            ToDevice::Submit(command) => {
                if let Command::Launch { launch, op, .. } = &command {
                    gpumux_stamps::at(self.poll_read, gpumux_stamps::Stage::HostLaunch, op.0, launch.0);
                }
                // When it was read (no clock read of its own: `run` read one just before).
                self.submitted = self.poll_read;
                if self.broken {
                    return Ok(());
                }
                if let Err(f) = self.backend.submit(command) {
                    self.failed(f);
                }
                Ok(())
            }
            ToDevice::SubmitAnswered(command) => {
                self.submitted = self.poll_read;
                if self.broken {
                    return Ok(());
                }
                if let Command::Launch { launch, op, .. } = &command {
                    gpumux_stamps::at(self.poll_read, gpumux_stamps::Stage::HostLaunch, op.0, launch.0);
                    self.silenced.add(*launch);
                }
                if let Err(f) = self.backend.submit_answered(command) {
                    self.failed(f);
                }
                Ok(())
            }
            ToDevice::Retire { launch, op } => {
                // As `SubmitAnswered` and `Unbind` both, less the launch: nothing to silence.
                gpumux_stamps::at(self.poll_read, gpumux_stamps::Stage::HostLaunch, op.0, launch.0);
                self.submitted = self.poll_read;
                self.retired += 1;
                if self.broken {
                    // Left as it is (an `Unbind` would still go to the device,
                    // and a `SubmitAnswered` not): the failure answers the next
                    // poll, and the daemon replaces this process or stops.
                    return Ok(());
                }
                if let Err(f) = self.backend.retire_answered(launch, op) {
                    self.failed(f);
                }
                Ok(())
            }
            ToDevice::ReadPiece { addr, offset, bytes, region, at } => {
                let r = self.piece(region, at, bytes, |b, span| b.read_piece(addr, offset, span));
                self.send(FromDevice::Piece(r))
            }
            ToDevice::WritePiece { addr, offset, bytes, region, at } => {
                let r = self.piece(region, at, bytes, |b, span| b.write_piece(addr, offset, span));
                self.send(FromDevice::Piece(r))
            }
        }
    }

    /// One piece of a moving client's bytes ([`crate::backend::pieces`]) or
    /// a split's: `copy` between the device and `bytes` bytes of `region`
    /// from `at`.
    fn piece(
        &mut self,
        region: RegionId,
        at: u64,
        bytes: u64,
        copy: impl FnOnce(&mut dyn Backend, &mut [u8]) -> Option<Result<(), MemError>>,
    ) -> Result<(), MemError> {
        if self.broken {
            return Err(MemError::Device("the device failed; it is being restarted".into()));
        }
        let r = self
            .regions
            .get(&region)
            .cloned()
            .ok_or_else(|| MemError::Device(format!("staging region {} was never registered (a bug)", region.0)))?;
        let span = crate::backend::pieces::region_span(&r, at, bytes)?;
        copy(self.backend.as_mut(), span).unwrap_or_else(|| {
            Err(MemError::Device(format!("{} cannot read or write buffers at once", self.backend.describe())))
        })
    }

    /// Maps the memfd that came with `RegisterHost` and registers it with the device.
    fn register(&mut self, region: RegionId, bytes: u64) -> Result<(), MemError> {
        let mapped = self.map(bytes)?;
        self.backend.register_host(&mapped)?;
        self.regions.insert(region, mapped);
        Ok(())
    }

    /// Maps the memfd that came with the message being handled.
    fn map(&mut self, bytes: u64) -> Result<Arc<ShmRegion>, MemError> {
        let fd =
            self.link.take_fd().ok_or_else(|| MemError::Device("the shared region came without its memfd".into()))?;
        Ok(Arc::new(ShmRegion::map(fd, bytes).map_err(|e| MemError::Device(e.to_string()))?))
    }

    /// The pins that finished: a region pinned joins `regions` under its number.
    fn take_registered(&mut self) -> Vec<Registered> {
        let mut done = std::mem::take(&mut self.registered);
        self.backend.take_registered(&mut done);
        for r in &done {
            if let Some((region, mapped)) = self.pinning.remove(&r.token) {
                if r.result.is_ok() {
                    self.regions.insert(region, mapped);
                }
            }
        }
        done
    }
}

/// A failure as the answer to a poll.
fn failure_message(f: Failure) -> FromDevice {
    match f {
        Failure::ContextLost { suspects, what } => FromDevice::ContextLost { suspects, what },
        Failure::Fatal(e) => FromDevice::Fatal { what: format!("{:#}", anyhow::Error::new(e)) },
    }
}

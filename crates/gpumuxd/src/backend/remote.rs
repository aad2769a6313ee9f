//! The device in a child process (docs/daemon.md, "Isolation and faults").
//!
//! A GPU fault poisons the whole CUDA process, not only its context: no new
//! context can be made in it. So the daemon keeps the device in a child,
//! `gpumuxd --device-host SPEC --host-fd N` ([`crate::device_host`]), and
//! talks to it over a `socketpair` ([`super::wire`] messages). After a fault,
//! [`RemoteBackend::rebuild`] kills the child and starts a fresh one; the
//! core's recovery then allocates and loads again through it.
//!
//! A child that dies on its own (a crash, `kill -9`) is a lost context too,
//! noticed at the next call (the core polls at least once a second): every
//! operation on the device is a suspect, and the daemon restarts it.
//!
//! Reports, not questions: the child carries out every message in the
//! order sent and, while its device has work, polls it on its own and
//! reports what it finds ([`crate::device_host`]). [`Backend::submit`]
//! sends the command without waiting; [`Backend::poll`] takes the reports
//! that have come (a read of the ring). So the core decides and answers
//! clients while the child makes the CUDA calls of the commands before, and
//! a launch's end comes as soon as the child sees it. (Before, the core
//! asked with a `Poll` and waited for the answer: the two took turns, and
//! with several clients each answer waited behind every command sent before
//! it, which bounded the launch rate: docs/benchmarks.md, runs 103-105.)
//!
//! The engine's device contract (`gpumux_engine::device`) holds what it last
//! sent as true until events say otherwise, and wants every SM of a launch
//! released before its end. A report crossing a command on the link opens
//! one race, which the child and this module close together: a `Grow` sent
//! while a report with that launch's `LaunchEnded` is on its way. (A child
//! that polled on its own, without what follows, met it on an H100 with
//! `spatial-even`: the device saw launch 3 end while the engine, not yet
//! having read it, grew launch 3 onto SMs 33-43; it then read the end with
//! launch 3 still holding them, and the daemon stopped.) Each report says
//! how many commands the child had carried out when it polled. The child
//! ignores a `Grow` or `Retreat` of a launch whose end it has reported, and
//! here, reading that end, every SM of a `Grow` sent after the commands the
//! report covers is released (`SmReleased`, exhausted) just before it:
//! exactly the grows the child ignores. A `Retreat` after the end needs
//! nothing: its SMs are released by the end or by those releases. Grows
//! the report covers the child took (or, for a launch it found ended
//! before its report, released itself before the end).
//!
//! Time: the engine sees this process's clock (ns since the backend opened,
//! monotonic across restarts); the child's device has its own. Events are
//! stamped when their poll's answer is read here, which is how late the
//! engine learns of them anyway.

use super::link::{socket_pair, Link, LinkError};
use super::wire::{FromDevice, HostRef, RegionId, ToDevice};
use super::{Backend, DevAddr, Failure, KernelCode, LoadError, MemError, MemInfo, ModuleImage, OpWork, Wake};
use crate::shm::ShmRegion;
use gpumux_engine::device::ReleaseCause;
use gpumux_engine::device::{Command, DeviceError, Event};
use gpumux_engine::ids::{CopyId, LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a device process may take to open its device (CUDA's first
/// initialisation on a large machine takes seconds, rarely tens).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a call may take (a module's compile is the longest) before the
/// device process is taken for hung and killed.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest the core sleeps while the child has work on its device
/// (the child reports when it has news; its death it cannot).
const BUSY_LOOK: Duration = Duration::from_millis(20);
/// How long a device process that closed its end may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Why a device process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The executable could not be run.
    #[error("cannot start the device process `{exe}`: {source}")]
    Spawn {
        /// What was run.
        exe: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The socket pair could not be made.
    #[error("cannot make the device process's socket: {0}")]
    Socket(std::io::Error),
    /// The link's rings could not be made or offered.
    #[error("cannot set up the device process's link: {0}")]
    Link(LinkError),
    /// The child could not open the device (its message names the device).
    #[error("{message}")]
    Unavailable {
        /// The device.
        spec: String,
        /// The child's words.
        message: String,
    },
    /// The child died before it said it was ready.
    #[error("the device process for {spec} exited before it was ready ({status}); its log is above")]
    Died {
        /// The device.
        spec: String,
        /// How it ended.
        status: String,
    },
    /// The child said nothing for too long.
    #[error("the device process for {spec} was not ready after {}s; it was killed", timeout.as_secs())]
    Timeout {
        /// The device.
        spec: String,
        /// How long it had.
        timeout: Duration,
    },
    /// The child said something else than hello.
    #[error("the device process for {spec} broke the protocol: {what}")]
    Protocol {
        /// The device.
        spec: String,
        /// What it did.
        what: String,
    },
}

/// One running device process and its end of the link.
struct DeviceProcess {
    child: Child,
    link: Link,
    describe: String,
    info: DeviceInfo,
}

impl DeviceProcess {
    /// Starts `exe --device-host spec --host-fd N` and waits for it to be ready.
    fn start(exe: &Path, spec: &str) -> Result<DeviceProcess, StartError> {
        let (ours, theirs) = socket_pair().map_err(StartError::Socket)?;
        let fd = theirs.as_raw_fd();
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("--device-host").arg(spec).arg("--host-fd").arg(fd.to_string());
        if crate::spin::get() != 0 {
            cmd.arg("--spin-us").arg(crate::spin::get().to_string());
        }
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        // SAFETY: between fork and exec only async-signal-safe calls: fcntl
        // and prctl on values computed before the fork.
        unsafe {
            cmd.pre_exec(move || {
                // The child's end crosses exec (both ends are close-on-exec in the daemon).
                if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The device must not outlive the daemon (the signal follows the
                // forking thread: the main thread at start-up, the core thread
                // after a restart; both live as long as the daemon serves).
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| StartError::Spawn { exe: exe.to_path_buf(), source })?;
        // Only the child holds its end now: its exit closes the link.
        drop(theirs);
        let mut link = match Link::connect(ours) {
            Ok(link) => link,
            Err(e) => {
                kill(&mut child);
                return Err(StartError::Link(e));
            }
        };
        let spec = spec.to_string();
        match link.recv_timeout::<FromDevice>(READY_TIMEOUT) {
            Ok(Some(FromDevice::Ready { describe, info })) => Ok(DeviceProcess { child, link, describe, info }),
            Ok(Some(FromDevice::Unavailable { message })) => {
                reap(&mut child);
                Err(StartError::Unavailable { spec, message })
            }
            Ok(Some(other)) => {
                kill(&mut child);
                Err(StartError::Protocol { spec, what: format!("{} before Ready", other.name()) })
            }
            Ok(None) => {
                kill(&mut child);
                Err(StartError::Timeout { spec, timeout: READY_TIMEOUT })
            }
            Err(LinkError::Closed) => Err(StartError::Died { spec, status: reap(&mut child) }),
            Err(e) => {
                kill(&mut child);
                Err(StartError::Protocol { spec, what: e.to_string() })
            }
        }
    }
}

/// Waits for a child that closed its end of the link to exit (killing it if
/// it does not), and says how it ended.
fn reap(child: &mut Child) -> String {
    let deadline = Instant::now() + EXIT_GRACE;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return exit_words(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => return format!("{}; it was killed", kill(child)),
            Err(e) => return format!("its status is unknown: {e}"),
        }
    }
}

/// SIGKILL and reap; says how it ended.
fn kill(child: &mut Child) -> String {
    if let Err(e) = child.kill() {
        tracing::debug!("killing device process {}: {e}", child.id());
    }
    match child.wait() {
        Ok(status) => exit_words(status),
        Err(e) => format!("its status is unknown: {e}"),
    }
}

fn exit_words(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => status.to_string(),
    }
}

/// Operations on the device now: what a dead device process takes with it.
#[derive(Debug, Default)]
struct InFlight {
    launches: HashMap<LaunchId, OpId>,
    copies: HashMap<CopyId, OpId>,
}

impl InFlight {
    fn command(&mut self, c: &Command) {
        match c {
            Command::Launch { launch, op, .. } => {
                self.launches.insert(*launch, *op);
            }
            Command::Copy { copy, op, .. } => {
                self.copies.insert(*copy, *op);
            }
            Command::Grow { .. } | Command::Retreat { .. } => {}
        }
    }

    fn event(&mut self, e: &Event) {
        match e {
            Event::LaunchEnded { launch, .. } => {
                self.launches.remove(launch);
            }
            Event::CopyDone { copy } => {
                self.copies.remove(copy);
            }
            Event::SmReleased { .. } => {}
        }
    }

    fn ops(&self) -> Vec<OpId> {
        let mut ops: Vec<OpId> = self.launches.values().chain(self.copies.values()).copied().collect();
        ops.sort_unstable();
        ops.dedup();
        ops
    }
}

/// The device behind a child process (module doc).
pub struct RemoteBackend {
    exe: PathBuf,
    spec: String,
    process: DeviceProcess,
    origin: Instant,
    regions: Vec<(RegionId, Arc<ShmRegion>)>,
    next_region: u64,
    in_flight: InFlight,
    /// Commands sent so far (the child carries them out in this order).
    sent: u64,
    /// `Grow`s no report has covered yet: the commands sent up to and
    /// including each, its launch and its SMs (module doc).
    grows: VecDeque<(u64, LaunchId, SmSet)>,
    /// Events of reports read while a call waited for its answer, for the next poll.
    early: Vec<Event>,
    /// The child's device's [`Backend::next_wake`] at its last report
    /// covering every command sent, and when it said so; busy from a
    /// command's sending until such a report.
    wake: (Wake, Instant),
    /// The child's death, or a call's failure, for the next poll.
    failure: Option<Failure>,
    /// The child is dead or its device broken: calls fail until [`Backend::rebuild`].
    broken: Option<String>,
    /// The child's poll window asked for ([`Backend::spin_for`]; sent again to a new child).
    spin: Duration,
    /// Kernels the child loaded for the daemon and was not told to unload
    /// (counted here: asking the child would be a round trip).
    kernels_loaded: usize,
}

impl RemoteBackend {
    /// Starts `exe` (a `gpumuxd`) serving device `spec` and waits until it is ready.
    pub fn start(exe: &Path, spec: &str) -> Result<RemoteBackend, StartError> {
        let process = DeviceProcess::start(exe, spec)?;
        tracing::info!("device {spec} runs in process {}", process.child.id());
        Ok(RemoteBackend {
            exe: exe.to_path_buf(),
            spec: spec.to_string(),
            process,
            origin: Instant::now(),
            regions: Vec::new(),
            next_region: 0,
            in_flight: InFlight::default(),
            sent: 0,
            grows: VecDeque::new(),
            early: Vec::new(),
            wake: (Wake::Idle, Instant::now()),
            failure: None,
            broken: None,
            spin: Duration::ZERO,
            kernels_loaded: 0,
        })
    }

    /// The device process's pid.
    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// The link failed (the child died, or spoke nonsense): the device is lost.
    /// Records the failure for the next poll and returns its words.
    fn lost(&mut self, e: LinkError) -> String {
        let pid = self.process.child.id();
        let what = match e {
            LinkError::Closed => format!("the device process (pid {pid}) died: {}", reap(&mut self.process.child)),
            other => format!("the device process (pid {pid}) was killed: {other}; {}", kill(&mut self.process.child)),
        };
        tracing::error!("{what}");
        self.device_lost(what.clone());
        what
    }

    /// From now on the device is gone: `what` is reported once, with every
    /// operation on it as a suspect.
    fn device_lost(&mut self, what: String) {
        if self.failure.is_none() && self.broken.is_none() {
            self.failure = Some(Failure::ContextLost { suspects: self.in_flight.ops(), what: what.clone() });
        }
        self.broken.get_or_insert(what);
    }

    /// Sends a call and waits for its answer (reports that come first are
    /// kept for the next poll).
    fn call(&mut self, msg: &ToDevice, fd: Option<BorrowedFd<'_>>) -> Result<FromDevice, String> {
        if let Some(why) = &self.broken {
            return Err(format!("the device is lost ({why}); it is being restarted"));
        }
        if let Err(e) = self.process.link.send(msg, fd) {
            return Err(self.lost(e));
        }
        loop {
            match self.process.link.recv_timeout::<FromDevice>(CALL_TIMEOUT) {
                Ok(Some(report)) if report.is_report() => {
                    let mut early = std::mem::take(&mut self.early);
                    self.take_report(report, &mut early);
                    self.early = early;
                }
                Ok(Some(answer)) => return Ok(answer),
                Ok(None) => {
                    let what = format!(
                        "the device process (pid {}) did not answer in {}s: {}",
                        self.process.child.id(),
                        CALL_TIMEOUT.as_secs(),
                        kill(&mut self.process.child)
                    );
                    self.device_lost(what.clone());
                    return Err(what);
                }
                Err(e) => return Err(self.lost(e)),
            }
        }
    }

    /// Takes a report: its events go to `events`, each launch's end after
    /// the releases of the grows the child ignores (module doc); a failure
    /// is kept for [`Backend::poll`].
    fn take_report(&mut self, report: FromDevice, events: &mut Vec<Event>) {
        match report {
            FromDevice::Polled { events: got, wake, applied } => {
                for e in got {
                    if let Event::LaunchEnded { launch, .. } = e {
                        self.release_ignored_grows(launch, applied, events);
                    }
                    self.in_flight.event(&e);
                    events.push(e);
                }
                // The child took these before it polled.
                while self.grows.front().is_some_and(|&(n, _, _)| n <= applied) {
                    self.grows.pop_front();
                }
                // A report that missed commands since says nothing of them.
                if applied >= self.sent {
                    self.wake = (wake, Instant::now());
                }
            }
            FromDevice::ContextLost { suspects, what } => {
                let f = self.device_failed(Failure::ContextLost { suspects, what: what.clone() }, what);
                self.failure.get_or_insert(f);
            }
            FromDevice::Fatal { what } => {
                let f = Failure::Fatal(DeviceError::backend("the device process", what.clone()));
                let f = self.device_failed(f, what);
                self.failure.get_or_insert(f);
            }
            other => {
                let what = Self::unexpected("nothing", &other);
                let kill = kill(&mut self.process.child);
                self.device_lost(format!("{what}; {kill}"));
            }
        }
    }

    /// `launch` ended in the child before it carried out more than `covered`
    /// commands: its grows sent after those are ignored there, so their SMs
    /// are released here, before the end.
    fn release_ignored_grows(&mut self, launch: LaunchId, covered: u64, events: &mut Vec<Event>) {
        self.grows.retain(|(n, l, sms)| {
            if *l != launch || *n <= covered {
                return true;
            }
            events.extend(sms.iter().map(|sm| Event::SmReleased { launch, sm, cause: ReleaseCause::Exhausted }));
            false
        });
    }

    /// The device failed (the answer to a poll): reported now, and calls
    /// fail until [`Backend::rebuild`].
    fn device_failed(&mut self, failure: Failure, what: String) -> Failure {
        self.broken.get_or_insert(what);
        failure
    }

    fn unexpected(asked: &str, got: &FromDevice) -> String {
        format!("the device process answered {} to {asked} (a bug)", got.name())
    }

    /// The region's number in the device process, registering it there first if needed.
    fn region_id(&mut self, region: &Arc<ShmRegion>) -> Result<RegionId, MemError> {
        if let Some((id, _)) = self.regions.iter().find(|(_, r)| Arc::ptr_eq(r, region)) {
            return Ok(*id);
        }
        self.register_host(region)?;
        self.regions
            .iter()
            .find(|(_, r)| Arc::ptr_eq(r, region))
            .map(|(id, _)| *id)
            .ok_or_else(|| MemError::Device("the shared region was not registered with the device process".into()))
    }
}

impl Drop for RemoteBackend {
    /// The daemon stops: the device process sees the link close and exits
    /// (a CUDA context is destroyed cleanly); killed if it takes too long.
    fn drop(&mut self) {
        self.process.link.close();
        reap(&mut self.process.child);
    }
}

impl Backend for RemoteBackend {
    fn describe(&self) -> String {
        self.process.describe.clone()
    }

    fn info(&self) -> &DeviceInfo {
        &self.process.info
    }

    fn mem_info(&mut self) -> Result<MemInfo, MemError> {
        match self.call(&ToDevice::MemInfo, None).map_err(MemError::Device)? {
            FromDevice::MemInfo(r) => r,
            other => Err(MemError::Device(Self::unexpected("MemInfo", &other))),
        }
    }

    fn alloc(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        match self.call(&ToDevice::Alloc { bytes }, None).map_err(MemError::Device)? {
            FromDevice::Alloc(r) => r,
            other => Err(MemError::Device(Self::unexpected("Alloc", &other))),
        }
    }

    fn free(&mut self, addr: DevAddr) -> Result<(), MemError> {
        match self.call(&ToDevice::Free { addr }, None).map_err(MemError::Device)? {
            FromDevice::Free(r) => r,
            other => Err(MemError::Device(Self::unexpected("Free", &other))),
        }
    }

    fn register_host(&mut self, region: &Arc<ShmRegion>) -> Result<(), MemError> {
        if self.regions.iter().any(|(_, r)| Arc::ptr_eq(r, region)) {
            return Ok(());
        }
        let id = RegionId(self.next_region);
        self.next_region += 1;
        let msg = ToDevice::RegisterHost { region: id, bytes: region.len() as u64 };
        match self.call(&msg, Some(region.as_fd())).map_err(MemError::Device)? {
            FromDevice::Registered(r) => r?,
            other => return Err(MemError::Device(Self::unexpected("RegisterHost", &other))),
        }
        self.regions.push((id, region.clone()));
        Ok(())
    }

    fn unregister_host(&mut self, region: &ShmRegion) {
        let Some(i) = self.regions.iter().position(|(_, r)| std::ptr::eq(Arc::as_ptr(r), region)) else { return };
        let (id, _) = self.regions.swap_remove(i);
        if self.broken.is_none() {
            if let Err(e) = self.process.link.send(&ToDevice::UnregisterHost { region: id }, None) {
                self.lost(e);
            }
        }
    }

    fn load_module(&mut self, name: &str, source: &str, options: &[String]) -> Result<ModuleImage, LoadError> {
        let msg = ToDevice::LoadModule { name: name.into(), source: source.into(), options: options.to_vec() };
        let image = match self.call(&msg, None).map_err(LoadError::Device)? {
            FromDevice::Module(r) => r,
            other => Err(LoadError::Device(Self::unexpected("LoadModule", &other))),
        }?;
        self.kernels_loaded += image.kernels.len();
        Ok(image)
    }

    fn unload_module(&mut self, kernels: &[KernelCode]) {
        self.kernels_loaded = self.kernels_loaded.saturating_sub(kernels.len());
        if self.broken.is_none() {
            if let Err(e) = self.process.link.send(&ToDevice::UnloadModule { kernels: kernels.to_vec() }, None) {
                self.lost(e);
            }
        }
    }

    fn kernels_loaded(&self) -> usize {
        self.kernels_loaded
    }

    fn bind(&mut self, op: OpId, work: OpWork) {
        let work =
            work.map_spans(|span| self.region_id(&span.region).map(|region| HostRef { region, offset: span.offset }));
        let work = match work {
            Ok(w) => w,
            Err(e) => {
                // The core registers every region before a copy can name it;
                // the device process reports the unbound operation when it runs.
                tracing::error!("operation {op}: its shared region is unknown to the device process: {e}");
                return;
            }
        };
        if self.broken.is_none() {
            if let Err(e) = self.process.link.send(&ToDevice::Bind { op, work }, None) {
                self.lost(e);
            }
        }
    }

    fn unbind(&mut self, op: OpId) {
        if self.broken.is_none() {
            if let Err(e) = self.process.link.send(&ToDevice::Unbind { op }, None) {
                self.lost(e);
            }
        }
    }

    fn now(&self) -> Nanos {
        Nanos::try_from(self.origin.elapsed().as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn submit(&mut self, command: Command) -> Result<(), Failure> {
        if self.broken.is_some() {
            // Lost already: the failure is reported by the next poll, if not yet.
            return Ok(());
        }
        self.in_flight.command(&command);
        self.sent += 1;
        if let Command::Grow { launch, sms } = &command {
            self.grows.push_back((self.sent, *launch, *sms));
        }
        self.wake = (Wake::Spin, Instant::now());
        if let Err(e) = self.process.link.send(&ToDevice::Submit(command), None) {
            self.lost(e);
            return self.failure.take().map_or(Ok(()), Err);
        }
        Ok(())
    }

    /// Never waits (module doc): the reports that came.
    fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
        let before = events.len();
        events.append(&mut self.early);
        if self.failure.is_some() && events.len() > before {
            return Ok(self.now());
        }
        if let Some(f) = self.failure.take() {
            return Err(f);
        }
        if self.broken.is_some() {
            // Reported already; the core rebuilds.
            return Ok(self.now());
        }
        // Idle, the core looks about once a second: read the socket too,
        // where a child that died says so.
        let idle = matches!(self.wake.0, Wake::Idle);
        while self.failure.is_none() && self.broken.is_none() {
            let got = if idle { self.process.link.try_recv::<FromDevice>() } else { self.process.link.poll_recv() };
            match got {
                Ok(Some(report)) if report.is_report() => self.take_report(report, events),
                Ok(Some(other)) => {
                    let what = Self::unexpected("nothing", &other);
                    let kill = kill(&mut self.process.child);
                    self.device_lost(format!("{what}; {kill}"));
                }
                Ok(None) => break,
                Err(e) => {
                    self.lost(e);
                }
            }
        }
        if events.len() == before && self.failure.is_none() {
            // Nothing yet: the core looks again at once (`next_wake`); the
            // CPU goes to whoever has work meanwhile.
            std::thread::yield_now();
        }
        // Events read before a failure go first; the failure at the next poll.
        if events.len() > before {
            return Ok(self.now());
        }
        match self.failure.take() {
            Some(f) => Err(f),
            None => Ok(self.now()),
        }
    }

    fn next_wake(&self) -> Wake {
        if self.failure.is_some() || !self.early.is_empty() {
            return Wake::After(Duration::ZERO);
        }
        if self.broken.is_some() {
            return Wake::Idle;
        }
        match self.wake {
            // A busy child reports as it finds: a look is a read of the ring.
            (Wake::Spin, _) => Wake::After(Duration::ZERO),
            // Not long asleep while work is on it: a child that died with
            // work on it is noticed within `BUSY_LOOK` (nothing else tells).
            (Wake::After(d), at) => Wake::After(d.saturating_sub(at.elapsed()).min(BUSY_LOOK)),
            (wake, _) => wake,
        }
    }

    fn spin_for(&mut self, window: Duration) {
        self.spin = window;
        if self.broken.is_none() {
            if let Err(e) = self.process.link.send(&ToDevice::Spin { us: window.as_micros() as u64 }, None) {
                self.lost(e);
            }
        }
    }

    fn rebuild(&mut self) -> Result<(), MemError> {
        let old = self.process.child.id();
        let status = kill(&mut self.process.child);
        tracing::info!("device process {old} stopped ({status}); starting a fresh one");
        self.process = DeviceProcess::start(&self.exe, &self.spec).map_err(|e| MemError::Device(e.to_string()))?;
        tracing::info!("device {} runs in process {}", self.spec, self.process.child.id());
        self.regions.clear();
        self.in_flight = InFlight::default();
        self.kernels_loaded = 0;
        self.sent = 0;
        self.grows.clear();
        self.early.clear();
        self.wake = (Wake::Idle, Instant::now());
        self.failure = None;
        self.broken = None;
        if !self.spin.is_zero() {
            let spin = self.spin;
            self.spin_for(spin);
        }
        Ok(())
    }
}

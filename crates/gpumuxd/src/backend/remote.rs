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
//! Lockstep: the child never polls its device on its own. [`Backend::submit`]
//! sends the command without waiting; [`Backend::poll`] sends `Poll` and waits
//! for the child's one poll of its device (events, or the failure of a command
//! since the last poll) and the device's next wake. So the device sees
//! commands and polls in the order the core makes them, as in-process. The
//! engine's device contract (`gpumux_engine::device`) needs that order: it
//! holds what it last sent as true until events say otherwise. A child that
//! polled on its own broke it on an H100 (`spatial-even`, a client leaving):
//! the device saw launch 3's last blocks end and sent its `SmReleased`s and
//! `LaunchEnded`, while the engine, not yet having read them, sent `Grow`
//! (SMs 33-43) to launch 3; it then read `LaunchEnded(3)` with launch 3 still
//! holding 33-43, and the daemon stopped ("launch 3 ended still holding SMs
//! {33-43}"). In lockstep the device takes the `Grow` before it looks for
//! finished work, and releases the grown SMs before the launch's end.
//!
//! Ends known ahead ([`super::ends_ahead`]): a poll's answer may report
//! kernels the device ran before their launch command; the engine's launch
//! command for one is answered here, at the next poll, with no exchange
//! (the device still gets the command, marked answered). Between two real
//! exchanges the answers are at most the ends reported at the first, which
//! the device bounds (the CUDA device's runs of kernels queued natively:
//! `DEEP_MAX` a stream), so the device is still polled for everything else
//! within a few engine rounds.
//!
//! **Retired** (on unless `GPUMUX_RETIRE_ANSWERED=0`, [`RETIRE_ANSWERED_VAR`];
//! the GPU's A/B: docs/program-speed.md, "Measured and not taken"): an
//! answered launch command still made the device process build a launch,
//! end it at its next poll and send an end the daemon then dropped, and
//! take the operation's unbind as a message of its own: ~2 µs
//! of its main thread a kernel of a chain, for a kernel it had seen end and
//! reported. While the core holds its sends ([`Backend::hold_sends`]) the
//! answered command is kept here; if the operation's unbind is the next
//! thing sent, both go as one [`ToDevice::Retire`], which the device carries
//! out as [`Backend::retire_answered`] (no launch, no event). Anything else
//! sent first, or the release of the sends, sends the command as it was
//! (`SubmitAnswered`), and the unbind follows on its own: the device sees
//! the same messages in the same order either way, only merged. Every rule
//! of [`super::ends_ahead`] holds: the engine's end is the one answered
//! here, once; a kernel not seen ended is never answered, so never retired.
//!
//! Time: the engine sees this process's clock (ns since the backend opened,
//! monotonic across restarts); the child's device has its own. Events are
//! stamped when their poll's answer is read here, which is how late the
//! engine learns of them anyway.

use super::ends_ahead::KnownEnds;
use super::exchange_clock::{self as xc, ExchangeClock};
use super::link::{socket_pair, Link, LinkError};
use super::wire::{FromDevice, HostRef, RegionId, SwapCall, ToDevice};
use super::{
    Backend, BufferMove, DevAddr, Failure, KernelCode, LoadError, Loaded, MemError, MemInfo, ModuleImage, Moved,
    OpFailed, OpWork, Registered, Wake,
};
use crate::shm::ShmRegion;
use gpumux_engine::device::{Command, DeviceError, Event};
use gpumux_engine::ids::{CopyId, LaunchId, OpId};
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::time::Nanos;
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
/// The driver's variable for how many hardware work queues a context's
/// streams share, and the device process's value unless the daemon's
/// environment sets one. CUDA's default is 8: with more streams than that
/// (a launch stream per client's running kernel, each with the next kernel
/// queued behind it, and the control, cut and copy streams), streams share
/// a queue and a kernel waiting in it holds up the kernels of the others.
/// With 32 (the most the driver takes) 8 clients launched 63-70k times a
/// second, against 41-70k with 8: higher in three pairs of runs of four,
/// by 22% on average (docs/history/benchmarks.md, runs 113-114).
pub const CONNECTIONS_VAR: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
/// See [`CONNECTIONS_VAR`].
pub const CONNECTIONS: u32 = 32;
/// How long a device process that closed its end may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// A launch command answered from its end known ahead and its operation's
/// unbind right behind it go to the device process as one
/// [`ToDevice::Retire`] instead of `SubmitAnswered` and `Unbind` (module
/// doc, "Retired"), unless this is `0` in the daemon's environment (read
/// when a device process starts). On since the H200's A/B of 2026-11-29
/// (docs/program-speed.md, "Measured and not taken": the chain 1.60x
/// against 1.74x, 8 clients 114k against 89k launches/s).
pub const RETIRE_ANSWERED_VAR: &str = "GPUMUX_RETIRE_ANSWERED";

/// Why a device process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The executable could not be run.
    #[error("cannot start the device process `{exe}`: {cause}")]
    Spawn {
        /// What was run.
        exe: PathBuf,
        /// Why it failed (in the message, not also the error's source).
        cause: std::io::Error,
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
    frees_retreats_at_once: bool,
    compute_capability: [u32; 2],
    swap_granularity: Option<u64>,
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
        if std::env::var_os(CONNECTIONS_VAR).is_none() {
            cmd.env(CONNECTIONS_VAR, CONNECTIONS.to_string());
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
        let mut child = cmd.spawn().map_err(|cause| StartError::Spawn { exe: exe.to_path_buf(), cause })?;
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
            Ok(Some(FromDevice::Ready {
                describe,
                info,
                frees_retreats_at_once,
                compute_capability,
                swap_granularity,
            })) => Ok(DeviceProcess {
                child,
                link,
                describe,
                info,
                frees_retreats_at_once,
                compute_capability,
                swap_granularity,
            }),
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

/// Whether answered launches are retired ([`RETIRE_ANSWERED_VAR`]; said in
/// the log if turned off).
fn retire_answered() -> bool {
    let off = std::env::var(RETIRE_ANSWERED_VAR).is_ok_and(|v| v.trim() == "0");
    if off {
        tracing::info!("{RETIRE_ANSWERED_VAR}=0: answered launch commands and their unbinds go as two messages");
    }
    !off
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
    launches: crate::core::id_map::IdMap<LaunchId, OpId>,
    copies: crate::core::id_map::IdMap<CopyId, OpId>,
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

    /// A launch of `op` went to the device and its end was not read yet.
    fn launches_op(&self, op: OpId) -> bool {
        self.launches.values().any(|&o| o == op)
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
    /// Commands went to the child since its last poll (it settles them at the next).
    unpolled: bool,
    /// The child's device's [`Backend::next_wake`] at its last poll, and when it said so.
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
    /// A `Poll` went out ([`Backend::start_poll`]) whose answer was not read.
    poll_sent: bool,
    /// That poll may be held ([`Backend::start_held_poll`]), and whether
    /// [`Backend::end_hold`] ended it.
    held: (bool, bool),
    /// A held poll came back with nothing, its device still busy: the
    /// device was watched all along, so the next poll goes at once rather
    /// than a poll period later ([`Backend::next_wake`]).
    repoll: bool,
    /// Its answer, read early: by [`Backend::poll_ready`], or by a call made
    /// while it was on its way (answers come in the order asked).
    poll_answer: Option<FromDevice>,
    /// Operations the child reported failed, for [`Backend::take_failed`].
    failed: Vec<OpFailed>,
    /// Loads sent to the child and not yet reported: sent again to a fresh
    /// child after a rebuild (the old one took them with it).
    loading: std::collections::BTreeMap<u64, (String, String, Vec<String>)>,
    /// Loads the child reported, for [`Backend::take_loaded`].
    loaded: Vec<Loaded>,
    /// Regions sent to the child to pin and not yet reported, by token (sent
    /// again to a fresh child after a rebuild).
    pinning: std::collections::BTreeMap<u64, (RegionId, Arc<ShmRegion>)>,
    /// Pins the child reported (or that needed none), for [`Backend::take_registered`].
    registered: Vec<Registered>,
    /// Buffer moves the child reported, for [`Backend::take_moved`].
    moved: Vec<Moved>,
    /// Ends the child saw ahead, and the launches answered with them (module doc).
    known: KnownEnds,
    /// The region a moving client's bytes go through ([`super::pieces`]),
    /// made on the first move; registered with each child when it first
    /// needs it (a fresh child after a rebuild too).
    staging: Option<Arc<ShmRegion>>,
    /// Where the exchanges' time goes ([`super::exchange_clock`]).
    clock: ExchangeClock,
    /// `Poll`s sent, numbering the exchanges' stage stamps (`gpumux_stamps`).
    polls_sent: u64,
    /// [`RETIRE_ANSWERED_VAR`] is on.
    retire: bool,
    /// The core holds the sends ([`Backend::hold_sends`]).
    holding: bool,
    /// A launch command answered from its end known ahead, not sent yet:
    /// while the sends are held, its operation's unbind may follow and
    /// both go as one [`ToDevice::Retire`]; anything else sends it first,
    /// as `SubmitAnswered` (module doc, "Retired").
    answered_held: Option<Command>,
    /// Retires sent.
    retires: u64,
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
            unpolled: false,
            wake: (Wake::Idle, Instant::now()),
            failure: None,
            broken: None,
            spin: Duration::ZERO,
            poll_sent: false,
            held: (false, false),
            repoll: false,
            poll_answer: None,
            failed: Vec::new(),
            loading: Default::default(),
            loaded: Vec::new(),
            pinning: Default::default(),
            registered: Vec::new(),
            moved: Vec::new(),
            kernels_loaded: 0,
            known: KnownEnds::default(),
            staging: None,
            clock: ExchangeClock::default(),
            polls_sent: 0,
            retire: retire_answered(),
            holding: false,
            answered_held: None,
            retires: 0,
        })
    }

    /// The device process's pid.
    pub fn pid(&self) -> u32 {
        self.process.child.id()
    }

    /// The link failed (the child died, or spoke nonsense): the device is lost.
    /// Records the failure for the next poll and returns its words.
    /// Sends pin `token` (its region kept in `pinning`) to the child, with its memfd.
    fn send_pin(&mut self, token: u64) {
        let Some((id, region)) = self.pinning.get(&token) else { return };
        if self.broken.is_some() {
            return;
        }
        let msg = ToDevice::StartRegister { token, region: *id, bytes: region.len() as u64 };
        let region = region.clone();
        if let Err(e) = self.send_plain(&msg, Some(region.as_fd())) {
            self.lost(e);
        }
    }

    /// Sends load `token` (its arguments kept in `loading`) to the child.
    fn send_load(&mut self, token: u64) {
        let Some((name, source, options)) = self.loading.get(&token) else { return };
        if self.broken.is_some() {
            return;
        }
        let msg = ToDevice::StartLoad { token, name: name.clone(), source: source.clone(), options: options.clone() };
        if let Err(e) = self.send_plain(&msg, None) {
            self.lost(e);
        }
    }

    /// Sends the answered launch command held for its unbind
    /// ([`RemoteBackend::answered_held`]) as it is: something else goes
    /// first, or the sends are released.
    fn send_answered_held(&mut self) {
        let Some(command) = self.answered_held.take() else { return };
        if let Err(e) = self.send_timed(&ToDevice::SubmitAnswered(command), None, xc::SEND_ANSWERED) {
            self.lost(e);
        }
    }

    /// Sends `msg` (with `fd`) after the answered launch command held, if any, untimed.
    fn send_plain(&mut self, msg: &ToDevice, fd: Option<BorrowedFd<'_>>) -> Result<(), LinkError> {
        self.send_answered_held();
        self.process.link.send(msg, fd)
    }

    /// Sends `msg` (with `fd`), counting its time as `part`
    /// ([`xc::SEND_PARTS`]); a `Poll` sent is the start of its exchange.
    /// The answered launch command held, if any, goes first.
    fn send_timed(&mut self, msg: &ToDevice, fd: Option<BorrowedFd<'_>>, part: usize) -> Result<(), LinkError> {
        self.send_answered_held();
        let t = xc::mono_ns();
        let sent = self.process.link.send(msg, fd);
        self.clock.sent(part, xc::mono_ns().saturating_sub(t));
        if sent.is_ok() && part == xc::SEND_POLLS {
            self.clock.poll_sent();
            self.polls_sent += 1;
            gpumux_stamps::stamp(gpumux_stamps::Stage::ExchangeStart, self.exchange_key(), 0);
        }
        sent
    }

    /// The current exchange's key in the stage stamps: the device process's
    /// pid and the poll's number (several devices share the core's thread).
    fn exchange_key(&self) -> u64 {
        (u64::from(self.process.child.id()) << 40) | self.polls_sent
    }

    /// Stamps the launch ends among `events` as read by the core (issue 35).
    fn stamp_ends(events: &[Event]) {
        if gpumux_stamps::on() {
            for e in events {
                if let Event::LaunchEnded { launch, .. } = e {
                    gpumux_stamps::stamp(gpumux_stamps::Stage::CoreEnd, launch.0, 0);
                }
            }
        }
    }

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

    /// Sends a call and waits for its answer.
    fn call(&mut self, msg: &ToDevice, fd: Option<BorrowedFd<'_>>) -> Result<FromDevice, String> {
        if let Some(why) = &self.broken {
            return Err(format!("the device is lost ({why}); it is being restarted"));
        }
        if self.poll_sent && self.poll_answer.is_none() {
            // A poll is on its way: its answer comes first (not held for news).
            self.end_hold();
            let answer = self.answer()?;
            self.poll_answer = Some(answer);
        }
        let part = if matches!(msg, ToDevice::Poll) { xc::SEND_POLLS } else { xc::SEND_OTHER };
        if let Err(e) = self.send_timed(msg, fd, part) {
            return Err(self.lost(e));
        }
        if part == xc::SEND_POLLS {
            gpumux_stamps::stamp(gpumux_stamps::Stage::WaitStart, self.exchange_key(), 0);
        }
        self.answer()
    }

    /// The next answer on the link, waited for up to [`CALL_TIMEOUT`].
    fn answer(&mut self) -> Result<FromDevice, String> {
        match self.process.link.recv_timeout::<FromDevice>(CALL_TIMEOUT) {
            Ok(Some(answer)) => {
                if matches!(answer, FromDevice::Polled { .. }) {
                    self.clock.answer_read();
                    gpumux_stamps::stamp(gpumux_stamps::Stage::ExchangeEnd, self.exchange_key(), 0);
                }
                Ok(answer)
            }
            Ok(None) => {
                let what = format!(
                    "the device process (pid {}) did not answer in {}s: {}",
                    self.process.child.id(),
                    CALL_TIMEOUT.as_secs(),
                    kill(&mut self.process.child)
                );
                self.device_lost(what.clone());
                Err(what)
            }
            Err(e) => Err(self.lost(e)),
        }
    }

    /// The device failed (the answer to a poll): reported now, and calls
    /// fail until [`Backend::rebuild`].
    fn device_failed(&mut self, failure: Failure, what: String) -> Failure {
        self.broken.get_or_insert(what);
        failure
    }

    /// One [`SwapCall`] and its answer.
    fn swap(&mut self, call: SwapCall) -> Result<u64, MemError> {
        match self.call(&ToDevice::Swap(call), None).map_err(MemError::Device)? {
            FromDevice::Swapped(r) => r,
            other => Err(MemError::Device(Self::unexpected("Swapped", &other))),
        }
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
        if self.known.count() > 0 {
            tracing::info!(
                "device {}: {} launch commands answered from ends the device saw ahead, without a round trip",
                self.spec,
                self.known.count()
            );
        }
        if self.retire {
            tracing::info!(
                "device {}: {} answered launch commands retired with their unbind as one message \
                 ({RETIRE_ANSWERED_VAR}=0 turns it off)",
                self.spec,
                self.retires
            );
        }
        if let Some(words) = self.clock.summary() {
            tracing::info!("device {} link: {words}", self.spec);
        }
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

    fn compute_capability(&self) -> [u32; 2] {
        self.process.compute_capability
    }

    fn runs_block_ranges(&self) -> bool {
        // Both devices a device process serves (CUDA, simulated) do.
        true
    }

    fn frees_retreats_at_once(&self) -> bool {
        self.process.frees_retreats_at_once
    }

    fn ends_answered(&self) -> u64 {
        self.known.count()
    }

    fn take_answered(&mut self, events: &mut Vec<Event>) -> bool {
        // With a poll on its way its answer takes them, after the device's events.
        if self.poll_sent || !self.known.pending() {
            return false;
        }
        let before = events.len();
        self.known.take(events);
        Self::stamp_ends(&events[before..]);
        true
    }

    fn exchange_lap(&mut self) -> Option<String> {
        self.clock.lap()
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

    fn swap_granularity(&self) -> Option<u64> {
        self.process.swap_granularity
    }

    fn reserve(&mut self, bytes: u64) -> Result<DevAddr, MemError> {
        self.swap(SwapCall::Reserve(bytes))
    }

    fn evict(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        self.swap(SwapCall::Evict(addr))
    }

    fn restore(&mut self, addr: DevAddr) -> Result<Nanos, MemError> {
        self.swap(SwapCall::Restore(addr))
    }

    fn start_move(&mut self, token: u64, what: BufferMove) -> Option<Result<Nanos, MemError>> {
        if let Some(what) = &self.broken {
            return Some(Err(MemError::Device(what.clone())));
        }
        match self.send_plain(&ToDevice::StartMove { token, what }, None) {
            Ok(()) => None,
            Err(e) => Some(Err(MemError::Device(self.lost(e)))),
        }
    }

    fn take_moved(&mut self, out: &mut Vec<Moved>) {
        out.append(&mut self.moved);
    }

    fn settle_moves(&mut self, out: &mut Vec<Moved>) {
        out.append(&mut self.moved);
        match self.call(&ToDevice::SettleMoves, None) {
            Ok(FromDevice::Settled(moved)) => out.extend(moved),
            // The core counts every move not reported as failed.
            Ok(other) => tracing::warn!("{}", Self::unexpected("Settled", &other)),
            Err(e) => tracing::warn!("settling buffer moves: {e}"),
        }
    }

    fn readdress_evicted(&mut self, addr: DevAddr) -> Result<DevAddr, MemError> {
        // The host copies lived in the device process; one that was
        // restarted has none (docs/daemon.md, "Memory oversubscription").
        self.swap(SwapCall::Readdress(addr))
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

    fn start_register(&mut self, token: u64, region: &Arc<ShmRegion>) {
        if self.regions.iter().any(|(_, r)| Arc::ptr_eq(r, region)) {
            self.registered.push(Registered { token, result: Ok(()) });
            return;
        }
        let id = RegionId(self.next_region);
        self.next_region += 1;
        self.pinning.insert(token, (id, region.clone()));
        self.send_pin(token);
    }

    fn take_registered(&mut self, out: &mut Vec<Registered>) {
        out.append(&mut self.registered);
    }

    fn unregister_host(&mut self, region: &ShmRegion) {
        let Some(i) = self.regions.iter().position(|(_, r)| std::ptr::eq(Arc::as_ptr(r), region)) else { return };
        let (id, _) = self.regions.swap_remove(i);
        if self.broken.is_none() {
            if let Err(e) = self.send_plain(&ToDevice::UnregisterHost { region: id }, None) {
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

    fn start_load(&mut self, token: u64, name: &str, source: &str, options: &[String]) {
        self.loading.insert(token, (name.into(), source.into(), options.to_vec()));
        self.send_load(token);
    }

    fn take_loaded(&mut self, out: &mut Vec<Loaded>) {
        out.append(&mut self.loaded);
    }

    fn unload_module(&mut self, kernels: &[KernelCode]) {
        self.kernels_loaded = self.kernels_loaded.saturating_sub(kernels.len());
        if self.broken.is_none() {
            if let Err(e) = self.send_plain(&ToDevice::UnloadModule { kernels: kernels.to_vec() }, None) {
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
            // Stamped before the send: stamped after it, a core thread held off the CPU
            // between the two put the device process's receipt (`HostBind`) first.
            gpumux_stamps::stamp(gpumux_stamps::Stage::CoreBind, op.0, 0);
            if let Err(e) = self.send_timed(&ToDevice::Bind { op, work }, None, xc::SEND_BINDS) {
                self.lost(e);
            }
        }
    }

    fn unbind(&mut self, op: OpId) {
        self.known.forget(op);
        if self.broken.is_some() {
            return;
        }
        let msg = match self.answered_held.take() {
            // Its answered launch command, held: both as one (module doc, "Retired").
            Some(Command::Launch { launch, op: of, .. }) if of == op => {
                self.retires += 1;
                (ToDevice::Retire { launch, op }, xc::SEND_RETIRED)
            }
            held => {
                self.answered_held = held;
                (ToDevice::Unbind { op }, xc::SEND_UNBINDS)
            }
        };
        if let Err(e) = self.send_timed(&msg.0, None, msg.1) {
            self.lost(e);
        }
    }

    fn now(&self) -> Nanos {
        Nanos::try_from(self.origin.elapsed().as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn now_at(&self, at: Instant) -> Nanos {
        Nanos::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn submit(&mut self, command: Command) -> Result<(), Failure> {
        if self.broken.is_some() {
            // Lost already: the failure is reported by the next poll, if not yet.
            return Ok(());
        }
        if self.known.drops(&command) {
            // Its launch was answered here and ran every block (`ends_ahead`).
            return Ok(());
        }
        let launch = matches!(command, Command::Launch { .. });
        let stamped = match &command {
            Command::Launch { launch, op, .. } if gpumux_stamps::on() => Some((op.0, launch.0)),
            _ => None,
        };
        let (msg, part) = if self.known.answer(&command) {
            if tracing::enabled!(tracing::Level::TRACE) {
                if let Command::Launch { launch, op, .. } = &command {
                    tracing::trace!("launch {launch} of {op} answered from its end seen ahead");
                }
            }
            (ToDevice::SubmitAnswered(command), xc::SEND_ANSWERED)
        } else {
            self.in_flight.command(&command);
            self.unpolled = true;
            (ToDevice::Submit(command), if launch { xc::SEND_LAUNCHES } else { xc::SEND_COMMANDS })
        };
        // Before the send, as the bind's (`bind`).
        if let Some((op, launch)) = stamped {
            gpumux_stamps::stamp(gpumux_stamps::Stage::CoreLaunch, op, launch);
        }
        if let ToDevice::SubmitAnswered(command) = msg {
            if self.retire && self.holding {
                // Its unbind may follow before the sends are released.
                self.send_answered_held();
                self.answered_held = Some(command);
                return self.failure.take().map_or(Ok(()), Err);
            }
            return match self.send_timed(&ToDevice::SubmitAnswered(command), None, part) {
                Ok(()) => Ok(()),
                Err(e) => {
                    self.lost(e);
                    self.failure.take().map_or(Ok(()), Err)
                }
            };
        }
        if let Err(e) = self.send_timed(&msg, None, part) {
            self.lost(e);
            return self.failure.take().map_or(Ok(()), Err);
        }
        Ok(())
    }

    fn poll(&mut self, events: &mut Vec<Event>) -> Result<Nanos, Failure> {
        if let Some(f) = self.failure.take() {
            return Err(f);
        }
        if self.broken.is_some() {
            // Reported already; the core rebuilds.
            return Ok(self.now());
        }
        if self.known.pending() && !self.poll_sent {
            // Launches answered from ends seen ahead: no exchange (module doc).
            self.clock.local_poll();
            let before = events.len();
            self.known.take(events);
            Self::stamp_ends(&events[before..]);
            return Ok(self.now());
        }
        self.unpolled = false;
        self.repoll = false;
        let (held, _) = std::mem::take(&mut self.held);
        let answer = if std::mem::take(&mut self.poll_sent) {
            match self.poll_answer.take() {
                Some(a) => Ok(a),
                None => {
                    gpumux_stamps::stamp(gpumux_stamps::Stage::WaitStart, self.exchange_key(), 0);
                    self.answer()
                }
            }
        } else {
            self.call(&ToDevice::Poll, None)
        };
        match answer {
            Ok(FromDevice::Polled { events: got, failed, loaded, registered, moved, ends_ahead, wake, times }) => {
                self.clock.exchanged(&times);
                self.repoll = held && got.is_empty() && ends_ahead.is_empty() && matches!(wake, Wake::Spin);
                self.moved.extend(moved);
                for r in &registered {
                    if let Some((id, region)) = self.pinning.remove(&r.token) {
                        if r.result.is_ok() {
                            self.regions.push((id, region));
                        }
                    }
                }
                self.registered.extend(registered);
                for l in &loaded {
                    self.loading.remove(&l.token);
                    if let Ok(image) = &l.result {
                        self.kernels_loaded += image.kernels.len();
                    }
                }
                self.loaded.extend(loaded);
                for e in &got {
                    self.in_flight.event(e);
                }
                let before = events.len();
                events.extend(got);
                // After the device's: those launches went to it after this poll.
                self.known.take(events);
                Self::stamp_ends(&events[before..]);
                let in_flight = &self.in_flight;
                let learnt = ends_ahead.len();
                self.known.learn(ends_ahead, |op| in_flight.launches_op(op));
                tracing::trace!("device poll: {} events, {learnt} ends seen ahead", events.len());
                self.failed.extend(failed);
                self.wake = (wake, Instant::now());
            }
            Ok(FromDevice::ContextLost { suspects, what }) => {
                return Err(self.device_failed(Failure::ContextLost { suspects, what: what.clone() }, what));
            }
            Ok(FromDevice::Fatal { what }) => {
                let f = Failure::Fatal(DeviceError::backend("the device process", what.clone()));
                return Err(self.device_failed(f, what));
            }
            Ok(other) => {
                let what = Self::unexpected("Poll", &other);
                let kill = kill(&mut self.process.child);
                self.device_lost(format!("{what}; {kill}"));
            }
            // The call recorded the loss.
            Err(_) => {}
        }
        match self.failure.take() {
            Some(f) => Err(f),
            None => Ok(self.now()),
        }
    }

    fn hold_sends(&mut self) {
        if self.broken.is_none() {
            self.process.link.hold();
            self.holding = true;
        }
    }

    fn release_sends(&mut self) {
        self.send_answered_held();
        self.holding = false;
        if let Err(e) = self.process.link.release() {
            if self.broken.is_none() {
                self.lost(e);
            }
        }
    }

    fn start_poll(&mut self) -> bool {
        self.start_held_poll(Duration::ZERO)
    }

    fn start_held_poll(&mut self, hold: Duration) -> bool {
        if self.poll_sent || self.failure.is_some() || self.broken.is_some() || self.known.pending() {
            return self.poll_sent;
        }
        let us = u32::try_from(hold.as_micros()).unwrap_or(u32::MAX);
        let msg = if us == 0 { ToDevice::Poll } else { ToDevice::PollHeld { us } };
        self.repoll = false;
        match self.send_timed(&msg, None, xc::SEND_POLLS) {
            Ok(()) => {
                self.poll_sent = true;
                self.held = (us > 0, false);
            }
            // Recorded: the poll reports it.
            Err(e) => {
                self.lost(e);
            }
        }
        self.poll_sent
    }

    fn end_hold(&mut self) {
        if !self.poll_sent || self.poll_answer.is_some() || self.held != (true, false) || self.broken.is_some() {
            return;
        }
        self.held.1 = true;
        if let Err(e) = self.send_timed(&ToDevice::EndHold, None, xc::SEND_OTHER) {
            self.lost(e);
        }
    }

    fn poll_ready(&mut self) -> bool {
        if !self.poll_sent || self.poll_answer.is_some() {
            return true;
        }
        match self.process.link.look::<FromDevice>() {
            Ok(Some(a)) => {
                self.clock.answer_read();
                gpumux_stamps::stamp(gpumux_stamps::Stage::ExchangeEnd, self.exchange_key(), 0);
                self.poll_answer = Some(a);
                true
            }
            Ok(None) => false,
            Err(e) => {
                // Recorded: the poll reports it.
                self.lost(e);
                self.poll_sent = false;
                true
            }
        }
    }

    fn take_failed(&mut self, out: &mut Vec<OpFailed>) {
        out.append(&mut self.failed);
    }

    fn next_wake(&self) -> Wake {
        if self.failure.is_some() || self.unpolled || self.known.pending() || self.repoll {
            return Wake::After(Duration::ZERO);
        }
        if self.broken.is_some() {
            return Wake::Idle;
        }
        match self.wake {
            (Wake::After(d), at) => Wake::After(d.saturating_sub(at.elapsed())),
            (wake, _) => wake,
        }
    }

    fn spin_for(&mut self, window: Duration) {
        self.spin = window;
        if self.broken.is_none() {
            if let Err(e) = self.send_plain(&ToDevice::Spin { us: window.as_micros() as u64 }, None) {
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
        self.unpolled = false;
        self.wake = (Wake::Idle, Instant::now());
        self.failure = None;
        self.broken = None;
        self.poll_sent = false;
        self.held = (false, false);
        self.repoll = false;
        self.poll_answer = None;
        self.failed.clear();
        self.known = KnownEnds::default();
        self.holding = false;
        self.answered_held = None;
        if !self.spin.is_zero() {
            let spin = self.spin;
            self.spin_for(spin);
        }
        // Loads the old child took with it: the fresh one compiles them again
        // (from the compile cache when they had been compiled).
        let tokens: Vec<u64> = self.loading.keys().copied().collect();
        for token in tokens {
            self.send_load(token);
        }
        // And the pins: the fresh child maps and pins them again.
        let tokens: Vec<u64> = self.pinning.keys().copied().collect();
        for token in tokens {
            self.send_pin(token);
        }
        Ok(())
    }

    // A moving client's bytes: one exchange per piece through the staging
    // region the child maps and pins (`pieces`), so the child is held by
    // one piece at a time.
    fn read_span(&mut self, addr: DevAddr, start: u64, bytes: u64) -> Option<Result<Vec<u8>, MemError>> {
        let (staging, region) = match self.staging() {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        Some(super::pieces::read_back(start, bytes, &staging, |offset, len| {
            self.piece(ToDevice::ReadPiece { addr, offset, bytes: len as u64, region, at: 0 })
        }))
    }

    fn write_span(&mut self, addr: DevAddr, start: u64, data: &[u8]) -> Option<Result<(), MemError>> {
        let (staging, region) = match self.staging() {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        Some(super::pieces::write_in(start, data, &staging, |offset, len| {
            self.piece(ToDevice::WritePiece { addr, offset, bytes: len as u64, region, at: 0 })
        }))
    }

    // A split's bytes: the device process copies between the buffer and the
    // split's region (mapped and pinned there once), a piece an exchange.
    fn read_to_region(
        &mut self,
        addr: DevAddr,
        offset: u64,
        region: &Arc<ShmRegion>,
        at: u64,
        len: u64,
    ) -> Option<Result<(), MemError>> {
        let id = match self.region_id(region) {
            Ok(id) => id,
            Err(e) => return Some(Err(e)),
        };
        Some(super::pieces::in_pieces(len, |o, n| {
            self.piece(ToDevice::ReadPiece { addr, offset: offset + o, bytes: n, region: id, at: at + o })
        }))
    }

    fn write_from_region(
        &mut self,
        addr: DevAddr,
        offset: u64,
        region: &Arc<ShmRegion>,
        at: u64,
        len: u64,
    ) -> Option<Result<(), MemError>> {
        let id = match self.region_id(region) {
            Ok(id) => id,
            Err(e) => return Some(Err(e)),
        };
        Some(super::pieces::in_pieces(len, |o, n| {
            self.piece(ToDevice::WritePiece { addr, offset: offset + o, bytes: n, region: id, at: at + o })
        }))
    }
}

impl RemoteBackend {
    /// The staging region and its number in the child, made and registered
    /// there when first needed.
    fn staging(&mut self) -> Result<(Arc<ShmRegion>, RegionId), MemError> {
        let region = match &self.staging {
            Some(r) => r.clone(),
            None => {
                let r = super::pieces::staging_region(super::pieces::PIECE)?;
                self.staging = Some(r.clone());
                r
            }
        };
        let id = self.region_id(&region)?;
        Ok((region, id))
    }

    /// One `ReadPiece` or `WritePiece` and its answer.
    fn piece(&mut self, msg: ToDevice) -> Result<(), MemError> {
        match self.call(&msg, None).map_err(MemError::Device)? {
            FromDevice::Piece(r) => r,
            other => Err(MemError::Device(Self::unexpected("a piece", &other))),
        }
    }
}

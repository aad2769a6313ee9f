//! The device process: what `gpumuxd --device-host SPEC --host-fd N` runs,
//! started by the daemon ([`crate::backend::remote`]), never by hand.
//!
//! It opens the device in-process and serves it over the socket it
//! inherited as descriptor N. It carries out each message in the order sent
//! (calls, bindings, commands) and answers the calls; and while its device
//! has work it polls it on its own, between messages, and reports what it
//! finds (`Polled`: events, the device's next wake, and how many commands
//! it had carried out by then). So a launch's end reaches the daemon as
//! soon as this process sees it, and the daemon never waits for this
//! process to take its turn (docs/daemon.md, "The device process").
//!
//! The daemon's commands cross those reports on the link: a `Grow` or
//! `Retreat` may name a launch that has ended here. One whose end was
//! reported is ignored (the daemon releases the grown SMs before that end
//! itself: [`crate::backend::remote`] says why that is exact); before any
//! other `Grow` or `Retreat` the device is polled, and a launch found ended
//! is treated alike, the grown SMs released here, before its end, in the
//! report to come. Commands that end launches at once (a launch with
//! nothing to run) thus never meet a later command for them.
//!
//! A failure of a command (or of a binding) is the next report. After the
//! device reports a lost context it touches the device no more (a faulted
//! CUDA process cannot recover) and waits to be killed. It exits when the
//! daemon closes its end. Idle, it sleeps on the socket.

use crate::backend::link::{self, Link, LinkError};
use crate::backend::wire::{FromDevice, RegionId, ToDevice};
use crate::backend::{Backend, Failure, MemError, Wake};
use crate::load::LoadClock;
use crate::shm::ShmRegion;
use anyhow::{bail, Context, Result};
use gpumux_engine::device::{Command, DeviceError, Event, ReleaseCause};
use gpumux_engine::ids::LaunchId;
use std::collections::{HashMap, HashSet};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    link.send(&FromDevice::Ready { describe: backend.describe(), info: backend.info().clone() }, None)
        .context("telling the daemon the device is ready")?;
    let mut host = DeviceHost::new(backend, link);
    host.run()?;
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
    /// A failure since the last poll, the answer to the next one.
    failure: Option<Failure>,
    /// The context is lost: nothing more is done with the device.
    broken: bool,
    /// How long to poll the link after each message (`ToDevice::Spin`).
    spin: Duration,
    /// Which launches have ended, as far as the daemon was told.
    launches: Launches,
    /// Commands carried out.
    applied: u64,
    /// Events polled before a `Grow` or `Retreat`, for the next report.
    unreported: Vec<Event>,
    /// The wake and the commands carried out in the last report.
    reported: (Wake, u64),
    /// The last poll found events: the device may have more at that
    /// instant (a device hands out what it has first and moves on at the
    /// next poll), so it is polled again at once, as the core's pump does.
    more: bool,
    /// Where this process's time goes (logged when the daemon lets go).
    load: LoadClock,
}

/// The launches the daemon started and those whose end it was sent.
#[derive(Debug, Default)]
struct Launches {
    /// Started and not reported ended.
    live: HashSet<LaunchId>,
    /// The newest started (the engine numbers launches in increasing order).
    newest: Option<LaunchId>,
}

impl Launches {
    fn started(&mut self, launch: LaunchId) {
        self.live.insert(launch);
        self.newest = self.newest.max(Some(launch));
    }

    fn reported_ended(&mut self, launch: LaunchId) {
        self.live.remove(&launch);
    }

    /// Started, and its end reported: a command naming it was sent before
    /// the daemon read that. A launch never started is the device's to refuse.
    fn over(&self, launch: LaunchId) -> bool {
        !self.live.contains(&launch) && self.newest.is_some_and(|n| launch <= n)
    }
}

impl DeviceHost {
    fn new(backend: Box<dyn Backend>, link: Link) -> DeviceHost {
        DeviceHost {
            backend,
            link,
            regions: HashMap::new(),
            failure: None,
            broken: false,
            spin: crate::spin::window(link::SPIN),
            launches: Launches::default(),
            applied: 0,
            unreported: Vec::new(),
            reported: (Wake::Idle, 0),
            more: false,
            load: LoadClock::new(&["commands", "device polls", "other messages"]),
        }
    }

    /// Takes the daemon's messages as they come, and polls the device while
    /// it has work (module doc); sleeps on the socket when neither comes.
    fn run(&mut self) -> Result<()> {
        loop {
            match self.link.poll_recv::<ToDevice>() {
                Ok(Some(msg)) => {
                    self.take(msg)?;
                    continue;
                }
                Ok(None) => {}
                Err(LinkError::Closed) => return self.closed(),
                Err(e) => return Err(e).context("reading the daemon's messages"),
            }
            if self.poll_due() {
                let began = Instant::now();
                self.report()?;
                self.load.add(1, 1, began.elapsed());
                continue;
            }
            // Nothing now: wait for a message, or for the device's next look.
            let wait = match self.backend.next_wake() {
                Wake::Spin => Some(Duration::ZERO),
                Wake::After(d) => Some(d),
                Wake::Idle => None,
            };
            let spin = wait.map_or(self.spin, |w| w.min(self.spin));
            let msg = match self.link.recv_spin::<ToDevice>(spin) {
                Ok(msg) => msg,
                Err(LinkError::Closed) => return self.closed(),
                Err(e) => return Err(e).context("reading the daemon's messages"),
            };
            match msg {
                Some(msg) => self.take(msg)?,
                None if wait.is_none_or(|w| w > spin) => {
                    self.link.wait_readable(wait.map(|w| w - spin)).context("waiting for the daemon")?
                }
                None => {}
            }
        }
    }

    /// The daemon let go: says where this process's time went.
    fn closed(&self) -> Result<()> {
        if let Some(load) = self.load.summary() {
            tracing::info!("device process: {load}");
        }
        Ok(())
    }

    /// Carries out one message, on the clock.
    fn take(&mut self, msg: ToDevice) -> Result<()> {
        let kind = if matches!(msg, ToDevice::Submit(_)) { 0 } else { 2 };
        let began = Instant::now();
        self.handle(msg)?;
        self.load.add(kind, 1, began.elapsed());
        if let Some(lap) = self.load.lap() {
            tracing::debug!(target: "gpumuxd::load", "device process: {lap}");
        }
        Ok(())
    }

    /// Whether to poll the device now: it has work, a look is due, or
    /// something is to be reported.
    fn poll_due(&self) -> bool {
        if self.failure.is_some() || !self.unreported.is_empty() {
            return true;
        }
        if self.broken {
            return false;
        }
        if self.applied != self.reported.1 || self.more {
            return true;
        }
        match self.backend.next_wake() {
            Wake::Spin => true,
            Wake::After(d) => d.is_zero(),
            Wake::Idle => false,
        }
    }

    /// Polls the device and reports: events, a failure, a changed wake, or
    /// commands carried out since the last report.
    fn report(&mut self) -> Result<()> {
        if let Some(f) = self.failure.take() {
            self.unreported.clear();
            return self.send(failure_message(f));
        }
        let mut events = std::mem::take(&mut self.unreported);
        self.more = false;
        if !self.broken {
            let before = events.len();
            if let Err(f) = self.backend.poll(&mut events) {
                self.broken = true;
                return self.send(failure_message(f));
            }
            self.more = events.len() > before;
        }
        let wake = match self.backend.next_wake() {
            _ if self.broken => Wake::Idle,
            // Not idle before the poll that finds nothing more: the daemon
            // sleeps on an idle device until it sends a command.
            Wake::Idle if self.more => Wake::After(Duration::ZERO),
            wake => wake,
        };
        // A timer's new `After` is news too: the daemon sleeps until it.
        let changed = wake != self.reported.0;
        if events.is_empty() && !changed && self.applied == self.reported.1 {
            return Ok(());
        }
        for e in &events {
            if let Event::LaunchEnded { launch, .. } = e {
                self.launches.reported_ended(*launch);
            }
        }
        self.reported = (wake, self.applied);
        self.send(FromDevice::Polled { events, wake, applied: self.applied })
    }

    /// A `Grow` or `Retreat` of `launch`: whether to pass it to the device.
    /// Not if its end was reported, nor if a poll now finds it ended (a
    /// `Grow`'s SMs are then released before that end, in the next report).
    fn still_live(&mut self, launch: LaunchId, grow: Option<&gpumux_engine::smset::SmSet>) -> bool {
        if self.launches.over(launch) {
            return false;
        }
        if self.broken {
            return true;
        }
        if let Err(f) = self.backend.poll(&mut self.unreported) {
            // The next report says so; the command goes nowhere.
            self.broken = true;
            self.failure.get_or_insert(f);
            return false;
        }
        let Some(end) =
            self.unreported.iter().position(|e| matches!(e, Event::LaunchEnded { launch: l, .. } if *l == launch))
        else {
            return true;
        };
        if let Some(sms) = grow {
            let released = sms.iter().map(|sm| Event::SmReleased { launch, sm, cause: ReleaseCause::Exhausted });
            self.unreported.splice(end..end, released);
        }
        false
    }

    fn send(&mut self, msg: FromDevice) -> Result<()> {
        match self.link.send(&msg, None) {
            // The daemon is gone: the next read ends the loop.
            Ok(()) | Err(LinkError::Closed) => Ok(()),
            Err(e) => Err(e).context("writing to the daemon"),
        }
    }

    /// Keeps a device failure for the next report; after it the device is left alone.
    fn failed(&mut self, f: Failure) {
        self.broken = true;
        self.failure.get_or_insert(f);
    }

    fn handle(&mut self, msg: ToDevice) -> Result<()> {
        match msg {
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
            ToDevice::RegisterHost { region, bytes } => {
                let r = self.register(region, bytes);
                self.send(FromDevice::Registered(r))
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
            ToDevice::Bind { op, work } => {
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
                self.applied += 1;
                if self.broken {
                    return Ok(());
                }
                let pass = match &command {
                    Command::Launch { launch, .. } => {
                        self.launches.started(*launch);
                        true
                    }
                    Command::Grow { launch, sms } => self.still_live(*launch, Some(sms)),
                    Command::Retreat { launch, .. } => self.still_live(*launch, None),
                    Command::Copy { .. } => true,
                };
                if !pass {
                    tracing::trace!("device process: {command:?} names a launch that has ended; ignored");
                    return Ok(());
                }
                if let Err(f) = self.backend.submit(command) {
                    self.failed(f);
                }
                Ok(())
            }
        }
    }

    /// Maps the memfd that came with `RegisterHost` and registers it with the device.
    fn register(&mut self, region: RegionId, bytes: u64) -> Result<(), MemError> {
        let fd =
            self.link.take_fd().ok_or_else(|| MemError::Device("the shared region came without its memfd".into()))?;
        let mapped = Arc::new(ShmRegion::map(fd, bytes).map_err(|e| MemError::Device(e.to_string()))?);
        self.backend.register_host(&mapped)?;
        self.regions.insert(region, mapped);
        Ok(())
    }
}

/// A failure as a report.
fn failure_message(f: Failure) -> FromDevice {
    match f {
        Failure::ContextLost { suspects, what } => FromDevice::ContextLost { suspects, what },
        Failure::Fatal(e) => FromDevice::Fatal { what: format!("{:#}", anyhow::Error::new(e)) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::link::socket_pair;
    use crate::backend::sim::SimBackend;
    use gpumux_engine::ids::{KernelId, OpId, ProcessId, SmId};
    use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
    use gpumux_engine::ranges::BlockRanges;
    use gpumux_engine::smset::SmSet;

    /// A device process on the simulator, driven message by message, and the daemon's end of its link.
    fn host() -> (DeviceHost, Link) {
        let (ours, theirs) = socket_pair().unwrap();
        let daemon = Link::connect(ours).unwrap();
        let link = Link::accept(theirs, Duration::from_secs(5)).unwrap();
        let backend = Box::new(SimBackend::open("sim:h100").unwrap());
        (DeviceHost::new(backend, link), daemon)
    }

    /// Launch 1: `blocks` blocks of 10 ms on SM 0, 4 resident at once.
    fn launch(blocks: u64) -> ToDevice {
        let shape = KernelShape::new(blocks, 128, 32).with_max_blocks_per_sm(4);
        let desc = KernelDesc::new("k", shape).with_sim_timing(SimTiming::new(10_000_000));
        ToDevice::Submit(Command::Launch {
            launch: LaunchId(1),
            kernel: KernelId(1),
            op: OpId(1),
            process: ProcessId(0),
            priority: 0,
            desc: Arc::new(desc),
            time_key: 1,
            blocks: BlockRanges::full(blocks),
            restore: Vec::new(),
            sms: SmSet::single(SmId(0)),
        })
    }

    fn grow(first: u16, end: u16) -> ToDevice {
        ToDevice::Submit(Command::Grow { launch: LaunchId(1), sms: SmSet::range(first, end) })
    }

    /// Every report sent so far: (events, commands carried out) of each.
    fn reports(daemon: &mut Link) -> Vec<(Vec<Event>, u64)> {
        let mut got = Vec::new();
        while let Some(msg) = daemon.try_recv::<FromDevice>().unwrap() {
            match msg {
                FromDevice::Polled { events, applied, .. } => got.push((events, applied)),
                other => panic!("not a report: {other:?}"),
            }
        }
        got
    }

    /// The SMs launch 1 released before its end, and that the end came last.
    fn released_before_end(events: &[Event]) -> Vec<u16> {
        let end = events.iter().position(|e| matches!(e, Event::LaunchEnded { .. })).expect("the launch's end");
        assert_eq!(end, events.len() - 1, "the end comes last: {events:?}");
        let mut sms: Vec<u16> = events[..end]
            .iter()
            .filter_map(|e| match e {
                Event::SmReleased { launch: LaunchId(1), sm, .. } => Some(sm.0),
                _ => None,
            })
            .collect();
        sms.sort_unstable();
        sms
    }

    #[test]
    fn a_grow_of_a_launch_found_ended_before_it_is_released_before_the_end_in_the_next_report() {
        let (mut host, mut daemon) = host();
        host.take(launch(4)).unwrap();
        host.report().unwrap();
        // All 4 blocks fit at once: over 10 ms later, the device not polled since.
        std::thread::sleep(Duration::from_millis(40));
        host.take(grow(1, 3)).unwrap();
        host.report().unwrap();
        let all: Vec<Event> = reports(&mut daemon).into_iter().flat_map(|(e, _)| e).collect();
        assert_eq!(released_before_end(&all), [0, 1, 2], "{all:?}");
    }

    #[test]
    fn a_grow_or_retreat_of_a_launch_whose_end_was_reported_is_ignored() {
        let (mut host, mut daemon) = host();
        host.take(launch(4)).unwrap();
        host.report().unwrap();
        std::thread::sleep(Duration::from_millis(40));
        host.report().unwrap();
        let first = reports(&mut daemon);
        let events: Vec<Event> = first.iter().flat_map(|(e, _)| e.clone()).collect();
        assert_eq!(released_before_end(&events), [0]);
        assert_eq!(first.last().map(|r| r.1), Some(1), "the report covers the launch command");
        // The daemon, not having read that yet, grows and retreats launch 1.
        host.take(grow(1, 3)).unwrap();
        host.take(ToDevice::Submit(Command::Retreat {
            launch: LaunchId(1),
            sms: SmSet::range(0, 3),
            mechanism: gpumux_engine::device::Mechanism::Drain,
        }))
        .unwrap();
        host.report().unwrap();
        let later = reports(&mut daemon);
        assert_eq!(later.len(), 1, "one report says the commands were carried out: {later:?}");
        assert!(later[0].0.is_empty(), "nothing of launch 1 after its end (the device saw neither): {later:?}");
        assert_eq!(later[0].1, 3);
        assert!(!host.broken && host.failure.is_none(), "ignored, not refused");
    }

    #[test]
    fn a_grow_of_a_running_launch_is_the_devices_to_release() {
        let (mut host, mut daemon) = host();
        // 12 blocks, 4 at a time on SM 0: three waves of 10 ms.
        host.take(launch(12)).unwrap();
        host.take(grow(1, 3)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut all = Vec::new();
        while !all.iter().any(|e| matches!(e, Event::LaunchEnded { .. })) {
            assert!(Instant::now() < deadline, "launch 1 did not end: {all:?}");
            host.report().unwrap();
            all.extend(reports(&mut daemon).into_iter().flat_map(|(e, _)| e));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(released_before_end(&all), [0, 1, 2], "{all:?}");
        match all.last() {
            Some(Event::LaunchEnded { completed, .. }) => assert_eq!(*completed, 12),
            other => panic!("{other:?}"),
        }
    }
}

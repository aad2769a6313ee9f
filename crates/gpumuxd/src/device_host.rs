//! The device process: what `gpumuxd --device-host SPEC --host-fd N` runs,
//! started by the daemon ([`crate::backend::remote`]), never by hand.
//!
//! It opens the device in-process and serves it over the socket it
//! inherited as descriptor N: it answers the daemon's calls, carries out
//! bindings and commands, and pushes the device's events as they happen. Its
//! loop: take every message that has arrived; poll the device and send what
//! it reported; then sleep in `ppoll(2)` on the socket until a message comes
//! or the device next needs a look. After the device reports a lost context
//! it touches the device no more (a faulted CUDA process cannot recover) and
//! waits to be killed. It exits when the daemon closes its end.

use crate::backend::link::{Link, LinkError};
use crate::backend::wire::{FromDevice, RegionId, ToDevice};
use crate::backend::{Backend, Failure, MemError, Wake};
use crate::shm::ShmRegion;
use anyhow::{bail, Context, Result};
use gpumux_engine::device::Event;
use std::collections::HashMap;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

/// How long to sleep between polls of a device that wants to be spun
/// (a real GPU, whose completions are seen by polling): what the core does in-process.
const SPIN_WAIT: Duration = Duration::from_micros(20);
/// Polls of the device in a row before the daemon's messages are read again.
const MAX_POLLS: usize = 10_000;
/// Events in one message at most (a frame has a size limit).
const EVENTS_PER_MESSAGE: usize = 4096;

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
    let mut link = Link::new(inherited_socket(fd)?).context("the device link")?;
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
    let mut host = DeviceHost { backend, link, regions: HashMap::new(), broken: false };
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
    /// The context is lost: nothing more is done with the device.
    broken: bool,
}

impl DeviceHost {
    fn run(&mut self) -> Result<()> {
        let mut events: Vec<Event> = Vec::new();
        loop {
            loop {
                match self.link.try_recv::<ToDevice>() {
                    Ok(Some(msg)) => self.handle(msg)?,
                    Ok(None) => break,
                    Err(LinkError::Closed) => return Ok(()),
                    Err(e) => return Err(e).context("reading the daemon's messages"),
                }
            }
            if !self.broken {
                self.poll_device(&mut events)?;
            }
            let timeout = match self.backend.next_wake() {
                _ if self.broken => None,
                Wake::Idle => None,
                Wake::After(d) => Some(d),
                Wake::Spin => Some(SPIN_WAIT),
            };
            self.link.wait_readable(timeout).context("waiting for the daemon")?;
        }
    }

    /// Polls the device until it has nothing more to report now (a device
    /// reports one instant per poll, and may only settle what was submitted
    /// on the next), and sends what it reported, in batches.
    fn poll_device(&mut self, events: &mut Vec<Event>) -> Result<()> {
        for _ in 0..MAX_POLLS {
            let before = events.len();
            if let Err(f) = self.backend.poll(events) {
                events.clear();
                return self.failed(f);
            }
            if events.len() == before {
                break;
            }
            if events.len() >= EVENTS_PER_MESSAGE {
                self.send(FromDevice::Events(std::mem::take(events)))?;
            }
        }
        if events.is_empty() {
            return Ok(());
        }
        self.send(FromDevice::Events(std::mem::take(events)))
    }

    fn send(&mut self, msg: FromDevice) -> Result<()> {
        match self.link.send(&msg, None) {
            // The daemon is gone: the next read ends the loop.
            Ok(()) | Err(LinkError::Closed) => Ok(()),
            Err(e) => Err(e).context("writing to the daemon"),
        }
    }

    /// Reports a device failure; after a lost context the device is left alone.
    fn failed(&mut self, f: Failure) -> Result<()> {
        self.broken = true;
        match f {
            Failure::ContextLost { suspects, what } => self.send(FromDevice::ContextLost { suspects, what }),
            Failure::Fatal(e) => {
                let what = format!("{:#}", anyhow::Error::new(e));
                self.send(FromDevice::Fatal { what })
            }
        }
    }

    fn handle(&mut self, msg: ToDevice) -> Result<()> {
        match msg {
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
                        self.broken = true;
                        self.send(FromDevice::Fatal { what })?;
                    }
                }
                Ok(())
            }
            ToDevice::Unbind { op } => {
                self.backend.unbind(op);
                Ok(())
            }
            ToDevice::Submit(command) => {
                if self.broken {
                    return Ok(());
                }
                match self.backend.submit(command) {
                    Ok(()) => Ok(()),
                    Err(f) => self.failed(f),
                }
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

//! [`Client`]: one connection to gpumuxd, usable from several threads.

use crate::chunk;
use crate::conn::{Connection, PendingReply};
use crate::copier::{Copier, CopyStats};
use crate::error::{ClientError, Result};
use crate::handles::{check_args, Arg, Buffer, Kernel, LaunchConfig, Module};
use crate::host::{HostBuffer, HostTable};
use crate::shm::{SharedRegion, HOST_MEMFD_NAME, MEMFD_NAME};
use gpumux_proto::{
    ClientClass, EventId, Launch, Notice, Reply, Request, Split, Status, StreamId, Welcome, MAGIC, MAX_NAME_BYTES,
    VERSION,
};
use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The shared region a client asks for unless told otherwise (clamped to the
/// daemon's limit): big enough that copies of a few MiB go in a few
/// requests, small enough to cost nothing much per client.
pub const DEFAULT_SHM_BYTES: u64 = 8 << 20;

/// The size the shared region may grow to for large copies unless told
/// otherwise ([`ConnectOptions::shm_max_bytes`]; clamped to the daemon's
/// limit): four slots of 8 MiB, whose DMA takes several times a request's
/// round trip. Measured on an H100 machine, a 1 GiB copy through 32 MiB went
/// faster than through 8 MiB and than through 64-256 MiB (a region that
/// stays in the host's cache between chunks).
pub const DEFAULT_SHM_MAX_BYTES: u64 = 32 << 20;

/// The environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "GPUMUX_SOCKET";

/// How long [`Client::connect`] waits for a daemon to listen on a socket
/// that is not there yet (or refuses), unless told otherwise: a daemon
/// started a moment before (`gpumuxd ... &` then a client, as the README
/// does) binds its socket within tens of ms on the simulated device.
pub const DEFAULT_WAIT_FOR_DAEMON: std::time::Duration = std::time::Duration::from_secs(2);

/// The environment variable that sets [`ConnectOptions::wait_for_daemon`]
/// in milliseconds (`0`: do not wait), for C programs too.
pub const WAIT_ENV: &str = "GPUMUX_CONNECT_WAIT_MS";

/// The environment variable that pins a client to one of the daemon's GPUs
/// (its index, from 0) when [`ConnectOptions::gpu`] does not: for C and
/// Python programs too. Unset: the daemon places the client.
pub const GPU_ENV: &str = "GPUMUX_GPU";

/// The environment variable that declares what bounds a client's kernels
/// (`memory` or `compute`) when [`ConnectOptions::class`] does not: the
/// daemon's `pairs` placement puts memory-bound clients beside
/// compute-bound ones (docs/multi-gpu.md). Unset: not declared.
pub const CLASS_ENV: &str = "GPUMUX_CLASS";

/// How to connect.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// The daemon's socket; `None`: `$GPUMUX_SOCKET`, else
    /// [`gpumux_proto::default_socket_path`].
    pub socket: Option<PathBuf>,
    /// Shown by `gpumux ps` (cut to the protocol's limit).
    pub name: String,
    /// Larger is more urgent, up to the config's limit for this user.
    pub priority: i32,
    /// Share for proportional policies, > 0.
    pub weight: f64,
    /// Size of the shared region for host copies (clamped to the daemon's
    /// limit); 0 attaches none (a client that only asks `Status`).
    pub shm_bytes: u64,
    /// The size the shared region may grow to: a copy larger than the
    /// region replaces it with one of the copy's size rounded up to a power
    /// of two, up to this (clamped to the daemon's limit), once; the larger
    /// region then stays (it is pinned memory of the daemon's: its size is
    /// the client's to choose). At most `shm_bytes`: the region never grows.
    /// Default [`DEFAULT_SHM_MAX_BYTES`].
    pub shm_max_bytes: u64,
    /// Threads that move a copy's bytes between the caller's memory and the
    /// shared region (the caller's included; started on the first copy of
    /// over a MiB). Default: `GPUMUX_COPY_THREADS`, else half the machine's
    /// hardware threads, at most 4; 1 copies on the caller's thread.
    pub copy_threads: usize,
    /// Of those, the threads a copy takes while the daemon says other
    /// clients are busy (each chunk's reply says so): at most
    /// `copy_threads`; 0 takes all of them whatever the daemon says.
    /// Default: `GPUMUX_COPY_THREADS_BESIDE`, else 0 (docs/daemon.md, "A
    /// pageable copy beside other clients": 2 measured no better for the
    /// other clients).
    pub copy_threads_beside: usize,
    /// Offer the daemon shared-memory rings for the conversation (fewer
    /// system calls per request; docs/daemon.md, "The protocol"). Default:
    /// on, unless `GPUMUX_RINGS=0`.
    pub rings: bool,
    /// How long to wait for a daemon to listen when the socket does not
    /// exist yet or refuses (a daemon starting), trying every 10 ms; then
    /// [`ClientError::NoDaemon`] naming the socket and the wait. Default:
    /// `$GPUMUX_CONNECT_WAIT_MS`, else [`DEFAULT_WAIT_FOR_DAEMON`] (2 s).
    pub wait_for_daemon: std::time::Duration,
    /// The GPU to run on, among the daemon's (docs/multi-gpu.md); `None`:
    /// `$GPUMUX_GPU` if set, else wherever the daemon's placement puts it.
    /// A GPU the daemon does not serve is refused, naming those it does.
    /// [`Client::gpu`] says where the client went.
    pub gpu: Option<u32>,
    /// What bounds the client's kernels, for placement; `None`:
    /// `$GPUMUX_CLASS` if set, else not declared.
    pub class: Option<ClientClass>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            socket: None,
            name: program_name(),
            priority: 0,
            weight: 1.0,
            shm_bytes: DEFAULT_SHM_BYTES,
            shm_max_bytes: DEFAULT_SHM_MAX_BYTES,
            copy_threads: crate::copier::default_threads(),
            copy_threads_beside: crate::copier::default_threads_beside(),
            rings: crate::conn::rings_from_env(),
            wait_for_daemon: wait_from_env(),
            gpu: None,
            class: None,
        }
    }
}

/// `options`' GPU, else [`GPU_ENV`]'s; one that is not a number is an error
/// (silently ignored, it would place the client elsewhere than asked).
fn gpu_pin(options: &ConnectOptions) -> Result<Option<u32>> {
    if options.gpu.is_some() {
        return Ok(options.gpu);
    }
    match std::env::var(GPU_ENV) {
        Ok(v) if !v.trim().is_empty() => v.trim().parse::<u32>().map(Some).map_err(|_| {
            ClientError::Invalid(format!("{GPU_ENV}=`{v}` is not a GPU index (0, 1, ...; unset: the daemon places)"))
        }),
        _ => Ok(None),
    }
}

/// `options`' class, else [`CLASS_ENV`]'s; an unknown name is an error
/// (ignored, the client would be placed as if it had said nothing).
fn declared_class(options: &ConnectOptions) -> Result<Option<ClientClass>> {
    if options.class.is_some() {
        return Ok(options.class);
    }
    match std::env::var(CLASS_ENV) {
        Ok(v) if !v.trim().is_empty() => {
            v.trim().parse::<ClientClass>().map(Some).map_err(|e| ClientError::Invalid(format!("{CLASS_ENV}: {e}")))
        }
        _ => Ok(None),
    }
}

/// [`WAIT_ENV`] if set to a number of ms, else [`DEFAULT_WAIT_FOR_DAEMON`].
fn wait_from_env() -> std::time::Duration {
    std::env::var(WAIT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_WAIT_FOR_DAEMON, std::time::Duration::from_millis)
}

/// Connects to `socket`, waiting up to `wait` for a daemon starting to bind
/// it (no file yet, or a stale file it is about to replace: `ECONNREFUSED`).
/// The README's `gpumuxd ... &` then `gpumux ps` failed 9 times in 10 on
/// 717b546, which tried once (issue 36, case 9).
fn connect_socket(socket: &std::path::Path, wait: std::time::Duration) -> Result<UnixStream> {
    let start = std::time::Instant::now();
    loop {
        let source = match UnixStream::connect(socket) {
            Ok(stream) => return Ok(stream),
            Err(e) => e,
        };
        let waited = start.elapsed();
        match source.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused if waited < wait => {
                std::thread::sleep(std::time::Duration::from_millis(10).min(wait - waited));
            }
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                return Err(ClientError::NoDaemon { socket: socket.to_path_buf(), waited: wait, source });
            }
            _ => return Err(ClientError::Connect { socket: socket.to_path_buf(), cause: source }),
        }
    }
}

impl ConnectOptions {
    /// Defaults, named `name`.
    pub fn named(name: impl Into<String>) -> ConnectOptions {
        ConnectOptions { name: name.into(), ..ConnectOptions::default() }
    }

    /// The socket this connects to.
    pub fn socket_path(&self) -> PathBuf {
        match (&self.socket, std::env::var_os(SOCKET_ENV)) {
            (Some(path), _) => path.clone(),
            (None, Some(env)) if !env.is_empty() => PathBuf::from(env),
            _ => gpumux_proto::default_socket_path(),
        }
    }
}

/// This program's file name, the default client name.
fn program_name() -> String {
    std::env::args_os()
        .next()
        .and_then(|a| PathBuf::from(a).file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "client".to_owned())
}

/// An event recorded on a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Event(pub EventId);

/// A connection to gpumuxd. `Sync`: share it between threads by reference or
/// `Arc`; requests from several threads proceed at once, and host copies take
/// turns through the one shared region (copies from and to a [`HostBuffer`]
/// do not). Says goodbye on drop.
pub struct Client {
    /// Shared with the client's host buffers, which detach themselves, and
    /// with the threads of host functions (`launch_host_func`).
    pub(crate) conn: Arc<Connection>,
    welcome: Welcome,
    /// The address ranges of this client's host buffers.
    pub(crate) hosts: Arc<HostTable>,
    /// Held while a host buffer is attached: one descriptor in flight at a
    /// time, as the daemon expects.
    attaching: Mutex<()>,
    /// Bytes of copies that did not wait queued since the last sync: the
    /// next sync polls for about their time (`Connection::send_spinning`).
    async_bytes: AtomicU64,
    /// Held for a whole host copy: the region's slots are the copy's (and
    /// a larger copy may replace the region: [`ConnectOptions::shm_max_bytes`]).
    region: Option<Mutex<SharedRegion>>,
    /// The region's size (0: none), readable while a copy holds the lock.
    shm_bytes: AtomicU64,
    /// The size the region may grow to (the daemon's limit applied); the
    /// region's own size once the daemon refused a larger one.
    shm_max: AtomicU64,
    /// Moves the bytes of copies through the region.
    copier: Copier,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("welcome", &self.welcome).finish_non_exhaustive()
    }
}

impl Client {
    /// Connects, greets the daemon, and attaches a shared region.
    pub fn connect(options: ConnectOptions) -> Result<Client> {
        let gpu = gpu_pin(&options)?;
        let class = declared_class(&options)?;
        let stream = connect_socket(&options.socket_path(), options.wait_for_daemon)?;
        let mut name = options.name;
        if name.len() > MAX_NAME_BYTES {
            let mut end = MAX_NAME_BYTES;
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            name.truncate(end);
        }
        let hello = Request::Hello {
            magic: MAGIC,
            version: VERSION,
            name,
            priority: options.priority,
            weight: options.weight,
            gpu,
            class,
        };
        let (conn, reply) = Connection::handshake(stream, hello, options.rings)?;
        conn.set_urgent(options.priority > 0);
        let Reply::Welcome(welcome) = reply else {
            return Err(unexpected("Hello", &reply));
        };
        let shm_bytes = options.shm_bytes.min(welcome.limits.shm_bytes);
        let shm_bytes = if shm_bytes >= 2 { shm_bytes } else { 0 };
        let shm_max = options.shm_max_bytes.min(welcome.limits.shm_bytes).max(shm_bytes);
        let region = if shm_bytes > 0 {
            let region = SharedRegion::create(shm_bytes, MEMFD_NAME)?;
            expect_done(conn.send(Request::AttachShm { bytes: shm_bytes }, region.fd())?)?;
            Some(Mutex::new(region))
        } else {
            None
        };
        Ok(Client {
            conn: Arc::new(conn),
            welcome,
            hosts: Arc::default(),
            attaching: Mutex::new(()),
            async_bytes: AtomicU64::new(0),
            region,
            shm_bytes: AtomicU64::new(shm_bytes),
            shm_max: AtomicU64::new(shm_max),
            copier: Copier::new(options.copy_threads).beside(options.copy_threads_beside),
        })
    }

    /// Whether the conversation goes through shared-memory rings (the daemon
    /// accepted them; [`ConnectOptions::rings`]).
    pub fn uses_rings(&self) -> bool {
        self.conn.uses_rings()
    }

    /// What the daemon said at the handshake: device, policy, SMs, this client's limits.
    pub fn welcome(&self) -> &Welcome {
        &self.welcome
    }

    /// The GPU the daemon placed this client on (its index among the
    /// daemon's GPUs; 0 on a daemon of one GPU).
    pub fn gpu(&self) -> u32 {
        self.welcome.gpu
    }

    /// Whether the device is simulated (`sim:…`): kernels take time there but compute nothing.
    pub fn is_simulated(&self) -> bool {
        self.welcome.device.starts_with("sim:")
    }

    /// The size of the attached shared region, bytes (0: none). It grows
    /// for a copy larger than it ([`ConnectOptions::shm_max_bytes`]).
    pub fn shm_bytes(&self) -> u64 {
        self.shm_bytes.load(Ordering::Relaxed)
    }

    /// The threads that move the bytes of a copy through the shared region
    /// ([`ConnectOptions::copy_threads`]).
    pub fn copy_threads(&self) -> usize {
        self.copier.threads()
    }

    /// The threads a copy through the shared region takes while other
    /// clients are busy ([`ConnectOptions::copy_threads_beside`], at most
    /// [`Client::copy_threads`]).
    pub fn copy_threads_beside(&self) -> usize {
        self.copier.threads_beside()
    }

    /// What this client's copies through the shared region did so far: its
    /// chunks of a MiB or more, alone and beside other busy clients, and the
    /// threads each went on.
    pub fn copy_stats(&self) -> CopyStats {
        self.copier.stats()
    }

    /// Changes this client's priority (from the next scheduling round).
    pub fn set_priority(&self, priority: i32) -> Result<()> {
        self.done(Request::SetPriority(priority))?;
        self.conn.set_urgent(priority > 0);
        Ok(())
    }

    /// Changes this client's weight (from the next scheduling round).
    pub fn set_weight(&self, weight: f64) -> Result<()> {
        self.done(Request::SetWeight(weight))
    }

    /// Allocates `bytes` of device memory (counted against the quota).
    pub fn alloc(&self, bytes: u64) -> Result<Buffer> {
        match self.conn.call(Request::Alloc { bytes })? {
            Reply::Buffer(id) => Ok(Buffer { handle: id.0, bytes }),
            other => Err(unexpected("Alloc", &other)),
        }
    }

    /// Frees a buffer once the work queued before now is done.
    pub fn free(&self, buffer: Buffer) -> Result<()> {
        self.done(Request::Free(buffer.id()))
    }

    /// Fills `bytes` bytes of `buffer` from `offset` with `value`, in stream order.
    pub fn memset(&self, buffer: &Buffer, offset: u64, value: u8, bytes: u64, stream: StreamId) -> Result<()> {
        let dst = buffer.slice(offset, bytes, "memset")?;
        self.done(Request::Memset { dst, value, bytes, stream })
    }

    /// Host memory of `bytes` bytes (> 0) that the daemon copies from and to
    /// directly, pinned there (the equivalent of `cudaHostAlloc`; see
    /// [`HostBuffer`]). Counted against the daemon's `host_memory` limit for
    /// this client ([`gpumux_proto::Limits::host_memory_bytes`]): over it, the
    /// daemon refuses with [`gpumux_proto::ErrorKind::Quota`] naming the limit.
    /// Pinning a large buffer takes the daemon a few ms.
    pub fn alloc_host(&self, bytes: u64) -> Result<HostBuffer> {
        if bytes == 0 {
            return Err(ClientError::Invalid("a host buffer of 0 bytes".into()));
        }
        let mut region = SharedRegion::create(bytes, HOST_MEMFD_NAME)?;
        let reply = {
            let _one = self.attaching.lock().unwrap_or_else(PoisonError::into_inner);
            self.conn.send(Request::AttachHost { bytes }, region.fd())?.wait()?
        };
        let Reply::HostRegion(id) = reply else {
            return Err(unexpected("AttachHost", &reply));
        };
        // The daemon has its own mapping: the descriptor is not needed any more.
        region.close_fd();
        Ok(HostBuffer::new(region, id, Arc::clone(&self.conn), Arc::clone(&self.hosts)))
    }

    /// Copies `data` to `buffer` at `offset`, in stream order; returns when
    /// the data is on the device. If `data` lies entirely inside one of this
    /// client's [`HostBuffer`]s, the daemon copies it from there directly
    /// (one request, no staging copy, whatever its size); otherwise it goes
    /// through the shared region, in chunks: the client copies each into a
    /// slot of the region (on [`Client::copy_threads`] threads) while the
    /// daemon moves the chunks before it to the device.
    pub fn copy_to_device(&self, buffer: &Buffer, offset: u64, data: &[u8], stream: StreamId) -> Result<()> {
        let dst = buffer.slice(offset, data.len() as u64, "copy to the device")?;
        if let Some(src) = self.hosts.find(data.as_ptr(), data.len()) {
            let request = Request::CopyFromHostRegion { dst, src, bytes: data.len() as u64, stream };
            return self.done_copy(request, data.len() as u64);
        }
        let region = self.region("copy to the device")?;
        let mut region = region.lock().unwrap_or_else(PoisonError::into_inner);
        self.grow_region(&mut region, data.len() as u64)?;
        let chunks = chunk::plan(data.len() as u64, region.len() as u64, chunk::slots_from_env(region.len() as u64));
        run_chunks(
            &self.copier,
            &chunks,
            |c| {
                let at = c.offset as usize;
                region.write(c.shm_offset as usize, &data[at..at + c.bytes as usize], &self.copier);
                self.conn.send(
                    Request::CopyToDevice {
                        dst: buffer.slice(offset + c.offset, c.bytes, "copy to the device")?,
                        shm_offset: c.shm_offset,
                        bytes: c.bytes,
                        stream,
                    },
                    None,
                )
            },
            |_| (),
        )
    }

    /// Copies `out.len()` bytes of `buffer` from `offset` into `out`, in
    /// stream order (after the stream's earlier work); returns when the data
    /// is in `out`. If `out` lies entirely inside one of this client's
    /// [`HostBuffer`]s, the daemon copies into it directly (one request, no
    /// staging copy, whatever its size); otherwise through the shared
    /// region, in chunks, the daemon moving the next chunks into the region
    /// while the client copies one out.
    pub fn copy_to_host(&self, buffer: &Buffer, offset: u64, out: &mut [u8], stream: StreamId) -> Result<()> {
        let src = buffer.slice(offset, out.len() as u64, "copy to the host")?;
        if let Some(dst) = self.hosts.find(out.as_ptr(), out.len()) {
            let request = Request::CopyToHostRegion { src, dst, bytes: out.len() as u64, stream };
            return self.done_copy(request, out.len() as u64);
        }
        let region = self.region("copy to the host")?;
        let mut region = region.lock().unwrap_or_else(PoisonError::into_inner);
        self.grow_region(&mut region, out.len() as u64)?;
        let chunks = chunk::plan(out.len() as u64, region.len() as u64, chunk::slots_from_env(region.len() as u64));
        run_chunks(
            &self.copier,
            &chunks,
            |c| {
                self.conn.send(
                    Request::CopyToHost {
                        src: buffer.slice(offset + c.offset, c.bytes, "copy to the host")?,
                        shm_offset: c.shm_offset,
                        bytes: c.bytes,
                        stream,
                    },
                    None,
                )
            },
            |c| {
                let at = c.offset as usize;
                region.read(c.shm_offset as usize, &mut out[at..at + c.bytes as usize], &self.copier);
            },
        )
    }

    /// [`Client::copy_to_device`] that does not wait for the copy, when
    /// `data` lies inside one of this client's [`HostBuffer`]s
    /// (`cudaMemcpyAsync` from pinned memory): the request is queued on the
    /// stream and the call returns at once; the copy is done once a
    /// [`Client::sync`] of the stream, or an event recorded after it, says
    /// so. The daemon refuses it only if it cannot take it, and that error
    /// comes at the next call that waits for stream work, as a launch's
    /// does. Other memory is copied as [`Client::copy_to_device`] copies it,
    /// returning when done (CUDA does the same for pageable memory).
    ///
    /// A stream of such copies keeps the device's copy engine busy: the
    /// next copy is queued while this one moves, where a copy that waits
    /// leaves the engine idle for a round trip and the requests between
    /// (issue 40's pipeline, `examples/clients/stream_pipeline.rs`).
    ///
    /// # Safety
    /// The device reads `data` after the call returns: it must not be
    /// written until the stream's work up to this copy is done. (Freeing
    /// its [`HostBuffer`] is safe: the daemon keeps the memory until the
    /// copies queued before are done.)
    pub unsafe fn copy_to_device_async(
        &self,
        buffer: &Buffer,
        offset: u64,
        data: &[u8],
        stream: StreamId,
    ) -> Result<()> {
        let dst = buffer.slice(offset, data.len() as u64, "copy to the device")?;
        match self.hosts.find(data.as_ptr(), data.len()) {
            Some(src) => {
                self.async_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                self.deferred(Request::CopyFromHostRegionAsync { dst, src, bytes: data.len() as u64, stream })
            }
            None => self.copy_to_device(buffer, offset, data, stream),
        }
    }

    /// [`Client::copy_to_host`] that does not wait for the copy, when `out`
    /// lies inside one of this client's [`HostBuffer`]s (`cudaMemcpyAsync`
    /// to pinned memory): the data is in `out` once a [`Client::sync`] of
    /// the stream, or an event recorded after the copy, says the stream got
    /// there. Refusals and other memory as [`Client::copy_to_device_async`].
    ///
    /// # Safety
    /// The device writes `out` after the call returns: it must not be read
    /// or written until the stream's work up to this copy is done.
    pub unsafe fn copy_to_host_async(
        &self,
        buffer: &Buffer,
        offset: u64,
        out: &mut [u8],
        stream: StreamId,
    ) -> Result<()> {
        let src = buffer.slice(offset, out.len() as u64, "copy to the host")?;
        match self.hosts.find(out.as_ptr(), out.len()) {
            Some(dst) => {
                self.async_bytes.fetch_add(out.len() as u64, Ordering::Relaxed);
                self.deferred(Request::CopyToHostRegionAsync { src, dst, bytes: out.len() as u64, stream })
            }
            None => self.copy_to_host(buffer, offset, out, stream),
        }
    }

    /// Sends a request answered only when refused (a launch, an
    /// asynchronous copy), after reporting an earlier such refusal.
    fn deferred(&self, request: Request) -> Result<()> {
        if let Some(e) = self.conn.take_deferred_error() {
            return Err(e);
        }
        self.conn.send_deferred(request)
    }

    /// Copies `bytes` bytes between two of this client's buffers, in stream order.
    pub fn copy_device(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        bytes: u64,
        stream: StreamId,
    ) -> Result<()> {
        let src = src.slice(src_offset, bytes, "device copy source")?;
        let dst = dst.slice(dst_offset, bytes, "device copy destination")?;
        self.done(Request::CopyDevice { src, dst, bytes, stream })
    }

    /// Compiles CUDA C `source` (NVRTC `options` such as `-DN=4`) into a
    /// module. A kernel the transformation refuses fails with
    /// [`gpumux_proto::ErrorKind::Transform`] naming the line and the reason.
    pub fn load_module(&self, name: &str, source: &str, options: &[&str]) -> Result<Module> {
        let request = Request::LoadModule {
            name: name.to_owned(),
            source: source.to_owned(),
            options: options.iter().map(|&o| o.to_owned()).collect(),
        };
        match self.conn.call(request)? {
            Reply::Module { module, kernels, log, cached } => {
                Ok(Module::new(module, name.to_owned(), kernels, log, cached))
            }
            other => Err(unexpected("LoadModule", &other)),
        }
    }

    /// Launches `kernel` with `args`, in stream order, without waiting for
    /// the daemon (like a CUDA launch): the arguments are checked here
    /// against the kernel's parameters, and a launch the daemon refuses
    /// (a quota, a shape the kernel cannot take) reports its error at the
    /// next call that waits for stream work ([`Client::sync`],
    /// [`Client::wait_event`], [`Client::query_event`]) or at the next
    /// launch, which is then not sent. Each such error is reported once.
    pub fn launch(&self, kernel: &Kernel, config: &LaunchConfig, args: &[Arg]) -> Result<()> {
        // Issue 35's stage stamps (`gpumux_stamps`; nothing when off).
        let called = gpumux_stamps::now_if_on();
        let launch = self.checked_launch(kernel, config, args)?;
        self.conn.send_deferred_stamped(Request::Launch(launch), called)
    }

    /// The launch of `kernel` that [`Client::launch`] and
    /// [`Client::launch_split`] send: its arguments checked, and an error a
    /// deferred request met reported first.
    fn checked_launch(&self, kernel: &Kernel, config: &LaunchConfig, args: &[Arg]) -> Result<Launch> {
        check_args(kernel, args)?;
        if let Some(e) = self.conn.take_deferred_error() {
            return Err(e);
        }
        Ok(Launch {
            kernel: kernel.id,
            grid: config.grid,
            block: config.block,
            shared_bytes: config.shared_bytes,
            args: args.iter().map(|a| a.0.clone()).collect(),
            stream: config.stream,
            block_time_ns: config.block_time_ns,
        })
    }

    /// Launches `kernel` as [`Client::launch`] does, split over the daemon's
    /// GPUs by block range and merged back on this client's GPU before
    /// anything after it on the stream starts (docs/split.md, "Splitting
    /// in the daemon"). A kernel whose writes the daemon's source analysis
    /// cannot merge is refused with its reasons, reported as a refused
    /// launch is, unless `split.splittable` is [`Splittable::Declared`](crate::Splittable::Declared); a
    /// daemon of one GPU runs it whole.
    pub fn launch_split(&self, kernel: &Kernel, config: &LaunchConfig, args: &[Arg], split: &Split) -> Result<()> {
        let launch = self.checked_launch(kernel, config, args)?;
        self.conn.send_deferred(Request::LaunchSplit { launch, split: split.clone() })
    }

    /// Splits every later launch of `kernel` over the daemon's GPUs
    /// (`Some`), or runs them whole again (`None`). Refused at once, with the
    /// daemon's source analysis's reasons, when the kernel's writes cannot
    /// be merged and `split.splittable` is [`Splittable::IfChecked`](crate::Splittable::IfChecked).
    pub fn split_kernel(&self, kernel: &Kernel, split: Option<&Split>) -> Result<()> {
        self.done(Request::SplitKernel { kernel: kernel.id, split: split.cloned() })
    }

    /// A new stream, independent of the others.
    pub fn create_stream(&self) -> Result<StreamId> {
        match self.conn.call(Request::CreateStream)? {
            Reply::Stream(s) => Ok(s),
            other => Err(unexpected("CreateStream", &other)),
        }
    }

    /// Ends a stream after its queued work.
    pub fn destroy_stream(&self, stream: StreamId) -> Result<()> {
        self.done(Request::DestroyStream(stream))
    }

    /// Waits until everything queued on `stream` before now is done (a
    /// kernel that failed fails this).
    pub fn sync(&self, stream: StreamId) -> Result<()> {
        // After copies that did not wait, the sync likely waits for them:
        // poll about their time rather than sleep and be woken twice.
        let queued = self.async_bytes.swap(0, Ordering::Relaxed);
        let r = if queued > 0 {
            self.conn
                .send_spinning(Request::SyncStream(stream), gpumux_proto::expected_copy_time(queued))
                .and_then(expect_done)
        } else {
            self.done(Request::SyncStream(stream))
        };
        self.deferred_first(r)
    }

    /// Records an event at this point of `stream`.
    pub fn record_event(&self, stream: StreamId) -> Result<Event> {
        match self.conn.call(Request::RecordEvent(stream))? {
            Reply::Event(e) => Ok(Event(e)),
            other => Err(unexpected("RecordEvent", &other)),
        }
    }

    /// Whether the event's work is done (never blocks).
    pub fn query_event(&self, event: Event) -> Result<bool> {
        let r = match self.conn.call(Request::QueryEvent(event.0)) {
            Ok(Reply::Query(done)) => Ok(done),
            Ok(other) => Err(unexpected("QueryEvent", &other)),
            Err(e) => Err(e),
        };
        self.deferred_first(r)
    }

    /// Waits until the event's work is done.
    pub fn wait_event(&self, event: Event) -> Result<()> {
        let r = self.done(Request::WaitEvent(event.0));
        self.deferred_first(r)
    }

    /// Forgets an event.
    pub fn destroy_event(&self, event: Event) -> Result<()> {
        self.done(Request::DestroyEvent(event.0))
    }

    /// The daemon's table of clients (what `gpumux ps` shows).
    pub fn status(&self) -> Result<Status> {
        match self.conn.call(Request::Status)? {
            Reply::Status(s) => Ok(s),
            other => Err(unexpected("Status", &other)),
        }
    }

    /// The notices the daemon sent since the last call (a lost context, a shutdown).
    pub fn take_notices(&self) -> Vec<Notice> {
        self.conn.take_notices()
    }

    /// Says goodbye and waits for the daemon's answer: its work is retreated
    /// and its memory freed. Dropping a client does the same, silently.
    pub fn close(self) -> Result<()> {
        self.goodbye()
    }

    fn goodbye(&self) -> Result<()> {
        if self.conn.is_closed() {
            return Ok(());
        }
        self.done(Request::Goodbye)
    }

    /// `r`, unless an earlier launch's error is still unreported: that
    /// error first (an error of `r` itself then stays for the next call).
    pub(crate) fn deferred_first<T>(&self, r: Result<T>) -> Result<T> {
        match self.conn.take_deferred_error() {
            None => r,
            Some(earlier) => {
                if let Err(e) = r {
                    self.conn.defer_error(e);
                }
                Err(earlier)
            }
        }
    }

    pub(crate) fn done(&self, request: Request) -> Result<()> {
        expect_done(self.conn.send(request, None)?)
    }

    /// [`Client::done`] for a copy of `bytes` answered when done: the call
    /// and the reader thread poll for about the copy's time instead of
    /// sleeping (`Connection::send_spinning`).
    pub(crate) fn done_copy(&self, request: Request, bytes: u64) -> Result<()> {
        expect_done(self.conn.send_spinning(request, gpumux_proto::expected_copy_time(bytes))?)
    }

    /// Before a copy of `bytes` through `region` (its lock held, so no copy
    /// uses it): replaces a region smaller than the copy with one of the
    /// copy's size rounded up to a power of two, at most `shm_max`. The
    /// daemon lets the old one go once this client's work queued before is
    /// done. A region the daemon will not take (pinned memory short) leaves
    /// the old one in use for good (no later copy asks again), and a memfd
    /// that cannot be made leaves it for this copy; only a connection that
    /// is gone fails the copy.
    fn grow_region(&self, region: &mut SharedRegion, bytes: u64) -> Result<()> {
        let have = region.len() as u64;
        let max = self.shm_max.load(Ordering::Relaxed);
        if bytes <= have || have >= max {
            return Ok(());
        }
        let want = bytes.checked_next_power_of_two().unwrap_or(u64::MAX).min(max);
        let Ok(larger) = SharedRegion::create(want, MEMFD_NAME) else { return Ok(()) };
        let attached = {
            let _one = self.attaching.lock().unwrap_or_else(PoisonError::into_inner);
            self.conn.send(Request::AttachShm { bytes: want }, larger.fd()).and_then(expect_done)
        };
        match attached {
            Ok(()) => {
                *region = larger;
                self.shm_bytes.store(want, Ordering::Relaxed);
                Ok(())
            }
            Err(e) if e.is_fatal() => Err(e),
            Err(_) => {
                self.shm_max.store(have, Ordering::Relaxed);
                Ok(())
            }
        }
    }

    fn region(&self, what: &str) -> Result<&Mutex<SharedRegion>> {
        self.region.as_ref().ok_or_else(|| {
            ClientError::Invalid(format!(
                "a {what} needs a shared region, and this client has none (connected with shm_bytes 0, or the daemon allows none)"
            ))
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Best effort: a daemon that is gone has cleaned up already.
        let _ = self.goodbye();
        // This process's stage stamps, if on (issue 35).
        gpumux_stamps::flush_or_say();
    }
}

/// Sends planned chunks with at most one in flight per slot. `send` writes a chunk
/// (into the region, for a copy to the device) and sends its request;
/// `landed` runs once a chunk's reply is in (reading the region, for a copy
/// to the host). Each reply tells `copier` whether other clients are busy,
/// so the chunks after it take the threads that fit. A chunk is sent only
/// after the one whose slot it reuses has landed. On an error, the replies
/// still in flight are awaited before returning, so the region is idle when
/// the caller lets go of it.
fn run_chunks(
    copier: &Copier,
    chunks: &[chunk::Chunk],
    mut send: impl FnMut(&chunk::Chunk) -> Result<PendingReply>,
    mut landed: impl FnMut(&chunk::Chunk),
) -> Result<()> {
    let mut in_flight: VecDeque<(usize, PendingReply)> = VecDeque::new();
    let outcome = (|| {
        for (i, c) in chunks.iter().enumerate() {
            if let Some(reused) = c.reuses {
                while in_flight.front().is_some_and(|(j, _)| *j <= reused) {
                    if let Some((j, pending)) = in_flight.pop_front() {
                        expect_chunk(pending, copier)?;
                        landed(&chunks[j]);
                    }
                }
            }
            in_flight.push_back((i, send(c)?));
        }
        while let Some((j, pending)) = in_flight.pop_front() {
            expect_chunk(pending, copier)?;
            landed(&chunks[j]);
        }
        Ok(())
    })();
    // After an error: the daemon may still be using the region for these.
    for (_, pending) in in_flight {
        let _ = pending.wait();
    }
    outcome
}

/// Waits for a chunk's reply: `Copied`, whose count of other busy clients
/// goes to `copier`, or `Done` (from a daemon that does not count them:
/// the copier keeps what it knew).
fn expect_chunk(pending: PendingReply, copier: &Copier) -> Result<()> {
    let request = pending.request();
    match pending.wait()? {
        Reply::Copied { others } => {
            copier.set_others_busy(others);
            Ok(())
        }
        Reply::Done => Ok(()),
        other => Err(unexpected(request, &other)),
    }
}

/// Waits for a reply that must be `Done`.
pub(crate) fn expect_done(pending: PendingReply) -> Result<()> {
    let request = pending.request();
    match pending.wait()? {
        Reply::Done => Ok(()),
        other => Err(unexpected(request, &other)),
    }
}

pub(crate) fn unexpected(request: &'static str, reply: &Reply) -> ClientError {
    let got = match reply {
        Reply::Welcome(_) => "Welcome",
        Reply::Done => "Done",
        Reply::Buffer(_) => "Buffer",
        Reply::Module { .. } => "Module",
        Reply::Stream(_) => "Stream",
        Reply::Event(_) => "Event",
        Reply::Query(_) => "Query",
        Reply::Status(_) => "Status",
        Reply::HostRegion(_) => "HostRegion",
        Reply::Elapsed(_) => "Elapsed",
        Reply::Properties(_) => "Properties",
        Reply::Occupancy(_) => "Occupancy",
        Reply::HostFunc(_) => "HostFunc",
        Reply::Copied { .. } => "Copied",
    };
    ClientError::Protocol { request, got: format!("a {got} reply") }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option wins over `GPUMUX_GPU`; a `GPUMUX_GPU` that is not a
    /// number is an error naming it, not a silent "anywhere". (The one test
    /// of this crate's that sets the variable.)
    #[test]
    fn the_gpu_comes_from_the_option_else_the_environment_and_a_bad_one_is_an_error() {
        let pinned = ConnectOptions { gpu: Some(3), ..ConnectOptions::named("t") };
        std::env::set_var(GPU_ENV, "1");
        assert_eq!(gpu_pin(&pinned).ok(), Some(Some(3)));
        assert_eq!(gpu_pin(&ConnectOptions::named("t")).ok(), Some(Some(1)));
        std::env::set_var(GPU_ENV, "second");
        let e = gpu_pin(&ConnectOptions::named("t")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("GPUMUX_GPU=`second`"), "{e}");
        std::env::set_var(GPU_ENV, "");
        assert_eq!(gpu_pin(&ConnectOptions::named("t")).ok(), Some(None));
        std::env::remove_var(GPU_ENV);
        assert_eq!(gpu_pin(&ConnectOptions::named("t")).ok(), Some(None));
    }

    /// The same for the class (the one test that sets `GPUMUX_CLASS`).
    #[test]
    fn the_class_comes_from_the_option_else_the_environment_and_a_bad_one_is_an_error() {
        let declared = ConnectOptions { class: Some(ClientClass::Compute), ..ConnectOptions::named("t") };
        std::env::set_var(CLASS_ENV, "memory");
        assert_eq!(declared_class(&declared).ok(), Some(Some(ClientClass::Compute)));
        assert_eq!(declared_class(&ConnectOptions::named("t")).ok(), Some(Some(ClientClass::Memory)));
        std::env::set_var(CLASS_ENV, "fast");
        let e = declared_class(&ConnectOptions::named("t")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("GPUMUX_CLASS") && e.contains("`fast`"), "{e}");
        std::env::remove_var(CLASS_ENV);
        assert_eq!(declared_class(&ConnectOptions::named("t")).ok(), Some(None));
    }
}

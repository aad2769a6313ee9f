//! What a bench job runs on: a stream of its own, natively in a CUDA context
//! of its process ([`NativeGpu`]) or through gpumuxd as a client
//! ([`DaemonGpu`]). The jobs ([`super::jobs`]) are written once against
//! [`JobGpu`], so every setting runs the same kernels the same way.
//!
//! Host memory for copies is the GPU's too ([`JobGpu::host_alloc`]): both
//! paths give both kinds (natively a `Vec` and `cuMemHostAlloc` memory;
//! through gpumuxd a `Vec`, copied through the client's shared region, and a
//! `HostBuffer`, which the daemon copies directly), and the programs
//! experiment names the kind a row ran with ([`HostMemory`]).

use anyhow::{anyhow, bail, Context, Result};
use gpumux_client::StreamId;
use gpumux_client::{Arg, Buffer, Client, ConnectOptions, HostBuffer, Kernel, LaunchConfig, Module as ClientModule};
use gpumux_cuda::runtime::{DeviceBuffer, Event, Function, Gpu, HostMapped, Module, Params, Stream};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::Arc;

/// The bench's kernels (one module).
pub const SOURCE: &str = include_str!("kernels.cu");
/// The module's name, as the daemon and NVRTC see it.
pub const MODULE: &str = "gpumux_bench";

/// A kernel argument.
#[derive(Clone, Copy, Debug)]
pub enum KArg {
    /// A buffer of the job, by the index [`JobGpu::alloc`] returned.
    Buf(usize),
    U32(u32),
    U64(u64),
    F32(f32),
    I32(i32),
}

/// The host memory a job copies from and to.
///
/// A path that cannot give a kind refuses it in [`JobGpu::host_alloc`]; a
/// kind the client library learns later is one more variant, served there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostMemory {
    /// Ordinary pageable memory, a `Vec<u8>`: what a program has unless it
    /// asks for more (the driver stages its copies through pinned buffers).
    Pageable,
    /// Page-locked memory the copy engines read and write directly, with
    /// no staging copy: natively the driver's (`cuMemHostAlloc`), through
    /// gpumuxd the client library's (`Client::alloc_host`, a `HostBuffer`
    /// the daemon pins).
    Pinned,
}

impl HostMemory {
    /// Its name in tables.
    pub fn name(self) -> &'static str {
        match self {
            HostMemory::Pageable => "pageable",
            HostMemory::Pinned => "pinned",
        }
    }
}

/// One job's stream on a GPU (module doc).
pub trait JobGpu {
    /// A zeroed device buffer of `bytes`; returns its index.
    fn alloc(&mut self, bytes: u64) -> Result<usize>;
    /// Queues `kernel` on the job's stream. `block_ns` is the block time the
    /// simulated device assumes (the real GPU ignores it).
    fn launch(&mut self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg], block_ns: u64) -> Result<()>;
    /// Marks this point of the stream; [`JobGpu::wait_marks`] waits for marks.
    fn mark(&mut self) -> Result<()>;
    /// Waits until at most `keep` marks are still ahead of the GPU.
    fn wait_marks(&mut self, keep: usize) -> Result<()>;
    /// Waits for everything queued.
    fn sync(&mut self) -> Result<()>;
    /// The first `bytes` of buffer `buf`.
    fn download(&mut self, buf: usize, bytes: u64) -> Result<Vec<u8>>;
    /// SMs, and resident blocks of `threads` threads of `kernel` per SM.
    fn shape(&mut self, kernel: &str, threads: u32) -> Result<(u32, u32)>;
    /// Whether the device is simulated: kernels take their time and compute
    /// nothing (copies do move the bytes).
    fn simulated(&self) -> bool;
    /// Sets every byte of buffer `buf` to `byte`, in stream order.
    fn memset(&mut self, buf: usize, byte: u8) -> Result<()>;
    /// `bytes` of zeroed host memory of `kind` for copies; returns its index.
    fn host_alloc(&mut self, kind: HostMemory, bytes: u64) -> Result<usize>;
    /// Host buffer `host`'s bytes, to fill or read. Waits for the stream
    /// first, so no copy of this job is using them.
    fn host(&mut self, host: usize) -> Result<&mut [u8]>;
    /// Copies all of host buffer `host` to the start of buffer `buf`, in
    /// stream order (it may return before the copy is done: sync to know).
    fn upload(&mut self, buf: usize, host: usize) -> Result<()>;
    /// Copies the start of buffer `buf` into all of host buffer `host`, in
    /// stream order (it may return before the copy is done: sync to know).
    fn download_into(&mut self, buf: usize, host: usize) -> Result<()>;
}

/// A process's native CUDA context and the bench module, shared by its jobs.
pub struct NativeProcess {
    gpu: Arc<Gpu>,
    module: Arc<Module>,
}

impl NativeProcess {
    /// Opens GPU `ordinal` (the primary context) and compiles the bench's kernels with NVRTC.
    pub fn open(ordinal: i32) -> Result<NativeProcess> {
        let gpu = Arc::new(Gpu::open(ordinal).with_context(|| format!("opening cuda:{ordinal}"))?);
        let module = gpu.module(MODULE, SOURCE).context("compiling the bench kernels with NVRTC")?;
        Ok(NativeProcess { gpu, module })
    }

    /// A job's stream on this context, urgent (the highest stream priority) or not (the lowest).
    pub fn job(&self, urgent: bool) -> Result<NativeGpu> {
        self.gpu.bind()?;
        let stream = if urgent { Stream::high(&self.gpu)? } else { Stream::low(&self.gpu)? };
        Ok(NativeGpu {
            gpu: self.gpu.clone(),
            module: self.module.clone(),
            functions: HashMap::new(),
            stream,
            buffers: Vec::new(),
            hosts: Vec::new(),
            marks: VecDeque::new(),
        })
    }
}

/// A native job's host memory.
enum NativeHost {
    Pageable(Vec<u8>),
    Pinned(HostMapped),
}

impl NativeHost {
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            NativeHost::Pageable(v) => v,
            // SAFETY: the mapping owns `bytes` bytes at its host address
            // while it lives; `&mut self` makes this the only host view, and
            // the job syncs its stream before handing it out (JobGpu::host),
            // so no copy touches it meanwhile.
            NativeHost::Pinned(m) => unsafe { std::slice::from_raw_parts_mut(m.host_mut_ptr(), m.bytes) },
        }
    }
}

/// A job's stream in its process's native context.
pub struct NativeGpu {
    gpu: Arc<Gpu>,
    module: Arc<Module>,
    functions: HashMap<String, Function>,
    stream: Stream,
    buffers: Vec<DeviceBuffer>,
    /// Host memory of the copies; a copy queued on `stream` may be reading
    /// or writing it until the stream is synced (see the Drop impl).
    hosts: Vec<NativeHost>,
    marks: VecDeque<Event>,
}

impl Drop for NativeGpu {
    /// Waits for the stream before the host memory goes: a copy still
    /// queued must not read or write freed memory.
    fn drop(&mut self) {
        if !self.hosts.is_empty() {
            let _ = self.stream.sync();
        }
    }
}

impl NativeGpu {
    /// Makes the context current on the calling thread (each job runs on a thread of its own).
    pub fn bind(&self) -> Result<()> {
        Ok(self.gpu.bind()?)
    }

    fn function(&mut self, name: &str) -> Result<Function> {
        if let Some(f) = self.functions.get(name) {
            return Ok(f.clone());
        }
        let f = self.module.function(name)?;
        self.functions.insert(name.to_owned(), f.clone());
        Ok(f)
    }
}

impl JobGpu for NativeGpu {
    fn alloc(&mut self, bytes: u64) -> Result<usize> {
        let b = DeviceBuffer::new(usize::try_from(bytes)?)?;
        b.fill(0)?;
        self.buffers.push(b);
        Ok(self.buffers.len() - 1)
    }

    fn launch(&mut self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg], _block_ns: u64) -> Result<()> {
        let f = self.function(kernel)?;
        let mut p = Params::default();
        for a in args {
            match *a {
                KArg::Buf(i) => p.ptr(self.buffers.get(i).ok_or_else(|| anyhow!("no buffer {i}"))?.ptr),
                KArg::U32(v) => p.u32(v),
                KArg::U64(v) => p.u64(v),
                KArg::F32(v) => p.push_bytes(&v.to_le_bytes()),
                KArg::I32(v) => p.push_bytes(&v.to_le_bytes()),
            };
        }
        // SAFETY: the jobs pass each kernel's arguments in its signature's
        // order and types (kernels.cu), and buffers of the sizes it indexes.
        unsafe { f.launch(grid, block, 0, &self.stream, &mut p)? };
        Ok(())
    }

    fn mark(&mut self) -> Result<()> {
        let e = Event::new_sync_only()?;
        e.record(&self.stream)?;
        self.marks.push_back(e);
        Ok(())
    }

    fn wait_marks(&mut self, keep: usize) -> Result<()> {
        while self.marks.len() > keep {
            if let Some(e) = self.marks.pop_front() {
                e.sync()?;
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        self.marks.clear();
        Ok(self.stream.sync()?)
    }

    fn download(&mut self, buf: usize, bytes: u64) -> Result<Vec<u8>> {
        let b = self.buffers.get(buf).ok_or_else(|| anyhow!("no buffer {buf}"))?;
        Ok(b.download_prefix(usize::try_from(bytes)?)?)
    }

    fn shape(&mut self, kernel: &str, threads: u32) -> Result<(u32, u32)> {
        Ok((self.gpu.sm_count(), self.function(kernel)?.blocks_per_sm(threads, 0)?))
    }

    fn simulated(&self) -> bool {
        false
    }

    fn memset(&mut self, buf: usize, byte: u8) -> Result<()> {
        let b = self.buffers.get(buf).ok_or_else(|| anyhow!("no buffer {buf}"))?;
        // SAFETY: the whole of a live allocation of this job; it lives until
        // the job ends, and the job syncs before its buffers go.
        unsafe { self.stream.memset_async(b.ptr, byte, b.bytes)? };
        Ok(())
    }

    fn host_alloc(&mut self, kind: HostMemory, bytes: u64) -> Result<usize> {
        let bytes = usize::try_from(bytes)?;
        self.hosts.push(match kind {
            HostMemory::Pageable => NativeHost::Pageable(vec![0u8; bytes]),
            HostMemory::Pinned => NativeHost::Pinned(
                HostMapped::new(bytes).with_context(|| format!("{bytes} bytes of pinned host memory"))?,
            ),
        });
        Ok(self.hosts.len() - 1)
    }

    fn host(&mut self, host: usize) -> Result<&mut [u8]> {
        self.stream.sync()?;
        Ok(self.hosts.get_mut(host).ok_or_else(|| anyhow!("no host buffer {host}"))?.bytes())
    }

    fn upload(&mut self, buf: usize, host: usize) -> Result<()> {
        let b = self.buffers.get(buf).ok_or_else(|| anyhow!("no buffer {buf}"))?;
        let h = self.hosts.get_mut(host).ok_or_else(|| anyhow!("no host buffer {host}"))?.bytes();
        if h.len() > b.bytes {
            bail!("an upload of {} bytes into a buffer of {}", h.len(), b.bytes);
        }
        // SAFETY: `h` is host memory of this job that stays until its stream
        // is synced (JobGpu::host and Drop sync first); the range is inside `b`.
        unsafe { self.stream.copy_to_device_async(b.ptr, h.as_ptr(), h.len())? };
        Ok(())
    }

    fn download_into(&mut self, buf: usize, host: usize) -> Result<()> {
        let b = self.buffers.get(buf).ok_or_else(|| anyhow!("no buffer {buf}"))?;
        let h = self.hosts.get_mut(host).ok_or_else(|| anyhow!("no host buffer {host}"))?.bytes();
        if h.len() > b.bytes {
            bail!("a download of {} bytes from a buffer of {}", h.len(), b.bytes);
        }
        // SAFETY: as in `upload`; nothing else reads or writes `h` before
        // the stream is synced.
        unsafe { self.stream.copy_to_host_async(h.as_mut_ptr(), b.ptr, h.len())? };
        Ok(())
    }
}

/// A job as a client of gpumuxd: a connection of its own (its priority is the client's).
pub struct DaemonGpu {
    client: Client,
    module: ClientModule,
    kernels: HashMap<String, Kernel>,
    stream: StreamId,
    buffers: Vec<Buffer>,
    /// Host memory of the copies (the client library's copies return when
    /// they are done, so nothing uses it between calls).
    hosts: Vec<DaemonHost>,
    marks: VecDeque<gpumux_client::Event>,
}

/// A daemon job's host memory.
enum DaemonHost {
    /// Copied through the client's shared region.
    Pageable(Vec<u8>),
    /// Copied by the daemon directly.
    Pinned(HostBuffer),
}

impl DaemonHost {
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            DaemonHost::Pageable(v) => v,
            DaemonHost::Pinned(h) => h,
        }
    }
}

impl DaemonGpu {
    /// Connects to the daemon at `socket` as `name` with `priority`, and loads the bench module.
    pub fn connect(socket: &Path, name: &str, priority: i32) -> Result<DaemonGpu> {
        let options = ConnectOptions { socket: Some(socket.to_path_buf()), priority, ..ConnectOptions::named(name) };
        let client =
            Client::connect(options).with_context(|| format!("connecting to gpumuxd at {}", socket.display()))?;
        let module = client.load_module(MODULE, SOURCE, &[]).context("loading the bench kernels into gpumuxd")?;
        let stream = client.create_stream()?;
        Ok(DaemonGpu {
            client,
            module,
            kernels: HashMap::new(),
            stream,
            buffers: Vec::new(),
            hosts: Vec::new(),
            marks: VecDeque::new(),
        })
    }
}

impl JobGpu for DaemonGpu {
    fn alloc(&mut self, bytes: u64) -> Result<usize> {
        let b = self.client.alloc(bytes)?;
        self.client.memset(&b, 0, 0, bytes, self.stream)?;
        self.buffers.push(b);
        Ok(self.buffers.len() - 1)
    }

    fn launch(&mut self, kernel: &str, grid: [u32; 3], block: [u32; 3], args: &[KArg], block_ns: u64) -> Result<()> {
        if !self.kernels.contains_key(kernel) {
            self.kernels.insert(kernel.to_owned(), self.module.kernel(kernel)?);
        }
        let k = &self.kernels[kernel];
        let mut a = Vec::with_capacity(args.len());
        for arg in args {
            a.push(match *arg {
                KArg::Buf(i) => Arg::buffer(self.buffers.get(i).ok_or_else(|| anyhow!("no buffer {i}"))?),
                KArg::U32(v) => Arg::bytes(v.to_le_bytes()),
                KArg::U64(v) => Arg::bytes(v.to_le_bytes()),
                KArg::F32(v) => Arg::bytes(v.to_le_bytes()),
                KArg::I32(v) => Arg::bytes(v.to_le_bytes()),
            });
        }
        let config = LaunchConfig::new(grid, block).stream(self.stream).block_time_ns(block_ns.max(1));
        Ok(self.client.launch(k, &config, &a)?)
    }

    fn mark(&mut self) -> Result<()> {
        let e = self.client.record_event(self.stream)?;
        self.marks.push_back(e);
        Ok(())
    }

    fn wait_marks(&mut self, keep: usize) -> Result<()> {
        while self.marks.len() > keep {
            if let Some(e) = self.marks.pop_front() {
                self.client.wait_event(e)?;
                self.client.destroy_event(e)?;
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        for e in self.marks.drain(..) {
            self.client.destroy_event(e)?;
        }
        Ok(self.client.sync(self.stream)?)
    }

    fn download(&mut self, buf: usize, bytes: u64) -> Result<Vec<u8>> {
        let b = self.buffers.get(buf).ok_or_else(|| anyhow!("no buffer {buf}"))?;
        let mut out = vec![0u8; usize::try_from(bytes.min(b.len()))?];
        self.client.copy_to_host(b, 0, &mut out, self.stream)?;
        Ok(out)
    }

    /// The daemon's SM count (what its engine schedules) and, as the daemon
    /// does not say, 2048 threads per SM (every GPU since Volta).
    fn shape(&mut self, _kernel: &str, threads: u32) -> Result<(u32, u32)> {
        Ok((self.client.welcome().sms, (2048 / threads.max(1)).max(1)))
    }

    fn simulated(&self) -> bool {
        self.client.is_simulated()
    }

    fn memset(&mut self, buf: usize, byte: u8) -> Result<()> {
        let b = self.buffers.get(buf).ok_or_else(|| anyhow!("no buffer {buf}"))?;
        Ok(self.client.memset(b, 0, byte, b.len(), self.stream)?)
    }

    fn host_alloc(&mut self, kind: HostMemory, bytes: u64) -> Result<usize> {
        self.hosts.push(match kind {
            HostMemory::Pageable => DaemonHost::Pageable(vec![0u8; usize::try_from(bytes)?]),
            HostMemory::Pinned => DaemonHost::Pinned(
                self.client
                    .alloc_host(bytes)
                    .with_context(|| format!("a host buffer of {bytes} bytes from gpumuxd"))?,
            ),
        });
        Ok(self.hosts.len() - 1)
    }

    fn host(&mut self, host: usize) -> Result<&mut [u8]> {
        Ok(self.hosts.get_mut(host).ok_or_else(|| anyhow!("no host buffer {host}"))?.bytes())
    }

    fn upload(&mut self, buf: usize, host: usize) -> Result<()> {
        let b = self.buffers.get(buf).ok_or_else(|| anyhow!("no buffer {buf}"))?;
        let h = self.hosts.get_mut(host).ok_or_else(|| anyhow!("no host buffer {host}"))?.bytes();
        Ok(self.client.copy_to_device(b, 0, h, self.stream)?)
    }

    fn download_into(&mut self, buf: usize, host: usize) -> Result<()> {
        let b = self.buffers.get(buf).ok_or_else(|| anyhow!("no buffer {buf}"))?;
        let h = self.hosts.get_mut(host).ok_or_else(|| anyhow!("no host buffer {host}"))?.bytes();
        Ok(self.client.copy_to_host(b, 0, h, self.stream)?)
    }
}

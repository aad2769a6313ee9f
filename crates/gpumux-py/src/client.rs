//! [`Client`]: one connection to gpumuxd, with the calls the Python package
//! builds on; [`Module`] and [`Kernel`].
//!
//! Every call that waits for the daemon releases the GIL, so other Python
//! threads run meanwhile (and may use the same client: the library's client
//! is `Sync`). A launch keeps it: it only queues a request, and releasing and
//! taking the GIL back would be most of its cost.

use crate::args;
use crate::errors::{self, IntoPy};
use crate::memory::Memory;
use gpumux_client::{ConnectOptions, Event, LaunchConfig, Notice, StreamId};
use gpumux_proto::EventId;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// The library's client, shared with the memory it allocated; `None` once
/// closed. Calls take the lock for reading, so they proceed at once; `close`
/// takes it for writing, after the calls under way.
pub struct Shared {
    client: RwLock<Option<gpumux_client::Client>>,
}

impl Shared {
    /// Runs `f` on the client with the GIL released, then raises its error.
    pub fn call<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&gpumux_client::Client) -> gpumux_client::Result<T> + Send,
    ) -> PyResult<T> {
        py.detach(|| self.client.read().unwrap_or_else(PoisonError::into_inner).as_ref().map(f))
            .ok_or_else(closed)?
            .py_err()
    }

    /// As [`Shared::call`], but a closed client is no error (the daemon freed
    /// what it had).
    pub fn call_if_open(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&gpumux_client::Client) -> gpumux_client::Result<()> + Send,
    ) -> PyResult<()> {
        self.call(py, |c| f(c)).or_else(|e| if self.is_closed() { Ok(()) } else { Err(e) })
    }

    /// Runs `f` with the GIL held (a launch: see the module's doc).
    fn call_held<T>(&self, f: impl FnOnce(&gpumux_client::Client) -> gpumux_client::Result<T>) -> PyResult<T> {
        let guard = self.client.read().unwrap_or_else(PoisonError::into_inner);
        match guard.as_ref() {
            Some(c) => f(c).py_err(),
            None => Err(closed()),
        }
    }

    /// Frees `buffer` if the client is open, ignoring errors (a destructor's).
    pub fn free_quietly(&self, buffer: gpumux_client::Buffer) {
        let guard = self.client.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = guard.as_ref() {
            let _ = c.free(buffer);
        }
    }

    fn is_closed(&self) -> bool {
        self.client.read().unwrap_or_else(PoisonError::into_inner).is_none()
    }
}

fn closed() -> PyErr {
    errors::raise("ClientClosed", "this gpumux client is closed (close() was called, or its `with` block ended)", true)
}

/// A dict of `value`'s fields, named as in Rust (the `status` tables).
macro_rules! dict_of {
    ($py:expr, $value:expr; $($field:ident),+ $(,)?) => {{
        let d = PyDict::new($py);
        $(d.set_item(stringify!($field), &$value.$field)?;)+
        d
    }};
}

/// A connection to gpumuxd (`gpumux.Client` wraps it).
#[pyclass(module = "gpumux._native", frozen)]
pub struct Client {
    shared: Arc<Shared>,
    welcome: gpumux_client::Welcome,
    socket: String,
}

#[pymethods]
impl Client {
    /// Connects: `socket` None is `$GPUMUX_SOCKET`, else the default path;
    /// `wait_ms` None is `$GPUMUX_CONNECT_WAIT_MS`, else 2 s.
    #[new]
    #[pyo3(signature = (socket=None, name=None, priority=0, weight=1.0, wait_ms=None, copy_threads=None))]
    fn new(
        py: Python<'_>,
        socket: Option<std::path::PathBuf>,
        name: Option<String>,
        priority: i32,
        weight: f64,
        wait_ms: Option<u64>,
        copy_threads: Option<usize>,
    ) -> PyResult<Client> {
        let mut options = ConnectOptions { socket, priority, weight, ..ConnectOptions::default() };
        if let Some(name) = name {
            options.name = name;
        }
        if let Some(ms) = wait_ms {
            options.wait_for_daemon = Duration::from_millis(ms);
        }
        if let Some(n) = copy_threads {
            options.copy_threads = n.max(1);
        }
        let socket = options.socket_path().to_string_lossy().into_owned();
        let client = py.detach(|| gpumux_client::Client::connect(options)).py_err()?;
        let welcome = client.welcome().clone();
        Ok(Client { shared: Arc::new(Shared { client: RwLock::new(Some(client)) }), welcome, socket })
    }

    /// The socket it connected to.
    #[getter]
    fn socket(&self) -> &str {
        &self.socket
    }

    /// The device, in words (`sim:h100`, `NVIDIA H100 80GB HBM3 (cuda:0)`).
    #[getter]
    fn device(&self) -> &str {
        &self.welcome.device
    }

    /// The daemon's scheduling policy.
    #[getter]
    fn policy(&self) -> &str {
        &self.welcome.policy
    }

    /// The device's SMs.
    #[getter]
    fn sms(&self) -> u32 {
        self.welcome.sms
    }

    /// This client's number in `gpumux ps`.
    #[getter]
    fn client_id(&self) -> u64 {
        self.welcome.client
    }

    /// Whether the device is simulated: kernels take time there but compute nothing.
    #[getter]
    fn is_simulated(&self) -> bool {
        self.welcome.device.starts_with("sim:")
    }

    /// This client's limits from the daemon's config.
    #[getter]
    fn limits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let l = &self.welcome.limits;
        let d = PyDict::new(py);
        d.set_item("max_priority", l.max_priority)?;
        d.set_item("max_weight", l.max_weight)?;
        d.set_item("memory_bytes", l.memory_bytes)?;
        d.set_item("queued_ops", l.queued_ops)?;
        d.set_item("shm_bytes", l.shm_bytes)?;
        d.set_item("host_memory_bytes", l.host_memory_bytes)?;
        Ok(d)
    }

    /// Whether `close()` ran.
    #[getter]
    fn closed(&self) -> bool {
        self.shared.is_closed()
    }

    fn set_priority(&self, py: Python<'_>, priority: i32) -> PyResult<()> {
        self.shared.call(py, |c| c.set_priority(priority))
    }

    fn set_weight(&self, py: Python<'_>, weight: f64) -> PyResult<()> {
        self.shared.call(py, |c| c.set_weight(weight))
    }

    /// `nbytes` (> 0) of device memory.
    fn alloc(&self, py: Python<'_>, nbytes: u64) -> PyResult<Memory> {
        let buffer = self.shared.call(py, |c| c.alloc(nbytes))?;
        Ok(Memory::new(Arc::clone(&self.shared), buffer))
    }

    fn memset(
        &self,
        py: Python<'_>,
        memory: &Memory,
        offset: u64,
        value: u8,
        nbytes: u64,
        stream: u32,
    ) -> PyResult<()> {
        let b = self.own(memory)?;
        self.shared.call(py, |c| c.memset(&b, offset, value, nbytes, StreamId(stream)))
    }

    /// Copies `nbytes` between host address `address` and `memory` at
    /// `offset`: to the device if `to_device`, else to the host.
    ///
    /// Private to the package: `address` must be the start of `nbytes` bytes
    /// (readable, or writable for a copy to the host) that stay alive for the
    /// call and that nothing else touches meanwhile (the package passes a
    /// NumPy array's data, holding the array).
    #[allow(clippy::too_many_arguments)]
    fn copy_host(
        &self,
        py: Python<'_>,
        memory: &Memory,
        offset: u64,
        address: usize,
        nbytes: usize,
        stream: u32,
        to_device: bool,
    ) -> PyResult<()> {
        let b = self.own(memory)?;
        let span = HostSpan::new(address, nbytes)?;
        let stream = StreamId(stream);
        // SAFETY: the caller's contract above.
        self.shared.call(py, |c| {
            if to_device {
                c.copy_to_device(&b, offset, unsafe { span.bytes() }, stream)
            } else {
                c.copy_to_host(&b, offset, unsafe { span.bytes_mut() }, stream)
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_device(
        &self,
        py: Python<'_>,
        src: &Memory,
        src_offset: u64,
        dst: &Memory,
        dst_offset: u64,
        nbytes: u64,
        stream: u32,
    ) -> PyResult<()> {
        let (s, d) = (self.own(src)?, self.own(dst)?);
        self.shared.call(py, |c| c.copy_device(&s, src_offset, &d, dst_offset, nbytes, StreamId(stream)))
    }

    /// Compiles CUDA C `source` with NVRTC `options`.
    fn load_module(&self, py: Python<'_>, name: &str, source: &str, options: Vec<String>) -> PyResult<Module> {
        let opts: Vec<&str> = options.iter().map(String::as_str).collect();
        let module = self.shared.call(py, |c| c.load_module(name, source, &opts))?;
        Ok(Module { module })
    }

    /// Queues a launch (errors the daemon finds come at the next sync).
    #[pyo3(signature = (kernel, grid, block, args, shared_mem=0, stream=0, block_time_ns=None))]
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        kernel: &Kernel,
        grid: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        args: &Bound<'_, PyAny>,
        shared_mem: u32,
        stream: u32,
        block_time_ns: Option<u64>,
    ) -> PyResult<()> {
        let (grid, block) = (args::dim3(grid, "grid")?, args::dim3(block, "block")?);
        let args = args::convert(&self.shared, args)?;
        let config = LaunchConfig { grid, block, shared_bytes: shared_mem, stream: StreamId(stream), block_time_ns };
        self.shared.call_held(|c| c.launch(&kernel.kernel, &config, &args))
    }

    fn create_stream(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.shared.call(py, |c| c.create_stream())?.0)
    }

    fn destroy_stream(&self, py: Python<'_>, stream: u32) -> PyResult<()> {
        self.shared.call_if_open(py, |c| c.destroy_stream(StreamId(stream)))
    }

    /// Waits for everything queued on `stream` before now.
    fn sync(&self, py: Python<'_>, stream: u32) -> PyResult<()> {
        self.shared.call(py, |c| c.sync(StreamId(stream)))
    }

    fn record_event(&self, py: Python<'_>, stream: u32) -> PyResult<u64> {
        Ok(self.shared.call(py, |c| c.record_event(StreamId(stream)))?.0 .0)
    }

    fn query_event(&self, py: Python<'_>, event: u64) -> PyResult<bool> {
        self.shared.call(py, |c| c.query_event(Event(EventId(event))))
    }

    fn wait_event(&self, py: Python<'_>, event: u64) -> PyResult<()> {
        self.shared.call(py, |c| c.wait_event(Event(EventId(event))))
    }

    fn destroy_event(&self, py: Python<'_>, event: u64) -> PyResult<()> {
        self.shared.call_if_open(py, |c| c.destroy_event(Event(EventId(event))))
    }

    /// The daemon's table of clients (`gpumux ps`), as dicts.
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.shared.call(py, |c| c.status())?;
        let d = dict_of! { py, s;
            device, policy, sms, memory_used, memory_total, memory_evicted, swap_memory, evictions, restores,
            host_memory_used, uptime_s, context_rebuilds,
        };
        let rows = PyList::empty(py);
        for c in &s.clients {
            rows.append(dict_of! { py, c;
                client, pid, uid, name, priority, weight, memory_used, memory_evicted, memory_quota, host_memory_used,
                ops_queued, ops_running, sms_held, preemptions, kernels_done,
            })?;
        }
        d.set_item("clients", rows)?;
        Ok(d)
    }

    /// The notices since the last call, as tuples: `("ContextLost",
    /// caused_by_you, what, lost launches, lost copies, lost buffer handles)`
    /// or `("ShuttingDown",)` (`gpumux._notices` makes them objects).
    fn take_notices<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let notices = self.shared.call(py, |c| Ok(c.take_notices()))?;
        notices
            .into_iter()
            .map(|n| match n {
                Notice::ContextLost { caused_by_you, what, lost } => {
                    let buffers: Vec<u64> = lost.buffers.iter().map(|b| b.0).collect();
                    ("ContextLost", caused_by_you, what, lost.launches, lost.copies, buffers)
                        .into_pyobject(py)
                        .map(|t| t.into_any())
                }
                Notice::ShuttingDown => ("ShuttingDown",).into_pyobject(py).map(|t| t.into_any()),
            })
            .collect()
    }

    /// Says goodbye: the daemon drops this client's queued work and frees its
    /// memory. Later calls raise `ClientClosed`; a second close does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let client = py.detach(|| self.shared.client.write().unwrap_or_else(PoisonError::into_inner).take());
        match client {
            Some(c) => py.detach(|| c.close()).py_err(),
            None => Ok(()),
        }
    }
}

impl Client {
    /// `memory`'s buffer, checked to be this client's and not freed.
    fn own(&self, memory: &Memory) -> PyResult<gpumux_client::Buffer> {
        if !memory.same_client(&self.shared) {
            return Err(crate::errors::invalid("the memory belongs to another gpumux client"));
        }
        memory.buffer()
    }
}

/// A span of the caller's memory given by address (see `copy_host`).
#[derive(Clone, Copy)]
struct HostSpan {
    address: usize,
    len: usize,
}

impl HostSpan {
    fn new(address: usize, len: usize) -> PyResult<HostSpan> {
        if address == 0 && len > 0 {
            return Err(crate::errors::invalid("a host copy from or to address 0"));
        }
        Ok(HostSpan { address, len })
    }

    /// # Safety
    /// `[address, address + len)` is readable memory alive for the borrow.
    unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        unsafe { std::slice::from_raw_parts(self.address as *const u8, self.len) }
    }

    /// # Safety
    /// As [`HostSpan::bytes`], writable, and no other borrow of it.
    unsafe fn bytes_mut<'a>(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        unsafe { std::slice::from_raw_parts_mut(self.address as *mut u8, self.len) }
    }
}

/// A compiled module (`RawModule` wraps it).
#[pyclass(module = "gpumux._native", frozen)]
pub struct Module {
    module: gpumux_client::Module,
}

#[pymethods]
impl Module {
    /// Its kernel `name` (`NoSuchKernel`, listing the module's, if absent).
    fn kernel(&self, name: &str) -> PyResult<Kernel> {
        Ok(Kernel { kernel: self.module.kernel(name).py_err()? })
    }

    /// Its kernels' names.
    #[getter]
    fn kernels(&self) -> Vec<String> {
        self.module.kernels().iter().map(|k| k.name().to_owned()).collect()
    }

    #[getter]
    fn name(&self) -> &str {
        self.module.name()
    }

    /// The compiler's warnings (and, on a simulated device, which kernels'
    /// parameters are unchecked).
    #[getter]
    fn log(&self) -> &str {
        self.module.log()
    }

    /// Whether the daemon had it compiled already.
    #[getter]
    fn cached(&self) -> bool {
        self.module.cached()
    }
}

/// A kernel of a module.
#[pyclass(module = "gpumux._native", frozen)]
pub struct Kernel {
    kernel: gpumux_client::Kernel,
}

#[pymethods]
impl Kernel {
    #[getter]
    fn name(&self) -> &str {
        self.kernel.name()
    }

    /// Its parameters' sizes in bytes, where the daemon knows them.
    #[getter]
    fn param_sizes(&self) -> Option<Vec<u32>> {
        self.kernel.param_sizes().map(<[u32]>::to_vec)
    }

    fn __repr__(&self) -> String {
        format!("<gpumux kernel {}>", self.kernel.name())
    }
}

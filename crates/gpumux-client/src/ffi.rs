//! The C ABI (`libgpumux_client.so`, `include/gpumux.h`).
//!
//! Every function returns a [`gpumux_status`]; on failure,
//! [`gpumux_last_error`] gives the message of the thread's last failed call.
//! No panic crosses the boundary (it becomes `GPUMUX_ERR_PANIC`).
//!
//! **Every argument is checked before use**, so a C caller's mistake is an
//! error code, never a crash inside the library (issue 36, case 7: on
//! 717b546 an argument kind of 8 raised SIGFPE and 99 or -1 SIGSEGV inside
//! `gpumux_launch`, because the kind was read as a Rust enum, for which any
//! other value is undefined behaviour):
//!
//! - a NULL pointer is `GPUMUX_ERR_NULL` (where NULL is not allowed);
//! - an enum crosses as a plain integer (`gpumux_arg::kind` is an
//!   `int32_t`), and a value outside the enum is
//!   `GPUMUX_ERR_INVALID_ARGUMENT`;
//! - a client, module or kernel pointer must be one this library handed
//!   out and has not taken back (`gpumux_disconnect`, `gpumux_module_free`),
//!   and a kernel must be of the client it is launched with; anything else
//!   (freed twice, forged, a pointer of another type) is
//!   `GPUMUX_ERR_INVALID_ARGUMENT`, found in a table of live handles
//!   without touching the pointer;
//! - out-pointers and arrays must be aligned for their type;
//! - counts and lengths are bounded before a slice is made of them:
//!   `n_args` ≤ 256 (`MAX_ARGS`), `n_options` ≤ 64 (`MAX_OPTIONS`), a
//!   `GPUMUX_ARG_BYTES` argument ≤ 32,764 bytes, a copy's length within
//!   the address space;
//! - strings must be UTF-8.
//!
//! What the library cannot check is what C cannot say: that a non-NULL
//! data pointer (`src`, `dst`, a string, `bytes`) points at as many
//! readable or writable bytes as its length claims.
//!
//! Handles: a client and a
//! module are opaque pointers (freed by `gpumux_disconnect` and
//! `gpumux_module_free`); a buffer is a small struct passed by value; a
//! kernel is a pointer into its module, valid while the module lives;
//! streams and events are integers; host memory the daemon copies from
//! directly (`gpumux_host_alloc`) is a plain pointer, freed by
//! `gpumux_host_free` or `gpumux_disconnect`.

#![allow(non_camel_case_types, clippy::missing_safety_doc)]

use crate::error::ClientError;
use crate::handles::{Arg, Buffer, Kernel, LaunchConfig, Module};
use crate::{Client, ConnectOptions, Event, HostBuffer};
use gpumux_proto::{ErrorKind, EventId, StreamId, MAX_ARGS, MAX_OPTIONS, MAX_PARAM_BYTES};
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError, RwLock};

/// What a call came to.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gpumux_status {
    /// It worked.
    GPUMUX_OK = 0,
    /// A required pointer was NULL.
    GPUMUX_ERR_NULL = 1,
    /// A bad argument caught before sending (a range past a buffer, arguments
    /// that do not match the kernel, a string that is not UTF-8).
    GPUMUX_ERR_INVALID_ARGUMENT = 2,
    /// No daemon at the socket, or it cannot be opened.
    GPUMUX_ERR_CONNECT = 3,
    /// The daemon closed the connection, or reading or writing it failed.
    GPUMUX_ERR_DAEMON_GONE = 4,
    /// The daemon sent something this library does not understand.
    GPUMUX_ERR_PROTOCOL = 5,
    /// The shared-memory region could not be created.
    GPUMUX_ERR_SHM = 6,
    /// The module has no kernel of that name.
    GPUMUX_ERR_NO_SUCH_KERNEL = 7,
    /// Another protocol version.
    GPUMUX_ERR_VERSION = 8,
    /// The config does not allow this uid, priority or weight.
    GPUMUX_ERR_NOT_PERMITTED = 9,
    /// Over a limit of the config.
    GPUMUX_ERR_QUOTA = 10,
    /// The device has no memory left.
    GPUMUX_ERR_OUT_OF_MEMORY = 11,
    /// A handle that is not this client's.
    GPUMUX_ERR_NO_SUCH_HANDLE = 12,
    /// An offset or size outside its buffer or region.
    GPUMUX_ERR_OUT_OF_RANGE = 13,
    /// The daemon found a value malformed.
    GPUMUX_ERR_INVALID = 14,
    /// The module does not compile (the message holds the log).
    GPUMUX_ERR_COMPILE = 15,
    /// The transformation refuses a kernel (the message names line and reason).
    GPUMUX_ERR_TRANSFORM = 16,
    /// A kernel of this client faulted; the context was rebuilt.
    GPUMUX_ERR_KERNEL_FAULT = 17,
    /// This client's work was lost with a context another client broke.
    GPUMUX_ERR_CONTEXT_LOST = 18,
    /// The device failed otherwise.
    GPUMUX_ERR_DEVICE = 19,
    /// The daemon is shutting down.
    GPUMUX_ERR_SHUTTING_DOWN = 20,
    /// The daemon refused a frame of this client (a bug in this library).
    GPUMUX_ERR_BAD_FRAME = 21,
    /// The library panicked (a bug: please report it with the message).
    GPUMUX_ERR_PANIC = 22,
    /// The work asked about has not ended (an event's time before the
    /// event completed: CUDA's `cudaErrorNotReady`).
    GPUMUX_ERR_NOT_READY = 23,
}

use gpumux_status::*;

/// A connected client (opaque).
pub struct gpumux_client {
    client: Client,
    device: CString,
    policy: CString,
    /// Its host memory (`gpumux_host_alloc`), by start address.
    hosts: Mutex<HashMap<usize, HostBuffer>>,
}

/// A loaded module (opaque).
pub struct gpumux_module(Module);

/// What a [`gpumux_arg`] holds (its `kind` field, an `int32_t`: any other
/// value is refused with `GPUMUX_ERR_INVALID_ARGUMENT`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum gpumux_arg_kind {
    /// `buffer` + `offset`: a device pointer.
    GPUMUX_ARG_BUFFER = 0,
    /// `i` as `int32_t`.
    GPUMUX_ARG_I32 = 1,
    /// `u` as `uint32_t`.
    GPUMUX_ARG_U32 = 2,
    /// `i` as `int64_t`.
    GPUMUX_ARG_I64 = 3,
    /// `u` as `uint64_t`.
    GPUMUX_ARG_U64 = 4,
    /// `f` as `float`.
    GPUMUX_ARG_F32 = 5,
    /// `f` as `double`.
    GPUMUX_ARG_F64 = 6,
    /// `len` bytes at `bytes` (a struct by value).
    GPUMUX_ARG_BYTES = 7,
}

impl gpumux_arg_kind {
    /// Every kind, in value order.
    const ALL: [gpumux_arg_kind; 8] = [
        gpumux_arg_kind::GPUMUX_ARG_BUFFER,
        gpumux_arg_kind::GPUMUX_ARG_I32,
        gpumux_arg_kind::GPUMUX_ARG_U32,
        gpumux_arg_kind::GPUMUX_ARG_I64,
        gpumux_arg_kind::GPUMUX_ARG_U64,
        gpumux_arg_kind::GPUMUX_ARG_F32,
        gpumux_arg_kind::GPUMUX_ARG_F64,
        gpumux_arg_kind::GPUMUX_ARG_BYTES,
    ];

    /// The kind of value `v`, if there is one.
    pub fn from_raw(v: i32) -> Option<gpumux_arg_kind> {
        usize::try_from(v).ok().and_then(|i| gpumux_arg_kind::ALL.get(i)).copied()
    }
}

/// One kernel argument, tagged by `kind`; make it with `gpumux_arg_i32()` etc.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpumux_arg {
    /// Which field holds the value: a `gpumux_arg_kind` (an integer here, so
    /// that a value outside the enum is an error, not undefined behaviour).
    pub kind: i32,
    /// For `GPUMUX_ARG_BUFFER`.
    pub buffer: Buffer,
    /// For `GPUMUX_ARG_BUFFER`: bytes into the buffer.
    pub offset: u64,
    /// For the signed kinds.
    pub i: i64,
    /// For the unsigned kinds.
    pub u: u64,
    /// For the float kinds.
    pub f: f64,
    /// For `GPUMUX_ARG_BYTES`: the bytes (copied at the launch call).
    pub bytes: *const u8,
    /// For `GPUMUX_ARG_BYTES`: how many.
    pub len: usize,
}

/// A launch's shape and stream.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpumux_launch_config {
    /// Grid, in blocks, x y z.
    pub grid: [u32; 3],
    /// Block, in threads, x y z.
    pub block: [u32; 3],
    /// Dynamic shared memory per block, bytes.
    pub shared_bytes: u32,
    /// The stream (0: the default one).
    pub stream: u32,
    /// Block time on a simulated device, ns; 0: the daemon's default.
    pub block_time_ns: u64,
}

/// Declared slices of one buffer argument of a split launch: block `b`
/// writes only bytes `[offset + ⌊b / granule_blocks⌋ × bytes_per_granule, +
/// bytes_per_granule)` from the argument's pointer (docs/split.md,
/// "Splitting in the daemon").
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpumux_split_slices {
    /// The argument's index in the launch.
    pub arg: u32,
    /// Blocks per granule, at least 1.
    pub granule_blocks: u32,
    /// Bytes one granule writes, at least 1.
    pub bytes_per_granule: u64,
    /// Where granule 0's bytes start, from the pointer.
    pub offset: u64,
}

/// How a launch is split over the daemon's GPUs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpumux_split {
    /// 1: the caller vouches that different blocks write disjoint words
    /// (the daemon's source analysis does not refuse the kernel); 0: the
    /// analysis decides. An integer, checked, as a C `bool` of another value
    /// would be undefined behaviour here.
    pub declared: i32,
    /// At most this many GPUs; 0: every GPU the daemon serves.
    pub gpus: u32,
    /// `n_slices` declared write sets; written buffers not named are merged by shadow copy.
    pub slices: *const gpumux_split_slices,
    /// How many; at most 256 (`MAX_ARGS`).
    pub n_slices: usize,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// A failed call: its status and message.
struct Failure(gpumux_status, String);

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let status = match &e {
            ClientError::NoDaemon { .. } | ClientError::Connect { .. } => GPUMUX_ERR_CONNECT,
            ClientError::Io(_) | ClientError::DaemonGone => GPUMUX_ERR_DAEMON_GONE,
            ClientError::Frame(_) | ClientError::Protocol { .. } => GPUMUX_ERR_PROTOCOL,
            ClientError::Shm { .. } => GPUMUX_ERR_SHM,
            ClientError::NoSuchKernel { .. } => GPUMUX_ERR_NO_SUCH_KERNEL,
            ClientError::Invalid(_) => GPUMUX_ERR_INVALID_ARGUMENT,
            // The kind of a daemon's refusal, also when it closed the
            // connection with it (a uid the config does not allow:
            // GPUMUX_ERR_NOT_PERMITTED).
            ClientError::Daemon { error, .. } | ClientError::Closed { error } => match error.kind {
                ErrorKind::BadFrame => GPUMUX_ERR_BAD_FRAME,
                ErrorKind::Protocol => GPUMUX_ERR_PROTOCOL,
                ErrorKind::Version { .. } => GPUMUX_ERR_VERSION,
                ErrorKind::NotPermitted => GPUMUX_ERR_NOT_PERMITTED,
                ErrorKind::Quota => GPUMUX_ERR_QUOTA,
                ErrorKind::OutOfMemory => GPUMUX_ERR_OUT_OF_MEMORY,
                ErrorKind::NoSuchHandle => GPUMUX_ERR_NO_SUCH_HANDLE,
                ErrorKind::OutOfRange => GPUMUX_ERR_OUT_OF_RANGE,
                ErrorKind::Invalid => GPUMUX_ERR_INVALID,
                ErrorKind::Compile => GPUMUX_ERR_COMPILE,
                ErrorKind::Transform { .. } => GPUMUX_ERR_TRANSFORM,
                ErrorKind::KernelFault => GPUMUX_ERR_KERNEL_FAULT,
                ErrorKind::ContextLost => GPUMUX_ERR_CONTEXT_LOST,
                ErrorKind::Device => GPUMUX_ERR_DEVICE,
                ErrorKind::ShuttingDown => GPUMUX_ERR_SHUTTING_DOWN,
                ErrorKind::NotReady => GPUMUX_ERR_NOT_READY,
            },
        };
        Failure(status, e.to_string())
    }
}

fn null(what: &str) -> Failure {
    Failure(GPUMUX_ERR_NULL, format!("{what} is NULL"))
}

fn invalid(message: String) -> Failure {
    Failure(GPUMUX_ERR_INVALID_ARGUMENT, message)
}

/// The handles this library gave out and has not taken back, by address
/// (module doc): clients, and modules and kernels with their client's
/// address. A pointer is looked up here before it is dereferenced.
struct Live {
    clients: BTreeMap<usize, ()>,
    modules: BTreeMap<usize, usize>,
    kernels: BTreeMap<usize, usize>,
}

static LIVE: RwLock<Live> =
    RwLock::new(Live { clients: BTreeMap::new(), modules: BTreeMap::new(), kernels: BTreeMap::new() });

fn live() -> std::sync::RwLockReadGuard<'static, Live> {
    LIVE.read().unwrap_or_else(PoisonError::into_inner)
}

fn live_mut() -> std::sync::RwLockWriteGuard<'static, Live> {
    LIVE.write().unwrap_or_else(PoisonError::into_inner)
}

/// The client behind `c`, if it is one `gpumux_connect` gave and
/// `gpumux_disconnect` has not taken back.
unsafe fn handle<'a>(c: *const gpumux_client) -> Result<&'a gpumux_client, Failure> {
    if c.is_null() {
        return Err(null("the client"));
    }
    if !live().clients.contains_key(&(c as usize)) {
        return Err(invalid(format!("the client {c:p} is not one gpumux_connect returned (or it was disconnected)")));
    }
    // SAFETY: a live client of gpumux_connect (checked above).
    Ok(unsafe { &*c })
}

/// The module behind `m`, if it is one `gpumux_load_module` gave and
/// `gpumux_module_free` has not taken back.
unsafe fn module_handle<'a>(m: *const gpumux_module) -> Result<&'a gpumux_module, Failure> {
    if m.is_null() {
        return Err(null("the module"));
    }
    if !live().modules.contains_key(&(m as usize)) {
        return Err(invalid(format!("the module {m:p} is not one gpumux_load_module returned (or it was freed)")));
    }
    // SAFETY: a live module of gpumux_load_module (checked above).
    Ok(unsafe { &*m })
}

/// The kernel behind `k`, if it is one `gpumux_module_kernel` gave, its
/// module is live, and it is `client`'s.
unsafe fn kernel_handle<'a>(k: *const Kernel, client: *const gpumux_client) -> Result<&'a Kernel, Failure> {
    if k.is_null() {
        return Err(null("the kernel"));
    }
    match live().kernels.get(&(k as usize)) {
        None => {
            return Err(invalid(format!(
                "the kernel {k:p} is not one gpumux_module_kernel returned (or its module was freed, or its client disconnected)"
            )))
        }
        Some(&owner) if owner != client as usize => {
            return Err(invalid(format!("the kernel {k:p} is of a module another client loaded")));
        }
        Some(_) => {}
    }
    // SAFETY: a kernel of a live module (checked above).
    Ok(unsafe { &*k })
}

/// `p` is not NULL and aligned for `T`.
fn aligned<T>(p: *const T, what: &str) -> Result<(), Failure> {
    if p.is_null() {
        return Err(null(what));
    }
    if !p.is_aligned() {
        return Err(invalid(format!("{what} ({p:p}) is not aligned for its type")));
    }
    Ok(())
}

/// `len` bytes from `p` could be one object: within `isize::MAX` and not
/// wrapping around the address space (what a slice needs).
fn span(p: *const c_void, len: usize, what: &str) -> Result<(), Failure> {
    if len > isize::MAX as usize || (p as usize).checked_add(len).is_none() {
        return Err(invalid(format!("{what} of {len} bytes at {p:p} runs past the end of the address space")));
    }
    Ok(())
}

/// The `len` bytes the caller passes at `p`: a null `p` is refused unless
/// `len` is 0, and the span is checked ([`span`]).
///
/// # Safety
/// A non-null `p` points to `len` readable bytes that stay valid for `'a`.
unsafe fn host_bytes<'a>(p: *const c_void, len: usize, what: &str) -> Result<&'a [u8], Failure> {
    if p.is_null() && len > 0 {
        return Err(null(what));
    }
    span(p, len, what)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's guarantee; `p` checked non-null and the span sound.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// [`host_bytes`] for bytes the call writes.
///
/// # Safety
/// A non-null `p` points to `len` writable bytes, not otherwise borrowed, valid for `'a`.
unsafe fn host_bytes_mut<'a>(p: *mut c_void, len: usize, what: &str) -> Result<&'a mut [u8], Failure> {
    if p.is_null() && len > 0 {
        return Err(null(what));
    }
    span(p, len, what)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: as above.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) })
}

/// Runs a call's body: catches panics, records the message of a failure.
fn guard(body: impl FnOnce() -> Result<(), Failure>) -> gpumux_status {
    let (status, message) = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return GPUMUX_OK,
        Ok(Err(Failure(status, message))) => (status, message),
        Err(_) => (GPUMUX_ERR_PANIC, "the gpumux client library panicked (a bug: please report it)".to_owned()),
    };
    // A message with a NUL (from a daemon's text) keeps what precedes it.
    let bytes: Vec<u8> = message.into_bytes().into_iter().take_while(|&b| b != 0).collect();
    let c = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
    status
}

unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: the caller passes a NUL-terminated string (checked non-null).
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Failure(GPUMUX_ERR_INVALID_ARGUMENT, format!("{what} is not UTF-8")))
}

unsafe fn client_ref<'a>(c: *const gpumux_client) -> Result<&'a Client, Failure> {
    Ok(&unsafe { handle(c) }?.client)
}

unsafe fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    aligned(p.cast_const(), what)?;
    // SAFETY: the caller passes a writable pointer (checked non-null and aligned).
    Ok(unsafe { &mut *p })
}

/// The message of this thread's last failed call ("" if none). Valid until
/// the thread's next failed call.
#[no_mangle]
pub extern "C" fn gpumux_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Connects to the daemon at `socket` (NULL: `$GPUMUX_SOCKET`, else the
/// default path) as `name` (NULL: the program's name), with a shared region
/// of `shm_bytes` (0: the default of 8 MiB).
#[no_mangle]
pub unsafe extern "C" fn gpumux_connect(
    socket: *const c_char,
    name: *const c_char,
    priority: i32,
    weight: f64,
    shm_bytes: u64,
    out_client: *mut *mut gpumux_client,
) -> gpumux_status {
    guard(|| {
        let out_client = unsafe { out(out_client, "out_client") }?;
        let mut options = ConnectOptions { priority, weight, ..ConnectOptions::default() };
        if !socket.is_null() {
            options.socket = Some(PathBuf::from(unsafe { text(socket, "socket") }?));
        }
        if !name.is_null() {
            options.name = unsafe { text(name, "name") }?.to_owned();
        }
        if shm_bytes > 0 {
            options.shm_bytes = shm_bytes;
        }
        let client = Client::connect(options)?;
        let cstring = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
        let device = cstring(&client.welcome().device);
        let policy = cstring(&client.welcome().policy);
        let hosts = Mutex::new(HashMap::new());
        let c = Box::into_raw(Box::new(gpumux_client { client, device, policy, hosts }));
        live_mut().clients.insert(c as usize, ());
        *out_client = c;
        Ok(())
    })
}

/// Says goodbye and frees the client (NULL is accepted and does nothing).
/// Buffers, modules' kernels, streams and host memory of the client are gone after it.
/// A pointer that is not a connected client (one disconnected already) is
/// `GPUMUX_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_disconnect(client: *mut gpumux_client) -> gpumux_status {
    guard(|| {
        if client.is_null() {
            return Ok(());
        }
        {
            let mut live = live_mut();
            if live.clients.remove(&(client as usize)).is_none() {
                return Err(invalid(format!(
                    "the client {client:p} is not one gpumux_connect returned (or it was disconnected)"
                )));
            }
            // Its kernels can no longer be launched (with it); modules stay until freed.
            live.kernels.retain(|_, owner| *owner != client as usize);
        }
        // SAFETY: a live pointer from gpumux_connect (checked and taken out of the table above).
        let client = unsafe { Box::from_raw(client) };
        let gpumux_client { client, hosts, .. } = *client;
        // Detached (and unmapped) before the goodbye.
        drop(hosts);
        Ok(client.close()?)
    })
}

/// The device, in words (`sim:h100`, `NVIDIA H100 ... (cuda:0)`); valid while the client lives.
/// NULL for a pointer that is not a connected client.
#[no_mangle]
pub unsafe extern "C" fn gpumux_device(client: *const gpumux_client) -> *const c_char {
    unsafe { handle(client) }.map_or(std::ptr::null(), |c| c.device.as_ptr())
}

/// The daemon's scheduling policy; valid while the client lives.
/// NULL for a pointer that is not a connected client.
#[no_mangle]
pub unsafe extern "C" fn gpumux_policy(client: *const gpumux_client) -> *const c_char {
    unsafe { handle(client) }.map_or(std::ptr::null(), |c| c.policy.as_ptr())
}

/// Whether the device is simulated: kernels take time but compute nothing.
/// False for a pointer that is not a connected client.
#[no_mangle]
pub unsafe extern "C" fn gpumux_is_simulated(client: *const gpumux_client) -> bool {
    unsafe { handle(client) }.is_ok_and(|c| c.client.is_simulated())
}

/// Changes the client's priority.
#[no_mangle]
pub unsafe extern "C" fn gpumux_set_priority(client: *const gpumux_client, priority: i32) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.set_priority(priority)?))
}

/// Changes the client's weight.
#[no_mangle]
pub unsafe extern "C" fn gpumux_set_weight(client: *const gpumux_client, weight: f64) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.set_weight(weight)?))
}

/// Allocates `bytes` of device memory into `*out_buffer`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_alloc(
    client: *const gpumux_client,
    bytes: u64,
    out_buffer: *mut Buffer,
) -> gpumux_status {
    guard(|| {
        let out_buffer = unsafe { out(out_buffer, "out_buffer") }?;
        *out_buffer = unsafe { client_ref(client) }?.alloc(bytes)?;
        Ok(())
    })
}

/// Frees a buffer once the work queued before now is done.
#[no_mangle]
pub unsafe extern "C" fn gpumux_free(client: *const gpumux_client, buffer: Buffer) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.free(buffer)?))
}

/// Fills `bytes` bytes of `buffer` from `offset` with `value`, in stream order.
#[no_mangle]
pub unsafe extern "C" fn gpumux_memset(
    client: *const gpumux_client,
    buffer: Buffer,
    offset: u64,
    value: u8,
    bytes: u64,
    stream: u32,
) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.memset(&buffer, offset, value, bytes, StreamId(stream))?))
}

/// Allocates `bytes` (> 0) of zeroed host memory that the daemon copies from and to
/// directly, pinned there (the equivalent of `cudaHostAlloc`), into `*out_ptr`. A
/// `gpumux_copy_to_device` or `gpumux_copy_to_host` whose host range lies entirely inside
/// it moves the data in one DMA with no staging copy (and returns when it is done, as every
/// copy does). Counted against the daemon's `host_memory` limit for this client (over it:
/// `GPUMUX_ERR_QUOTA`, the message naming the limit). Freed by `gpumux_host_free` or
/// `gpumux_disconnect`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_host_alloc(
    client: *const gpumux_client,
    bytes: usize,
    out_ptr: *mut *mut c_void,
) -> gpumux_status {
    guard(|| {
        let c = unsafe { handle(client) }?;
        let out_ptr = unsafe { out(out_ptr, "out_ptr") }?;
        let mut host = c.client.alloc_host(bytes as u64)?;
        let ptr = host.as_mut_ptr();
        c.hosts.lock().unwrap_or_else(PoisonError::into_inner).insert(ptr as usize, host);
        *out_ptr = ptr.cast();
        Ok(())
    })
}

/// Frees host memory of `gpumux_host_alloc` (NULL does nothing): the pointer is invalid
/// after it; the daemon unpins it once the copies queued before are done. A pointer that
/// is not the start of this client's host memory is `GPUMUX_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_host_free(client: *const gpumux_client, ptr: *mut c_void) -> gpumux_status {
    guard(|| {
        let c = unsafe { handle(client) }?;
        if ptr.is_null() {
            return Ok(());
        }
        let host = c.hosts.lock().unwrap_or_else(PoisonError::into_inner).remove(&(ptr as usize));
        let host = host.ok_or_else(|| {
            Failure(
                GPUMUX_ERR_INVALID_ARGUMENT,
                format!("{ptr:p} is not host memory of this client's gpumux_host_alloc (or was freed)"),
            )
        })?;
        Ok(host.free()?)
    })
}

/// Copies `bytes` bytes from `src` to `buffer` at `offset`; returns when they are on the
/// device. From memory of `gpumux_host_alloc`, one DMA with no staging copy.
#[no_mangle]
pub unsafe extern "C" fn gpumux_copy_to_device(
    client: *const gpumux_client,
    buffer: Buffer,
    offset: u64,
    src: *const c_void,
    bytes: usize,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        let client = unsafe { client_ref(client) }?;
        // SAFETY: the caller passes `bytes` readable bytes at `src`.
        let data = unsafe { host_bytes(src, bytes, "src") }?;
        Ok(client.copy_to_device(&buffer, offset, data, StreamId(stream))?)
    })
}

/// Copies `bytes` bytes of `buffer` from `offset` into `dst`, after the stream's earlier
/// work; returns when they are there. Into memory of `gpumux_host_alloc`, one DMA with no
/// staging copy.
#[no_mangle]
pub unsafe extern "C" fn gpumux_copy_to_host(
    client: *const gpumux_client,
    buffer: Buffer,
    offset: u64,
    dst: *mut c_void,
    bytes: usize,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        let client = unsafe { client_ref(client) }?;
        // SAFETY: the caller passes `bytes` writable bytes at `dst`.
        let data = unsafe { host_bytes_mut(dst, bytes, "dst") }?;
        Ok(client.copy_to_host(&buffer, offset, data, StreamId(stream))?)
    })
}

/// `gpumux_copy_to_device` that does not wait, from memory of `gpumux_host_alloc`
/// (`cudaMemcpyAsync` from pinned memory): queued on the stream, the call returns at once;
/// the copy is done once `gpumux_sync` of the stream, or an event recorded after it, says so,
/// and `src` must not be written before. A refusal is reported by the next call that waits
/// for stream work, as a launch's is. From other memory it waits, as `gpumux_copy_to_device`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_copy_to_device_async(
    client: *const gpumux_client,
    buffer: Buffer,
    offset: u64,
    src: *const c_void,
    bytes: usize,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        let client = unsafe { client_ref(client) }?;
        // SAFETY: the caller passes `bytes` readable bytes at `src`, unwritten until the copy is done.
        let data = unsafe { host_bytes(src, bytes, "src") }?;
        Ok(unsafe { client.copy_to_device_async(&buffer, offset, data, StreamId(stream)) }?)
    })
}

/// `gpumux_copy_to_host` that does not wait, into memory of `gpumux_host_alloc`: the data is
/// in `dst` once `gpumux_sync` of the stream, or an event recorded after the copy, says so;
/// `dst` must not be read or written before. Refusals and other memory as
/// `gpumux_copy_to_device_async`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_copy_to_host_async(
    client: *const gpumux_client,
    buffer: Buffer,
    offset: u64,
    dst: *mut c_void,
    bytes: usize,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        let client = unsafe { client_ref(client) }?;
        // SAFETY: the caller passes `bytes` writable bytes at `dst`, untouched until the copy is done.
        let data = unsafe { host_bytes_mut(dst, bytes, "dst") }?;
        Ok(unsafe { client.copy_to_host_async(&buffer, offset, data, StreamId(stream)) }?)
    })
}

/// Copies `bytes` bytes between two of the client's buffers, in stream order.
#[no_mangle]
pub unsafe extern "C" fn gpumux_copy_device(
    client: *const gpumux_client,
    src: Buffer,
    src_offset: u64,
    dst: Buffer,
    dst_offset: u64,
    bytes: u64,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        Ok(unsafe { client_ref(client) }?.copy_device(&src, src_offset, &dst, dst_offset, bytes, StreamId(stream))?)
    })
}

/// Compiles CUDA C `source` with `n_options` NVRTC options into `*out_module`.
/// A compile or transformation error's message is in `gpumux_last_error()`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_load_module(
    client: *const gpumux_client,
    name: *const c_char,
    source: *const c_char,
    options: *const *const c_char,
    n_options: usize,
    out_module: *mut *mut gpumux_module,
) -> gpumux_status {
    guard(|| {
        let client_ptr = client;
        let client = unsafe { client_ref(client) }?;
        let out_module = unsafe { out(out_module, "out_module") }?;
        let name = unsafe { text(name, "name") }?;
        let source = unsafe { text(source, "source") }?;
        if n_options > MAX_OPTIONS {
            return Err(invalid(format!("n_options is {n_options}, over the limit of {MAX_OPTIONS}")));
        }
        if n_options > 0 {
            aligned(options, "options")?;
        }
        let mut opts = Vec::with_capacity(n_options);
        for i in 0..n_options {
            // SAFETY: the caller passes `n_options` string pointers (checked non-null).
            opts.push(unsafe { text(*options.add(i), "an option") }?);
        }
        let module = client.load_module(name, source, &opts)?;
        let m = Box::into_raw(Box::new(gpumux_module(module)));
        {
            let mut live = live_mut();
            live.modules.insert(m as usize, client_ptr as usize);
            // SAFETY: just made above; its kernels stay where they are until it is freed.
            for k in unsafe { &(*m).0 }.kernels() {
                live.kernels.insert(k as *const Kernel as usize, client_ptr as usize);
            }
        }
        *out_module = m;
        Ok(())
    })
}

/// Frees a module's handle (NULL does nothing); its kernel pointers die with it.
/// A pointer that is not a live module (one freed already) is `GPUMUX_ERR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_module_free(module: *mut gpumux_module) -> gpumux_status {
    guard(|| {
        if module.is_null() {
            return Ok(());
        }
        {
            let mut live = live_mut();
            if live.modules.remove(&(module as usize)).is_none() {
                return Err(invalid(format!(
                    "the module {module:p} is not one gpumux_load_module returned (or it was freed)"
                )));
            }
            // SAFETY: a live module (checked and taken out of the table above).
            for k in unsafe { &(*module).0 }.kernels() {
                live.kernels.remove(&(k as *const Kernel as usize));
            }
        }
        // SAFETY: a pointer from gpumux_load_module, given back once (checked above).
        drop(unsafe { Box::from_raw(module) });
        Ok(())
    })
}

/// The module's kernel named `name`, into `*out_kernel` (valid while the module lives).
#[no_mangle]
pub unsafe extern "C" fn gpumux_module_kernel(
    module: *const gpumux_module,
    name: *const c_char,
    out_kernel: *mut *const Kernel,
) -> gpumux_status {
    guard(|| {
        let module = unsafe { module_handle(module) }?;
        let out_kernel = unsafe { out(out_kernel, "out_kernel") }?;
        let name = unsafe { text(name, "name") }?;
        *out_kernel = module.0.kernel_ref(name)?;
        Ok(())
    })
}

/// Launches `kernel` with `n_args` arguments without waiting for the daemon (like a CUDA
/// launch): a launch the daemon refuses reports its error at the next `gpumux_sync`,
/// `gpumux_wait_event` or `gpumux_query_event`, or at the next launch (which is then not
/// sent); each such error once.
#[no_mangle]
pub unsafe extern "C" fn gpumux_launch(
    client: *const gpumux_client,
    kernel: *const Kernel,
    config: *const gpumux_launch_config,
    args: *const gpumux_arg,
    n_args: usize,
) -> gpumux_status {
    // SAFETY: the caller's pointers, checked there.
    unsafe { launch_with(client, kernel, config, args, n_args, std::ptr::null()) }
}

/// [`gpumux_launch`], split where `split` is not NULL.
unsafe fn launch_with(
    client: *const gpumux_client,
    kernel: *const Kernel,
    config: *const gpumux_launch_config,
    args: *const gpumux_arg,
    n_args: usize,
    split: *const gpumux_split,
) -> gpumux_status {
    guard(|| {
        let split = unsafe { to_split(split) }?;
        let client_ptr = client;
        let client = unsafe { client_ref(client) }?;
        let kernel = unsafe { kernel_handle(kernel, client_ptr) }?;
        aligned(config, "the launch config")?;
        // SAFETY: checked non-null and aligned; every bit pattern is a valid config.
        let config = unsafe { &*config };
        if n_args > MAX_ARGS {
            return Err(invalid(format!("n_args is {n_args}, over the limit of {MAX_ARGS}")));
        }
        if n_args > 0 {
            aligned(args, "args")?;
        }
        let args: &[gpumux_arg] = if n_args == 0 {
            &[]
        } else {
            // SAFETY: the caller passes `n_args` arguments (checked non-null).
            unsafe { std::slice::from_raw_parts(args, n_args) }
        };
        let args = args.iter().enumerate().map(|(i, a)| unsafe { to_arg(i, a) }).collect::<Result<Vec<_>, _>>()?;
        let cfg = LaunchConfig {
            grid: config.grid,
            block: config.block,
            shared_bytes: config.shared_bytes,
            stream: StreamId(config.stream),
            block_time_ns: (config.block_time_ns > 0).then_some(config.block_time_ns),
        };
        match split {
            None => Ok(client.launch(kernel, &cfg, &args)?),
            Some(s) => Ok(client.launch_split(kernel, &cfg, &args, &s)?),
        }
    })
}

/// `*split`, checked (`None` for NULL).
unsafe fn to_split(split: *const gpumux_split) -> Result<Option<gpumux_proto::Split>, Failure> {
    if split.is_null() {
        return Ok(None);
    }
    aligned(split, "the split")?;
    // SAFETY: checked non-null and aligned; every bit pattern is a valid split.
    let s = unsafe { &*split };
    if s.declared != 0 && s.declared != 1 {
        return Err(invalid(format!("the split's `declared` is {}: 0 or 1", s.declared)));
    }
    if s.n_slices > MAX_ARGS {
        return Err(invalid(format!("n_slices is {}, over the limit of {MAX_ARGS}", s.n_slices)));
    }
    let slices: &[gpumux_split_slices] = if s.n_slices == 0 {
        &[]
    } else {
        aligned(s.slices, "the split's slices")?;
        // SAFETY: the caller passes `n_slices` entries (checked non-null).
        unsafe { std::slice::from_raw_parts(s.slices, s.n_slices) }
    };
    let mut merges = Vec::with_capacity(slices.len());
    for (i, d) in slices.iter().enumerate() {
        if d.granule_blocks == 0 || d.bytes_per_granule == 0 {
            return Err(invalid(format!(
                "the split's slices {i} (argument {}) have {} blocks of {} bytes a granule: both must be at least 1",
                d.arg, d.granule_blocks, d.bytes_per_granule
            )));
        }
        let m = gpumux_proto::SplitMerge::Slices {
            granule_blocks: d.granule_blocks,
            bytes_per_granule: d.bytes_per_granule,
            offset: d.offset,
        };
        merges.push((d.arg, m));
    }
    let splittable =
        if s.declared == 1 { gpumux_proto::Splittable::Declared } else { gpumux_proto::Splittable::IfChecked };
    Ok(Some(gpumux_proto::Split { splittable, gpus: s.gpus, merges }))
}

/// [`gpumux_launch`], split over the daemon's GPUs by block range as
/// `*split` says and merged back before the stream goes on
/// (docs/split.md, "Splitting in the daemon"). A kernel the daemon's
/// source analysis refuses reports the analysis's reasons as a refused
/// launch does (at the next sync), unless `split->declared`; a daemon of one
/// GPU runs it whole.
#[no_mangle]
pub unsafe extern "C" fn gpumux_launch_split(
    client: *const gpumux_client,
    kernel: *const Kernel,
    config: *const gpumux_launch_config,
    args: *const gpumux_arg,
    n_args: usize,
    split: *const gpumux_split,
) -> gpumux_status {
    if split.is_null() {
        return guard(|| Err(null("the split")));
    }
    // SAFETY: the caller's pointers, checked there.
    unsafe { launch_with(client, kernel, config, args, n_args, split) }
}

/// Splits every later launch of `kernel` over the daemon's GPUs as `*split`
/// says, or (NULL) runs them whole again. Refused with the daemon's source
/// analysis's reasons (in `gpumux_last_error()`) when the kernel's writes
/// cannot be merged and `split->declared` is 0.
#[no_mangle]
pub unsafe extern "C" fn gpumux_split_kernel(
    client: *const gpumux_client,
    kernel: *const Kernel,
    split: *const gpumux_split,
) -> gpumux_status {
    guard(|| {
        let client_ptr = client;
        let client = unsafe { client_ref(client) }?;
        let kernel = unsafe { kernel_handle(kernel, client_ptr) }?;
        let split = unsafe { to_split(split) }?;
        Ok(client.split_kernel(kernel, split.as_ref())?)
    })
}

/// Argument `i` of a launch, checked (module doc).
unsafe fn to_arg(i: usize, a: &gpumux_arg) -> Result<Arg, Failure> {
    use gpumux_arg_kind::*;
    let out_of =
        |what| Failure(GPUMUX_ERR_INVALID_ARGUMENT, format!("a {what} argument's value does not fit its type"));
    let kind = gpumux_arg_kind::from_raw(a.kind).ok_or_else(|| {
        invalid(format!(
            "argument {i} has kind {}, which is no gpumux_arg_kind (GPUMUX_ARG_BUFFER = 0 to GPUMUX_ARG_BYTES = 7)",
            a.kind
        ))
    })?;
    Ok(match kind {
        GPUMUX_ARG_BUFFER => Arg::buffer_at(&a.buffer, a.offset),
        GPUMUX_ARG_I32 => i32::try_from(a.i).map_err(|_| out_of("GPUMUX_ARG_I32"))?.into(),
        GPUMUX_ARG_U32 => u32::try_from(a.u).map_err(|_| out_of("GPUMUX_ARG_U32"))?.into(),
        GPUMUX_ARG_I64 => a.i.into(),
        GPUMUX_ARG_U64 => a.u.into(),
        GPUMUX_ARG_F32 => (a.f as f32).into(),
        GPUMUX_ARG_F64 => a.f.into(),
        GPUMUX_ARG_BYTES => {
            if a.bytes.is_null() && a.len > 0 {
                return Err(null("a GPUMUX_ARG_BYTES argument's bytes"));
            }
            if a.len > MAX_PARAM_BYTES {
                return Err(invalid(format!(
                    "argument {i} is {} bytes, over the limit of {MAX_PARAM_BYTES} for all of a launch's arguments",
                    a.len
                )));
            }
            if a.len == 0 {
                Arg::bytes(Vec::new())
            } else {
                // SAFETY: the caller passes `len` readable bytes (checked non-null).
                Arg::bytes(unsafe { std::slice::from_raw_parts(a.bytes, a.len) })
            }
        }
    })
}

const EMPTY_ARG: gpumux_arg = gpumux_arg {
    kind: gpumux_arg_kind::GPUMUX_ARG_I32 as i32,
    buffer: Buffer { handle: 0, bytes: 0 },
    offset: 0,
    i: 0,
    u: 0,
    f: 0.0,
    bytes: std::ptr::null(),
    len: 0,
};

/// A pointer `offset` bytes into `buffer`.
#[no_mangle]
pub extern "C" fn gpumux_arg_buffer(buffer: Buffer, offset: u64) -> gpumux_arg {
    gpumux_arg { kind: gpumux_arg_kind::GPUMUX_ARG_BUFFER as i32, buffer, offset, ..EMPTY_ARG }
}

/// An `int32_t`.
#[no_mangle]
pub extern "C" fn gpumux_arg_i32(value: i32) -> gpumux_arg {
    gpumux_arg { kind: gpumux_arg_kind::GPUMUX_ARG_I32 as i32, i: value.into(), ..EMPTY_ARG }
}

/// A `uint32_t`.
#[no_mangle]
pub extern "C" fn gpumux_arg_u32(value: u32) -> gpumux_arg {
    gpumux_arg { kind: gpumux_arg_kind::GPUMUX_ARG_U32 as i32, u: value.into(), ..EMPTY_ARG }
}

/// An `int64_t`.
#[no_mangle]
pub extern "C" fn gpumux_arg_i64(value: i64) -> gpumux_arg {
    gpumux_arg { kind: gpumux_arg_kind::GPUMUX_ARG_I64 as i32, i: value, ..EMPTY_ARG }
}

/// A `uint64_t`.
#[no_mangle]
pub extern "C" fn gpumux_arg_u64(value: u64) -> gpumux_arg {
    gpumux_arg { kind: gpumux_arg_kind::GPUMUX_ARG_U64 as i32, u: value, ..EMPTY_ARG }
}

/// A `float`.
#[no_mangle]
pub extern "C" fn gpumux_arg_f32(value: f32) -> gpumux_arg {
    gpumux_arg { kind: gpumux_arg_kind::GPUMUX_ARG_F32 as i32, f: value.into(), ..EMPTY_ARG }
}

/// A `double`.
#[no_mangle]
pub extern "C" fn gpumux_arg_f64(value: f64) -> gpumux_arg {
    gpumux_arg { kind: gpumux_arg_kind::GPUMUX_ARG_F64 as i32, f: value, ..EMPTY_ARG }
}

/// `len` bytes at `bytes`, passed by value (they are copied at the launch call).
#[no_mangle]
pub extern "C" fn gpumux_arg_bytes(bytes: *const u8, len: usize) -> gpumux_arg {
    gpumux_arg { kind: gpumux_arg_kind::GPUMUX_ARG_BYTES as i32, bytes, len, ..EMPTY_ARG }
}

/// A new stream, into `*out_stream`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_create_stream(client: *const gpumux_client, out_stream: *mut u32) -> gpumux_status {
    guard(|| {
        let out_stream = unsafe { out(out_stream, "out_stream") }?;
        *out_stream = unsafe { client_ref(client) }?.create_stream()?.0;
        Ok(())
    })
}

/// Ends a stream after its queued work.
#[no_mangle]
pub unsafe extern "C" fn gpumux_destroy_stream(client: *const gpumux_client, stream: u32) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.destroy_stream(StreamId(stream))?))
}

/// Waits until everything queued on `stream` before now is done.
#[no_mangle]
pub unsafe extern "C" fn gpumux_sync(client: *const gpumux_client, stream: u32) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.sync(StreamId(stream))?))
}

/// Records an event on `stream`, into `*out_event`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_record_event(
    client: *const gpumux_client,
    stream: u32,
    out_event: *mut u64,
) -> gpumux_status {
    guard(|| {
        let out_event = unsafe { out(out_event, "out_event") }?;
        *out_event = unsafe { client_ref(client) }?.record_event(StreamId(stream))?.0 .0;
        Ok(())
    })
}

/// Whether the event's work is done, into `*out_done` (never blocks).
#[no_mangle]
pub unsafe extern "C" fn gpumux_query_event(
    client: *const gpumux_client,
    event: u64,
    out_done: *mut bool,
) -> gpumux_status {
    guard(|| {
        let out_done = unsafe { out(out_done, "out_done") }?;
        *out_done = unsafe { client_ref(client) }?.query_event(Event(EventId(event)))?;
        Ok(())
    })
}

/// Waits until the event's work is done.
#[no_mangle]
pub unsafe extern "C" fn gpumux_wait_event(client: *const gpumux_client, event: u64) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.wait_event(Event(EventId(event)))?))
}

/// Forgets an event.
#[no_mangle]
pub unsafe extern "C" fn gpumux_destroy_event(client: *const gpumux_client, event: u64) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.destroy_event(Event(EventId(event)))?))
}

// ---------------------------------------------------------------- issue 40
// What CUDA programs use beyond one stream (docs/cuda-runtime-calls.md has
// the CUDA call each one stands for).

/// The bytes `height` rows of `width` bytes, `pitch` apart, span on the host
/// (0 for an empty copy), if that is a length at all.
fn host_rows_span(pitch: usize, width: u64, height: u64, what: &str) -> Result<usize, Failure> {
    if width == 0 || height == 0 {
        return Ok(0);
    }
    (height - 1)
        .checked_mul(pitch as u64)
        .and_then(|n| n.checked_add(width))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| invalid(format!("{what}: {height} rows of {width} bytes, {pitch} apart, overflow")))
}

/// Makes `stream`'s later work wait until `event`'s work is done, without
/// blocking the caller (`cudaStreamWaitEvent`).
#[no_mangle]
pub unsafe extern "C" fn gpumux_stream_wait_event(
    client: *const gpumux_client,
    stream: u32,
    event: u64,
) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.stream_wait_event(StreamId(stream), Event(EventId(event)))?))
}

/// Milliseconds from `start`'s end to `end`'s, into `*out_ms`
/// (`cudaEventElapsedTime`); `GPUMUX_ERR_NOT_READY` while either has not ended.
#[no_mangle]
pub unsafe extern "C" fn gpumux_event_elapsed_ms(
    client: *const gpumux_client,
    start: u64,
    end: u64,
    out_ms: *mut f32,
) -> gpumux_status {
    guard(|| {
        let out_ms = unsafe { out(out_ms, "out_ms") }?;
        let ns = unsafe { client_ref(client) }?.event_elapsed_ns(Event(EventId(start)), Event(EventId(end)))?;
        *out_ms = (ns as f64 / 1e6) as f32;
        Ok(())
    })
}

/// The same in nanoseconds, into `*out_ns`.
#[no_mangle]
pub unsafe extern "C" fn gpumux_event_elapsed_ns(
    client: *const gpumux_client,
    start: u64,
    end: u64,
    out_ns: *mut i64,
) -> gpumux_status {
    guard(|| {
        let out_ns = unsafe { out(out_ns, "out_ns") }?;
        *out_ns = unsafe { client_ref(client) }?.event_elapsed_ns(Event(EventId(start)), Event(EventId(end)))?;
        Ok(())
    })
}

/// What the device is (`cudaDeviceProp`'s fields of the same meaning).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpumux_device_properties {
    /// The device in words, NUL-terminated (cut to 255 bytes).
    pub name: [c_char; 256],
    /// A simulated device: kernels take time there and compute nothing.
    pub simulated: bool,
    /// Compute capability (9.0 for Hopper).
    pub compute_capability_major: u32,
    /// Compute capability, minor.
    pub compute_capability_minor: u32,
    /// SMs (`multiProcessorCount`).
    pub sms: u32,
    /// Device memory the daemon manages, bytes (`totalGlobalMem`).
    pub memory_bytes: u64,
    /// Peak memory bandwidth, bytes per second.
    pub memory_bandwidth: f64,
    /// `maxThreadsPerBlock`.
    pub max_threads_per_block: u32,
    /// `maxThreadsDim`.
    pub max_block_dims: [u32; 3],
    /// `maxGridSize`.
    pub max_grid_dims: [u32; 3],
    /// `maxThreadsPerMultiProcessor`.
    pub max_threads_per_sm: u32,
    /// `maxBlocksPerMultiProcessor`.
    pub max_blocks_per_sm: u32,
    /// `regsPerMultiprocessor`.
    pub registers_per_sm: u32,
    /// `sharedMemPerMultiprocessor`, bytes; also the most a block may ask for.
    pub shared_bytes_per_sm: u32,
    /// `warpSize`.
    pub warp_size: u32,
}

/// What the device is, into `*out_properties` (`cudaGetDeviceProperties`).
#[no_mangle]
pub unsafe extern "C" fn gpumux_get_device_properties(
    client: *const gpumux_client,
    out_properties: *mut gpumux_device_properties,
) -> gpumux_status {
    guard(|| {
        let out_properties = unsafe { out(out_properties, "out_properties") }?;
        let p = unsafe { client_ref(client) }?.device_properties()?;
        let mut name = [0 as c_char; 256];
        for (dst, &b) in name.iter_mut().zip(p.name.as_bytes().iter().take(255).take_while(|&&b| b != 0)) {
            *dst = b as c_char;
        }
        *out_properties = gpumux_device_properties {
            name,
            simulated: p.simulated,
            compute_capability_major: p.compute_capability[0],
            compute_capability_minor: p.compute_capability[1],
            sms: p.sms,
            memory_bytes: p.memory_bytes,
            memory_bandwidth: p.memory_bandwidth,
            max_threads_per_block: p.max_threads_per_block,
            max_block_dims: p.max_block_dims,
            max_grid_dims: p.max_grid_dims,
            max_threads_per_sm: p.max_threads_per_sm,
            max_blocks_per_sm: p.max_blocks_per_sm,
            registers_per_sm: p.registers_per_sm,
            shared_bytes_per_sm: p.shared_bytes_per_sm,
            warp_size: p.warp_size,
        };
        Ok(())
    })
}

/// Blocks of `kernel` one SM holds at once with `block_threads` threads and
/// `dynamic_shared_bytes` of dynamic shared memory per block, into
/// `*out_blocks` (`cudaOccupancyMaxActiveBlocksPerMultiprocessor`; 0: one
/// block does not fit).
#[no_mangle]
pub unsafe extern "C" fn gpumux_occupancy(
    client: *const gpumux_client,
    kernel: *const Kernel,
    block_threads: u32,
    dynamic_shared_bytes: u32,
    out_blocks: *mut u32,
) -> gpumux_status {
    guard(|| {
        let out_blocks = unsafe { out(out_blocks, "out_blocks") }?;
        let c = unsafe { client_ref(client) }?;
        let kernel = unsafe { kernel_handle(kernel, client) }?;
        *out_blocks = c.occupancy(kernel, block_threads, dynamic_shared_bytes)?;
        Ok(())
    })
}

/// A host function: called with the `user_data` given with it.
pub type gpumux_host_fn = Option<unsafe extern "C" fn(user_data: *mut c_void)>;

/// `user_data` crosses to the library's thread as it is: what it points at
/// is the caller's business, as with CUDA's `cudaLaunchHostFunc`.
struct UserData(*mut c_void);
// SAFETY: the library never dereferences it; it only hands it back to `fn`.
unsafe impl Send for UserData {}

/// Calls `fn(user_data)` on a thread of the library once `stream`'s work
/// queued before now is done, and holds the stream's later work until it
/// returns (`cudaLaunchHostFunc`); returns at once. A refusal, or an error
/// sticky on the stream (then `fn` is not called), is reported by the next
/// call that waits for stream work.
#[no_mangle]
pub unsafe extern "C" fn gpumux_launch_host_func(
    client: *const gpumux_client,
    stream: u32,
    r#fn: gpumux_host_fn,
    user_data: *mut c_void,
) -> gpumux_status {
    guard(|| {
        let client = unsafe { client_ref(client) }?;
        let f = r#fn.ok_or_else(|| null("fn"))?;
        let data = UserData(user_data);
        client.launch_host_func(StreamId(stream), move || {
            let data = data;
            // SAFETY: the caller's function, called with the caller's pointer, as promised.
            unsafe { f(data.0) }
        })?;
        Ok(())
    })
}

/// Fills `count` 32-bit words of `buffer` from `offset` with `value`, in stream order (`cuMemsetD32`).
#[no_mangle]
pub unsafe extern "C" fn gpumux_memset_d32(
    client: *const gpumux_client,
    buffer: Buffer,
    offset: u64,
    value: u32,
    count: u64,
    stream: u32,
) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.memset_d32(&buffer, offset, value, count, StreamId(stream))?))
}

/// Fills `count` 16-bit words of `buffer` from `offset` with `value`, in stream order (`cuMemsetD16`).
#[no_mangle]
pub unsafe extern "C" fn gpumux_memset_d16(
    client: *const gpumux_client,
    buffer: Buffer,
    offset: u64,
    value: u16,
    count: u64,
    stream: u32,
) -> gpumux_status {
    guard(|| Ok(unsafe { client_ref(client) }?.memset_d16(&buffer, offset, value, count, StreamId(stream))?))
}

/// Sets `height` rows of `width` bytes of `buffer`, `pitch` apart from
/// `offset`, to `value`, in stream order (`cudaMemset2D`).
#[no_mangle]
pub unsafe extern "C" fn gpumux_memset_2d(
    client: *const gpumux_client,
    buffer: Buffer,
    offset: u64,
    pitch: u64,
    value: u8,
    width: u64,
    height: u64,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        let c = unsafe { client_ref(client) }?;
        Ok(c.memset_2d(&buffer, crate::Pitched::new(offset, pitch), value, width, height, StreamId(stream))?)
    })
}

/// Copies `height` rows of `width` bytes from `src` (rows `src_pitch` apart)
/// into `buffer` (rows `dst_pitch` apart from `dst_offset`), in stream order;
/// returns when they are on the device (`cudaMemcpy2D`, host to device).
#[no_mangle]
pub unsafe extern "C" fn gpumux_copy_to_device_2d(
    client: *const gpumux_client,
    buffer: Buffer,
    dst_offset: u64,
    dst_pitch: u64,
    src: *const c_void,
    src_pitch: usize,
    width: u64,
    height: u64,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        let c = unsafe { client_ref(client) }?;
        let len = host_rows_span(src_pitch, width, height, "src")?;
        // SAFETY: the caller passes the rows' bytes at `src` (`len` from the shape).
        let data = unsafe { host_bytes(src, len, "src") }?;
        let dst = crate::Pitched::new(dst_offset, dst_pitch);
        Ok(c.copy_to_device_2d(&buffer, dst, data, src_pitch as u64, width, height, StreamId(stream))?)
    })
}

/// Copies `height` rows of `width` bytes from `buffer` (rows `src_pitch`
/// apart from `src_offset`) into `dst` (rows `dst_pitch` apart), after the
/// stream's earlier work; returns when they are there (`cudaMemcpy2D`,
/// device to host).
#[no_mangle]
pub unsafe extern "C" fn gpumux_copy_to_host_2d(
    client: *const gpumux_client,
    buffer: Buffer,
    src_offset: u64,
    src_pitch: u64,
    dst: *mut c_void,
    dst_pitch: usize,
    width: u64,
    height: u64,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        let c = unsafe { client_ref(client) }?;
        let len = host_rows_span(dst_pitch, width, height, "dst")?;
        // SAFETY: the caller passes the rows' bytes at `dst` (`len` from the shape).
        let data = unsafe { host_bytes_mut(dst, len, "dst") }?;
        let src = crate::Pitched::new(src_offset, src_pitch);
        Ok(c.copy_to_host_2d(&buffer, src, data, dst_pitch as u64, width, height, StreamId(stream))?)
    })
}

/// Copies `height` rows of `width` bytes between two of the client's buffers,
/// each with its own pitch, in stream order (`cudaMemcpy2D`, device to device).
#[no_mangle]
pub unsafe extern "C" fn gpumux_copy_device_2d(
    client: *const gpumux_client,
    src: Buffer,
    src_offset: u64,
    src_pitch: u64,
    dst: Buffer,
    dst_offset: u64,
    dst_pitch: u64,
    width: u64,
    height: u64,
    stream: u32,
) -> gpumux_status {
    guard(|| {
        let c = unsafe { client_ref(client) }?;
        let (from, to) = (crate::Pitched::new(src_offset, src_pitch), crate::Pitched::new(dst_offset, dst_pitch));
        Ok(c.copy_device_2d(&src, from, &dst, to, width, height, StreamId(stream))?)
    })
}

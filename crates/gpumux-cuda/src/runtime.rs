//! The CUDA driver side: context, memory, streams, modules, and preemptible
//! launches driven through their control records.
//!
//! Raw driver calls (cudarc's `sys` layer, loaded at run time) rather than
//! cudarc's safe wrappers: the backend needs stream priorities, stream memory
//! operations, host-mapped memory and exact control over every launch.

use crate::error::{CudaError, DriverError, Result};
use crate::launch_plan::ProfileCache;
use crate::nvrtc;
use crate::suite::Arg;
use crate::transform::{self, Transformed};
use cudarc::driver::sys as cu;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

pub mod green;
pub mod launcher;
pub use green::{GreenContext, SmResource, SmSplit};

/// What `cuda_available` reports about the GPU.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct DeviceSummary {
    /// The driver's name for the GPU (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// (major, minor): (9, 0) for Hopper.
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// The driver's CUDA API version (13000 for 13.0).
    pub driver_version: i32,
    /// Device memory, bytes.
    pub memory_bytes: u64,
}

/// `Err` with the driver's message when a driver call did not succeed.
pub(crate) fn check(call: &'static str, r: cu::CUresult) -> Result<()> {
    Ok(driver_result(call, r)?)
}

/// The driver's answer to `call`, as a typed error when it is not success.
fn driver_result(call: &'static str, r: cu::CUresult) -> Result<(), DriverError> {
    if r == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it null.
    let msg = unsafe {
        cu::cuGetErrorString(r, &mut p);
        if p.is_null() {
            "unknown error".to_string()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(DriverError { call, code: r as i32, msg })
}

/// True when libcuda can be opened. Never panics (cudarc's loader would).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library with libloading.
    unsafe { cu::is_culib_present() }
}

/// Is there a usable CUDA GPU? A clear error, never a panic, when there is not.
pub fn cuda_available() -> Result<DeviceSummary> {
    Gpu::open(0).map(|g| g.summary.clone())
}

/// How many GPUs the driver sees (0 without a driver or a GPU: never an error).
pub fn gpu_count() -> i32 {
    if !driver_present() {
        return 0;
    }
    let mut count = 0;
    // SAFETY: the driver library is present; out-pointer to a local.
    unsafe {
        if cu::cuInit(0) != cu::CUresult::CUDA_SUCCESS || cu::cuDeviceGetCount(&mut count) != cu::CUresult::CUDA_SUCCESS
        {
            return 0;
        }
    }
    count
}

/// One GPU and its primary context.
pub struct Gpu {
    /// The driver's index of the GPU.
    pub ordinal: i32,
    dev: cu::CUdevice,
    ctx: cu::CUcontext,
    /// What it is.
    pub summary: DeviceSummary,
    /// (least, greatest) stream priority; numerically lower is more urgent.
    pub priority_range: (i32, i32),
    modules: std::sync::Mutex<HashMap<[u8; 32], Arc<Module>>>,
}

// SAFETY: the context handle may be used from any thread once made current there.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

fn attr(dev: cu::CUdevice, a: cu::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    check("cuDeviceGetAttribute", unsafe { cu::cuDeviceGetAttribute(&mut v, a, dev) })?;
    Ok(v)
}

/// Initialises the driver and describes GPU `ordinal`, creating no context.
/// A clear error, never a panic, without a driver or a GPU.
pub(crate) fn query_device(ordinal: i32) -> Result<(cu::CUdevice, DeviceSummary)> {
    if !driver_present() {
        return Err(CudaError::NoDriver("libcuda.so not found on the loader path".into()));
    }
    // SAFETY: the driver library is present; every call gets valid out-pointers.
    unsafe {
        driver_result("cuInit", cu::cuInit(0)).map_err(CudaError::NoGpu)?;
        let mut count = 0;
        check("cuDeviceGetCount", cu::cuDeviceGetCount(&mut count))?;
        if ordinal >= count {
            return Err(CudaError::NoSuchGpu { ordinal, count });
        }
        let mut dev = 0;
        check("cuDeviceGet", cu::cuDeviceGet(&mut dev, ordinal))?;
        let mut name = [0 as std::ffi::c_char; 256];
        check("cuDeviceGetName", cu::cuDeviceGetName(name.as_mut_ptr(), 256, dev))?;
        let mut driver_version = 0;
        check("cuDriverGetVersion", cu::cuDriverGetVersion(&mut driver_version))?;
        let mut mem = 0usize;
        check("cuDeviceTotalMem", cu::cuDeviceTotalMem_v2(&mut mem, dev))?;
        use cu::CUdevice_attribute as A;
        let summary = DeviceSummary {
            name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
            compute_capability: (
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            sm_count: attr(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            driver_version,
            memory_bytes: mem as u64,
        };
        Ok((dev, summary))
    }
}

impl Gpu {
    /// Opens GPU `ordinal` (its primary context, made current on this
    /// thread). A clear error, never a panic, without a driver or a GPU.
    pub fn open(ordinal: i32) -> Result<Gpu> {
        let (dev, summary) = query_device(ordinal)?;
        // SAFETY: dev is a device of the initialised driver; out-pointers to locals.
        unsafe {
            let mut ctx = std::ptr::null_mut();
            check("cuDevicePrimaryCtxRetain", cu::cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
            crate::client::forget_current();
            check("cuCtxSetCurrent", cu::cuCtxSetCurrent(ctx))?;
            let (mut least, mut greatest) = (0, 0);
            check("cuCtxGetStreamPriorityRange", cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest))?;
            Ok(Gpu {
                ordinal,
                dev,
                ctx,
                summary,
                priority_range: (least, greatest),
                modules: std::sync::Mutex::new(HashMap::new()),
            })
        }
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        crate::client::forget_current();
        // SAFETY: ctx is the retained primary context.
        check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.ctx) })
    }

    /// Its context (for calls that name two GPUs' contexts: peer access and copies).
    pub(crate) fn raw_context(&self) -> cu::CUcontext {
        self.ctx
    }

    /// Its driver device handle.
    pub(crate) fn raw_device(&self) -> cu::CUdevice {
        self.dev
    }

    /// Streaming multiprocessors.
    pub fn sm_count(&self) -> u32 {
        self.summary.sm_count
    }

    /// The `sm_XY` architecture number (90 for compute capability 9.0).
    pub fn arch(&self) -> u32 {
        self.summary.compute_capability.0 * 10 + self.summary.compute_capability.1
    }

    /// Compiles (NVRTC, cached by source hash) and loads a module (cached too).
    pub fn module(&self, name: &str, src: &str) -> Result<Arc<Module>> {
        let compiled = nvrtc::compile(name, src, self.arch(), &[])?;
        let mut m = self.modules.lock().map_err(|_| CudaError::Poisoned("the module cache"))?;
        if let Some(x) = m.get(&compiled.key) {
            return Ok(x.clone());
        }
        let module = Arc::new(Module::load(name, &compiled.cubin)?);
        m.insert(compiled.key, module.clone());
        Ok(module)
    }

    /// A module compiled from `src` as written, and one from its transformation.
    pub fn native_and_worker(&self, name: &str, src: &str) -> Result<(Arc<Module>, Arc<Module>, Transformed)> {
        let t = transform::transform(src)?;
        Ok((self.module(name, src)?, self.module(&format!("{name}_gmx"), &t.source)?, t))
    }

    /// A device attribute (`cuDeviceGetAttribute`).
    pub fn attr(&self, a: cu::CUdevice_attribute) -> Result<i32> {
        attr(self.dev, a)
    }

    /// Whether this process is an MPS client (`CU_DEVICE_ATTRIBUTE_MPS_ENABLED`).
    pub fn mps_enabled(&self) -> Result<bool> {
        Ok(self.attr(cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED)? == 1)
    }
}

/// A loaded module.
pub struct Module {
    code: Arc<LoadedCode>,
    /// The name it was compiled under.
    pub name: String,
    /// Block times of its kernels, measured on their first launch ([`crate::launch_plan`]).
    pub profiles: Arc<ProfileCache>,
}

/// A module's code in the context: unloaded when the last holder lets go,
/// the [`Module`] or any of its [`Function`]s. A function that outlives its
/// module's owner (a launch still running, workers queued on the GPU, a
/// record kept for reuse) keeps the code it runs.
#[derive(Debug)]
struct LoadedCode {
    raw: cu::CUmodule,
}

// SAFETY: module handles are context-wide and thread-safe in the driver.
unsafe impl Send for LoadedCode {}
unsafe impl Sync for LoadedCode {}

/// Modules loaded in this process and not yet unloaded (for leak checks).
static LOADED_MODULES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many modules this process has loaded and not yet unloaded, in every context.
pub fn loaded_modules() -> usize {
    LOADED_MODULES.load(std::sync::atomic::Ordering::Relaxed)
}

impl Drop for LoadedCode {
    /// Unloads it, in the context current on this thread (the device binds its
    /// context around every call that may drop a function).
    fn drop(&mut self) {
        LOADED_MODULES.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: loaded by cuModuleLoadData, and no function of it is left to
        // launch (each holds this); errors at teardown have no one to go to.
        unsafe {
            cu::cuModuleUnload(self.raw);
        }
    }
}

impl Module {
    /// Loads a CUBIN into the current context (unloaded when it and its
    /// functions are dropped).
    pub fn load(name: &str, cubin: &[u8]) -> Result<Module> {
        let mut module = std::ptr::null_mut();
        // SAFETY: the CUBIN outlives the call; the driver copies it.
        check("cuModuleLoadData", unsafe { cu::cuModuleLoadData(&mut module, cubin.as_ptr().cast()) })?;
        Ok(Module::adopt(module, name.to_string()))
    }

    /// A module loaded by other means (a green context's), owned from now on.
    pub(crate) fn adopt(raw: cu::CUmodule, name: String) -> Module {
        LOADED_MODULES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Module { code: Arc::new(LoadedCode { raw }), name, profiles: Arc::default() }
    }

    /// The kernel `name` (its exported, `extern "C"` name).
    pub fn function(&self, name: &str) -> Result<Function> {
        let c = std::ffi::CString::new(name)
            .map_err(|source| CudaError::Nul { what: format!("kernel name {name:?}"), source })?;
        let mut f = std::ptr::null_mut();
        // SAFETY: valid module and C string.
        driver_result("cuModuleGetFunction", unsafe { cu::cuModuleGetFunction(&mut f, self.code.raw, c.as_ptr()) })
            .map_err(|source| CudaError::MissingKernel { kernel: name.into(), module: self.name.clone(), source })?;
        Ok(Function { raw: f, name: name.to_string(), profiles: self.profiles.clone(), _code: self.code.clone() })
    }
}

/// A kernel of a loaded module; it keeps the module's code loaded.
#[derive(Clone, Debug)]
pub struct Function {
    raw: cu::CUfunction,
    /// Its exported name.
    pub name: String,
    /// The module's measured block times (shared by every handle of the module).
    pub profiles: Arc<ProfileCache>,
    /// Held, never read: the module stays loaded while this function may run.
    _code: Arc<LoadedCode>,
}

impl Function {
    /// A number that tells this loaded function from every other loaded now
    /// (its handle's address; reused only after an unload).
    pub fn key(&self) -> usize {
        self.raw as usize
    }
}

// SAFETY: function handles are immutable once loaded.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

impl Function {
    /// A function attribute (`cuFuncGetAttribute`): registers, static shared memory, ….
    pub fn attribute(&self, a: cu::CUfunction_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-pointer to a local; valid function.
        check("cuFuncGetAttribute", unsafe { cu::cuFuncGetAttribute(&mut v, a, self.raw) })?;
        Ok(v)
    }

    /// (offset, size) in bytes of its first `count` parameters (`cuFuncGetParamInfo`, CUDA 12.4+).
    pub fn param_layout(&self, count: usize) -> Result<Vec<(usize, usize)>> {
        (0..count)
            .map(|i| {
                let (mut offset, mut size) = (0usize, 0usize);
                // SAFETY: out-pointers to locals; valid function.
                check("cuFuncGetParamInfo", unsafe { cu::cuFuncGetParamInfo(self.raw, i, &mut offset, &mut size) })?;
                Ok((offset, size))
            })
            .collect()
    }

    /// Resident blocks per SM for this block size and dynamic shared memory.
    pub fn blocks_per_sm(&self, threads: u32, dyn_smem: u32) -> Result<u32> {
        let mut n = 0;
        // SAFETY: out-pointer to a local; valid function.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            cu::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, self.raw, threads as i32, dyn_smem as usize)
        })?;
        if n <= 0 {
            return Err(CudaError::Invalid(format!(
                "kernel `{}` cannot be resident with {threads} threads",
                self.name
            )));
        }
        Ok(n as u32)
    }

    /// Launches it on `stream` (through `launch_kernel`, as every launch is).
    ///
    /// # Safety
    /// `params` must match the kernel's parameter list (the rest of
    /// `launch_kernel`'s contract holds: `self` and `stream` are alive while
    /// borrowed, and the pointers are taken from `params` here).
    pub unsafe fn launch(
        &self,
        grid: [u32; 3],
        block: [u32; 3],
        smem: u32,
        stream: &Stream,
        params: &mut Params,
    ) -> Result<()> {
        let mut ptrs = params.pointers();
        // SAFETY: the caller's guarantee for the arguments; live handles, and
        // `params`, borrowed, is unchanged until the call returns.
        unsafe { launch_kernel(self.raw, grid, block, smem, stream.raw, &mut ptrs) }
    }
}

/// One `cuLaunchKernel`: `func` over `grid` blocks of `block` threads, with
/// `smem` bytes of dynamic shared memory, queued on `stream`; `args` are its
/// arguments' addresses ([`Params::pointers`]). Every launch this crate makes
/// comes here: [`Function::launch`], and the launcher thread's jobs, which
/// carry raw handles rather than a [`Function`] (`launcher::run`). It adds
/// nothing to the call but its result's check, and is `#[inline]`: a launch
/// through it pays no call of its own.
///
/// The handles' context must be current on this thread (else the driver's
/// error).
///
/// # Safety
/// Until it returns: `func` is a function of a loaded module and `stream` a
/// live stream, not destroyed by another thread meanwhile; `args` holds one
/// address per parameter of the kernel, in order, each of a value of that
/// parameter's size and type (the driver reads them during the call), so the
/// [`Params`] they were taken from is neither changed nor dropped.
#[inline]
pub(crate) unsafe fn launch_kernel(
    func: cu::CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    stream: cu::CUstream,
    args: &mut Pointers,
) -> Result<()> {
    // SAFETY: the caller's guarantee; no extra-options array (`null`).
    check("cuLaunchKernel", unsafe {
        cu::cuLaunchKernel(
            func,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            smem,
            stream,
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })
}

/// Argument words a [`Params`] holds in itself, with no allocation, while
/// they fit (a worker's own tail is 10 of them).
const INLINE_WORDS: usize = 24;

/// Kernel arguments, each in its own 8-byte aligned slot, held in the value
/// itself while they fit (`INLINE_WORDS`): a launch posted to a launcher
/// thread then carries no allocation of the poster's for that thread to
/// free (each such free may take the allocator's lock the poster allocates
/// under; the two threads slowed each other: docs/program-speed.md, "The
/// launcher's time per kernel"). A clone of one that fits makes no
/// allocation either: a kernel's own arguments are packed once, at its bind,
/// and copied into each launch record that runs it (`preempt::WorkerLaunch`).
#[derive(Clone, Default)]
pub struct Params {
    /// The slots, in order, while they fit.
    inline: [u64; INLINE_WORDS],
    /// Every slot, once they do not (then `inline` is unused).
    spill: Vec<u64>,
    /// Words used.
    len: usize,
    /// Where each of the first slots starts (a slot takes a word at least).
    starts: [u32; INLINE_WORDS],
    /// Where each later one starts.
    more_starts: Vec<u32>,
    /// Slots.
    count: usize,
}

impl From<Vec<Vec<u8>>> for Params {
    /// Each argument's bytes in a slot of its own, in order.
    fn from(args: Vec<Vec<u8>>) -> Params {
        Params::of_args(&args)
    }
}

impl Params {
    /// `args`, each argument's bytes in a slot of its own, in order.
    pub fn of_args(args: &[Vec<u8>]) -> Params {
        let mut p = Params::default();
        for a in args {
            p.push_bytes(a);
        }
        p
    }

    /// Where slot `i` starts, in words (`len` past the last).
    fn start_of(&self, i: usize) -> usize {
        match i {
            i if i >= self.count => self.len,
            i if i < INLINE_WORDS => self.starts[i] as usize,
            i => self.more_starts[i - INLINE_WORDS] as usize,
        }
    }

    /// The words in use.
    fn words(&self) -> &[u64] {
        if self.spill.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.spill[..]
        }
    }

    /// The words in use, to write.
    fn words_mut(&mut self) -> &mut [u64] {
        if self.spill.is_empty() {
            &mut self.inline[..self.len]
        } else {
            &mut self.spill[..]
        }
    }

    /// Replaces the bytes of argument `i` (nothing if there is none): in
    /// place when they take as many words, else the slots are laid out again.
    pub fn set_slot(&mut self, i: usize, b: &[u8]) {
        if i >= self.count {
            return;
        }
        let (start, end) = (self.start_of(i), self.start_of(i + 1));
        if b.len().div_ceil(8).max(1) == end - start {
            let slot = &mut self.words_mut()[start..end];
            slot.fill(0);
            // SAFETY: the slot holds `(end - start) * 8 >= b.len()` bytes.
            unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), slot.as_mut_ptr().cast::<u8>(), b.len()) };
            return;
        }
        let mut again = Params::default();
        for j in 0..self.count {
            if j == i {
                again.push_bytes(b);
                continue;
            }
            let (s, e) = (self.start_of(j), self.start_of(j + 1));
            let w = &self.words()[s..e];
            // SAFETY: `w` is `w.len()` initialised words, read as bytes.
            again.push_bytes(unsafe { std::slice::from_raw_parts(w.as_ptr().cast::<u8>(), w.len() * 8) });
        }
        *self = again;
    }

    /// An argument of these bytes (a struct passed by value).
    pub fn push_bytes(&mut self, b: &[u8]) -> &mut Self {
        let start = self.len;
        self.len += b.len().div_ceil(8).max(1);
        if self.len > INLINE_WORDS && self.spill.is_empty() {
            self.spill.extend_from_slice(&self.inline[..start]);
        }
        let words = if self.spill.is_empty() {
            &mut self.inline[start..self.len]
        } else {
            self.spill.resize(self.len, 0);
            &mut self.spill[start..]
        };
        // SAFETY: the slot just added holds at least b.len() bytes.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), words.as_mut_ptr().cast::<u8>(), b.len()) };
        match self.starts.get_mut(self.count) {
            Some(s) => *s = start as u32,
            None => self.more_starts.push(start as u32),
        }
        self.count += 1;
        self
    }
    /// A device pointer.
    pub fn ptr(&mut self, p: u64) -> &mut Self {
        self.push_bytes(&p.to_le_bytes())
    }
    /// A 32-bit unsigned value.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.push_bytes(&v.to_le_bytes())
    }
    /// A 64-bit unsigned value.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.push_bytes(&v.to_le_bytes())
    }
    /// A `uint3`.
    pub fn uint3(&mut self, v: [u32; 3]) -> &mut Self {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.push_bytes(&b)
    }
    /// A suite argument, buffers resolved through `bufs`.
    pub fn arg(&mut self, a: &Arg, bufs: &[DeviceBuffer]) -> Result<&mut Self> {
        Ok(match a {
            Arg::Buf(i) => self.ptr(bufs.get(*i).ok_or_else(|| CudaError::Invalid(format!("no buffer {i}")))?.ptr),
            Arg::U32(v) => self.u32(*v),
            Arg::I32(v) => self.push_bytes(&v.to_le_bytes()),
            Arg::F32(v) => self.push_bytes(&v.to_le_bytes()),
            Arg::U64(v) => self.u64(*v),
        })
    }
    /// Each argument's address, for `cuLaunchKernel` (valid while `self` is
    /// neither changed nor dropped).
    fn pointers(&mut self) -> Pointers {
        let base = if self.spill.is_empty() { self.inline.as_mut_ptr() } else { self.spill.as_mut_ptr() };
        let first = &self.starts[..self.count.min(INLINE_WORDS)];
        // SAFETY: every start lies within the words in use (`push_bytes`).
        let at = |&i: &u32| unsafe { base.add(i as usize) }.cast::<c_void>();
        let mut p = Pointers { inline: [std::ptr::null_mut(); INLINE_WORDS], len: first.len(), more: Vec::new() };
        if self.more_starts.is_empty() {
            p.inline.iter_mut().zip(first).for_each(|(q, i)| *q = at(i));
        } else {
            p.more = first.iter().chain(&self.more_starts).map(at).collect();
            p.len = p.more.len();
        }
        p
    }
}

/// The arguments' addresses as `cuLaunchKernel` takes them ([`Params`]):
/// on the stack while there are at most [`INLINE_WORDS`] arguments, so that
/// a launch allocates nothing (the launcher thread made one vector a job).
pub(crate) struct Pointers {
    inline: [*mut c_void; INLINE_WORDS],
    len: usize,
    /// Every address, when there are more.
    more: Vec<*mut c_void>,
}

impl Pointers {
    pub(crate) fn as_mut_ptr(&mut self) -> *mut *mut c_void {
        if self.more.is_empty() {
            self.inline.as_mut_ptr()
        } else {
            self.more.as_mut_ptr()
        }
    }
}

impl std::ops::Deref for Pointers {
    type Target = [*mut c_void];
    fn deref(&self) -> &[*mut c_void] {
        if self.more.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.more
        }
    }
}

#[cfg(test)]
mod params_tests {
    use super::*;

    #[test]
    fn each_argument_points_at_its_own_bytes_in_an_aligned_slot() {
        let mut p = Params::default();
        let launch_desc: Vec<u8> = (0..72u8).collect();
        p.ptr(0x1122_3344_5566_7788).u32(7).push_bytes(&launch_desc).push_bytes(&[]).uint3([1, 2, 3]);
        // Moved (as into a launcher's job) before its pointers are taken, as a launch does.
        let mut p = Box::new(p);
        let ptrs = p.pointers();
        assert_eq!(ptrs.len(), 5);
        // SAFETY: each pointer names a live slot of at least the bytes read.
        let bytes = |i: usize, n: usize| unsafe { std::slice::from_raw_parts(ptrs[i].cast::<u8>(), n) }.to_vec();
        assert_eq!(bytes(0, 8), 0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(bytes(1, 4), 7u32.to_le_bytes());
        assert_eq!(bytes(2, 72), launch_desc);
        assert_eq!(bytes(4, 12), [1u32, 2, 3].iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
        assert!(ptrs.iter().all(|q| (*q as usize).is_multiple_of(8)), "8-byte aligned slots");
        // An empty argument still has a slot of its own, apart from the next.
        assert!(ptrs.windows(2).all(|w| w[0] < w[1]), "slots in order, none shared");
    }

    #[test]
    fn more_arguments_than_fit_inline_each_point_at_their_own_bytes() {
        for n in [INLINE_WORDS - 1, INLINE_WORDS, INLINE_WORDS + 1, 3 * INLINE_WORDS] {
            let mut p = Params::default();
            (0..n as u32).for_each(|i| {
                p.u32(i * 7 + 1);
            });
            let mut p = Box::new(p);
            let mut ptrs = p.pointers();
            assert_eq!(ptrs.len(), n);
            assert_eq!(ptrs.as_mut_ptr().cast_const(), ptrs.as_ptr(), "the launch reads the same list");
            for (i, q) in ptrs.iter().enumerate() {
                // SAFETY: a live 4-byte slot of `p`.
                assert_eq!(unsafe { q.cast::<u32>().read() }, i as u32 * 7 + 1, "argument {i} of {n}");
            }
        }
    }

    /// Argument `i`'s first `n` bytes, through its pointer.
    fn arg_bytes(p: &mut Params, i: usize, n: usize) -> Vec<u8> {
        let ptrs = p.pointers();
        // SAFETY: a live slot of at least `n` bytes (the caller's sizes).
        unsafe { std::slice::from_raw_parts(ptrs[i].cast::<u8>(), n) }.to_vec()
    }

    #[test]
    fn packed_arguments_cloned_or_replaced_point_at_the_same_bytes_as_pushed_ones() {
        let args: Vec<Vec<u8>> = vec![vec![1; 8], vec![2; 4], vec![3; 12], vec![], vec![5; 8]];
        let mut pushed = Params::default();
        args.iter().for_each(|a| {
            pushed.push_bytes(a);
        });
        // Packed once (a bind), cloned per launch (a record's reuse), the worker's tail pushed after.
        let packed = Params::of_args(&args);
        let mut launch = packed.clone();
        launch.ptr(0xabcd).push_bytes(&[9; 72]);
        pushed.ptr(0xabcd).push_bytes(&[9; 72]);
        assert_eq!(launch.pointers().len(), 7);
        for (i, n) in [(0, 8), (1, 4), (2, 12), (4, 8), (5, 8), (6, 72)] {
            assert_eq!(arg_bytes(&mut launch, i, n), arg_bytes(&mut pushed, i, n), "argument {i}");
        }
        assert!(packed.spill.is_empty() && packed.more_starts.is_empty(), "five arguments fit: no allocation");
        // Replaced in place (the same words) and laid out again (more words).
        let mut p = Params::from(args.clone());
        p.set_slot(1, &7u32.to_le_bytes());
        assert_eq!(arg_bytes(&mut p, 1, 4), 7u32.to_le_bytes());
        assert_eq!(arg_bytes(&mut p, 2, 12), vec![3; 12], "its neighbour untouched");
        p.set_slot(0, &[6; 20]);
        let mut want = args.clone();
        want[0] = vec![6; 20];
        want[1] = 7u32.to_le_bytes().to_vec();
        let mut want = Params::of_args(&want);
        for (i, n) in [(0, 20), (1, 4), (2, 12), (4, 8)] {
            assert_eq!(arg_bytes(&mut p, i, n), arg_bytes(&mut want, i, n), "argument {i} after the layout changed");
        }
        assert_eq!(p.len, want.len);
        p.set_slot(9, &[1]);
        assert_eq!(p.count, 5, "no argument 9: nothing changes");
    }

    #[test]
    fn arguments_past_the_inline_words_move_with_the_first_ones() {
        let mut p = Params::default();
        // 30 one-word arguments: the first fill the inline words, the rest spill (with them).
        for v in 0..30u64 {
            p.u64(v * 3 + 1);
        }
        let big: Vec<u8> = (0..200u8).collect();
        p.push_bytes(&big);
        let ptrs = p.pointers();
        assert_eq!(ptrs.len(), 31);
        for (v, q) in ptrs.iter().take(30).enumerate() {
            // SAFETY: a live one-word slot.
            assert_eq!(unsafe { *q.cast::<u64>() }, v as u64 * 3 + 1, "argument {v}");
        }
        // SAFETY: the last slot holds the 200 bytes.
        assert_eq!(unsafe { std::slice::from_raw_parts(ptrs[30].cast::<u8>(), 200) }, &big[..]);
        // Moved (as into a launcher's job), the arguments are the same.
        let mut moved = p;
        let again = moved.pointers();
        // SAFETY: live slots.
        assert_eq!(unsafe { *again[29].cast::<u64>() }, 29 * 3 + 1);
    }
}

/// Waits for the legacy default stream, where the "synchronous" memory calls
/// (`cuMemcpyHtoD`, `cuMemsetD8`) run.
///
/// Why: those calls may return before the device has the data (a memset is
/// asynchronous to the host; a copy from pageable memory returns once the data
/// is staged, before the last DMA lands), and every stream of this backend is
/// `CU_STREAM_NON_BLOCKING`, which does *not* wait for the legacy stream. A
/// kernel launched right after a reset could read half-uploaded inputs or an
/// unzeroed histogram (issue 10: kmeans and histogram failed the GPU check this
/// way). Buffers are (re)initialised outside timed regions, so a full wait is
/// the simple, safe contract: "when `upload`/`fill` return, the device has it".
fn settle_legacy_stream() -> Result<()> {
    // SAFETY: the null stream handle names the context's legacy default stream.
    check("cuStreamSynchronize(legacy)", unsafe { cu::cuStreamSynchronize(std::ptr::null_mut()) })
}

/// Device memory.
///
/// `upload` and `fill` are complete on the device when they return; `download`
/// waits for the legacy stream only, so a caller reading what a kernel on one
/// of this backend's (non-blocking) streams wrote must synchronise that stream
/// (or an event recorded on it) first.
pub struct DeviceBuffer {
    /// Device address.
    pub ptr: u64,
    /// Size.
    pub bytes: usize,
}

impl DeviceBuffer {
    /// Allocates `bytes` of device memory (contents undefined).
    pub fn new(bytes: usize) -> Result<DeviceBuffer> {
        let mut ptr = 0;
        // SAFETY: out-pointer to a local.
        check("cuMemAlloc", unsafe { cu::cuMemAlloc_v2(&mut ptr, bytes.max(4)) })?;
        Ok(DeviceBuffer { ptr, bytes })
    }
    /// Copies `data` to the start of the buffer; the data is on the device when this returns.
    pub fn upload(&self, data: &[u8]) -> Result<()> {
        if data.len() > self.bytes {
            return Err(CudaError::Invalid("upload larger than the buffer".into()));
        }
        // SAFETY: the buffer holds at least data.len() bytes.
        check("cuMemcpyHtoD", unsafe { cu::cuMemcpyHtoD_v2(self.ptr, data.as_ptr().cast(), data.len()) })?;
        settle_legacy_stream()
    }
    /// Sets every byte; done on the device when this returns.
    pub fn fill(&self, byte: u8) -> Result<()> {
        // SAFETY: within the allocation.
        check("cuMemsetD8", unsafe { cu::cuMemsetD8_v2(self.ptr, byte, self.bytes) })?;
        settle_legacy_stream()
    }
    /// The whole buffer's contents.
    pub fn download(&self) -> Result<Vec<u8>> {
        self.download_prefix(self.bytes)
    }
    /// Its first `n` bytes (at most the whole buffer).
    pub fn download_prefix(&self, n: usize) -> Result<Vec<u8>> {
        let n = n.min(self.bytes);
        let mut v = vec![0u8; n];
        // SAFETY: v holds n bytes, within the allocation.
        check("cuMemcpyDtoH", unsafe { cu::cuMemcpyDtoH_v2(v.as_mut_ptr().cast(), self.ptr, n) })?;
        Ok(v)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc; errors at teardown have no one to go to.
        unsafe {
            cu::cuMemFree_v2(self.ptr);
        }
    }
}

/// Pinned host memory mapped into the device's address space.
pub struct HostMapped {
    host: *mut u8,
    /// Its address on the device.
    pub dev: u64,
    /// Size.
    pub bytes: usize,
}

// SAFETY: plain memory; callers use volatile accesses for shared words.
unsafe impl Send for HostMapped {}

impl HostMapped {
    /// Allocates `bytes` of pinned, zeroed host memory mapped for the device.
    pub fn new(bytes: usize) -> Result<HostMapped> {
        let mut host: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointers; flags request a device mapping.
        unsafe {
            check(
                "cuMemHostAlloc",
                cu::cuMemHostAlloc(&mut host, bytes, cu::CU_MEMHOSTALLOC_DEVICEMAP | cu::CU_MEMHOSTALLOC_PORTABLE),
            )?;
            std::ptr::write_bytes(host.cast::<u8>(), 0, bytes);
            let mut dev = 0;
            check("cuMemHostGetDevicePointer", cu::cuMemHostGetDevicePointer_v2(&mut dev, host, 0))?;
            Ok(HostMapped { host: host.cast(), dev, bytes })
        }
    }
    /// The 32-bit word `word` as the device last wrote it.
    pub fn read_u32(&self, word: usize) -> u32 {
        self.words().read(word)
    }
    /// Writes `b` at byte `offset`.
    pub fn write_bytes(&self, offset: usize, b: &[u8]) {
        assert!(offset + b.len() <= self.bytes, "write outside the mapping");
        // SAFETY: in bounds.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.host.add(offset), b.len()) }
    }
    /// `n` bytes from byte `offset`.
    pub fn read_bytes(&self, offset: usize, n: usize) -> Vec<u8> {
        assert!(offset + n <= self.bytes, "read outside the mapping");
        let mut v = vec![0u8; n];
        // SAFETY: in bounds.
        unsafe { std::ptr::copy_nonoverlapping(self.host.add(offset), v.as_mut_ptr(), n) };
        v
    }
    /// Its address on the host, for asynchronous copies out of the mapping.
    pub fn host_ptr(&self) -> *const u8 {
        self.host
    }
    /// A read-only view of the mapping's 32-bit words that another host
    /// thread may poll (e.g. to stamp a device signal while this thread is
    /// busy issuing calls).
    pub fn words(&self) -> MappedWords<'_> {
        MappedWords { base: self.host.cast::<u32>(), words: self.bytes / 4, _mapping: std::marker::PhantomData }
    }
    /// For asynchronous copies into the mapping.
    pub fn host_mut_ptr(&self) -> *mut u8 {
        self.host
    }
}

/// Volatile word reads of a [`HostMapped`], shareable between threads.
#[derive(Clone, Copy)]
pub struct MappedWords<'a> {
    base: *const u32,
    words: usize,
    _mapping: std::marker::PhantomData<&'a HostMapped>,
}

// SAFETY: the view only performs volatile loads of aligned words of pinned
// memory that outlives it ('a); the device writes those words concurrently
// anyway, so no host thread may assume they are unaliased.
unsafe impl Send for MappedWords<'_> {}
// SAFETY: as above: shared access is volatile loads only.
unsafe impl Sync for MappedWords<'_> {}

impl MappedWords<'_> {
    /// The word at index `word`, read with a volatile load.
    pub fn read(&self, word: usize) -> u32 {
        assert!(word < self.words, "word outside the mapping");
        // SAFETY: in bounds of a live mapping (lifetime 'a); volatile because the device writes it.
        unsafe { std::ptr::read_volatile(self.base.add(word)) }
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc.
        unsafe {
            cu::cuMemFreeHost(self.host.cast());
        }
    }
}

/// One side of [`Stream::copy_2d_async`]: where its first row starts, and
/// the bytes from one row's start to the next's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pitched2D {
    /// Device memory.
    Device {
        /// The first row.
        addr: u64,
        /// Bytes between row starts.
        pitch: usize,
    },
    /// Host memory registered with the context.
    Host {
        /// The first row.
        ptr: *mut u8,
        /// Bytes between row starts.
        pitch: usize,
    },
}

/// A non-blocking CUDA stream with a priority.
pub struct Stream {
    pub(crate) raw: cu::CUstream,
    /// CUDA priority: numerically lower is more urgent.
    pub priority: i32,
}

// SAFETY: streams may be used from any thread of the context.
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream; `priority` is clamped to the device's range.
    pub fn new(gpu: &Gpu, priority: i32) -> Result<Stream> {
        Stream::in_range(gpu.priority_range, priority)
    }
    /// A non-blocking stream in the current context; `priority` is clamped
    /// to `(least, greatest)`, the context's range.
    pub fn in_range((least, greatest): (i32, i32), priority: i32) -> Result<Stream> {
        let p = priority.clamp(greatest.min(least), greatest.max(least));
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        check("cuStreamCreateWithPriority", unsafe {
            cu::cuStreamCreateWithPriority(&mut raw, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32, p)
        })?;
        Ok(Stream { raw, priority: p })
    }
    /// Lowest priority (the default).
    pub fn low(gpu: &Gpu) -> Result<Stream> {
        Stream::new(gpu, gpu.priority_range.0)
    }
    /// Highest priority the device offers.
    pub fn high(gpu: &Gpu) -> Result<Stream> {
        Stream::new(gpu, gpu.priority_range.1)
    }
    /// Waits until everything queued on the stream has run.
    pub fn sync(&self) -> Result<()> {
        // SAFETY: valid stream.
        check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(self.raw) })
    }
    /// Makes later work on this stream wait for `e`.
    pub fn wait(&self, e: &Event) -> Result<()> {
        // SAFETY: valid handles.
        check("cuStreamWaitEvent", unsafe { cu::cuStreamWaitEvent(self.raw, e.raw(), 0) })
    }
    /// Writes a 32-bit word in device memory from the stream's front end: it
    /// needs no SM, so it lands even while every SM is busy.
    pub fn write_u32(&self, addr: u64, value: u32) -> Result<()> {
        // SAFETY: addr is device memory owned by the caller.
        check("cuStreamWriteValue32", unsafe { cu::cuStreamWriteValue32_v2(self.raw, addr, value, 0) })
    }
    /// Makes later work on this stream wait until the 32-bit word at `addr` (device
    /// memory or host-mapped memory) is at least `value` (`cuStreamWaitValue32`, GEQ).
    pub fn wait_u32_geq(&self, addr: u64, value: u32) -> Result<()> {
        // SAFETY: addr is memory owned by the caller, valid until the wait is satisfied.
        check("cuStreamWaitValue32", unsafe {
            cu::cuStreamWaitValue32_v2(
                self.raw,
                addr,
                value,
                cu::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        })
    }
    /// Asynchronous host-to-device copy; `src` must stay valid until the stream reaches it.
    ///
    /// # Safety
    /// `src` must point to `bytes` readable bytes that live until the copy ran.
    pub unsafe fn copy_to_device_async(&self, dst: u64, src: *const u8, bytes: usize) -> Result<()> {
        check("cuMemcpyHtoDAsync", unsafe { cu::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, self.raw) })
    }
    /// Asynchronous pitched copy: `height` rows of `width` bytes from `src`
    /// to `dst`, each side's rows its pitch apart; either side device memory
    /// or host memory registered with the context. One linear async copy per
    /// row, in stream order (`cuMemcpy2DAsync` aborted the device process on
    /// the H200, c05cfa0, cause not found yet: the linear copies are the ones
    /// every other copy uses).
    ///
    /// # Safety
    /// Both sides' rows (`(height - 1) × pitch + width` bytes from their
    /// start) must be memory of their kind that lives until the copy ran.
    pub unsafe fn copy_2d_async(&self, src: Pitched2D, dst: Pitched2D, width: usize, height: usize) -> Result<()> {
        for row in 0..height {
            // SAFETY: the caller's guarantee, row by row (each row lies in its side's span).
            unsafe {
                match (src, dst) {
                    (Pitched2D::Host { ptr, pitch: sp }, Pitched2D::Device { addr, pitch: dp }) => {
                        self.copy_to_device_async(addr + (row * dp) as u64, ptr.add(row * sp).cast_const(), width)?
                    }
                    (Pitched2D::Device { addr, pitch: sp }, Pitched2D::Host { ptr, pitch: dp }) => {
                        self.copy_to_host_async(ptr.add(row * dp), addr + (row * sp) as u64, width)?
                    }
                    (Pitched2D::Device { addr: s, pitch: sp }, Pitched2D::Device { addr: d, pitch: dp }) => {
                        self.copy_on_device_async(d + (row * dp) as u64, s + (row * sp) as u64, width)?
                    }
                    (Pitched2D::Host { .. }, Pitched2D::Host { .. }) => {
                        return Err(CudaError::Invalid("a 2-D copy from host memory to host memory".into()))
                    }
                }
            }
        }
        Ok(())
    }
    /// Asynchronous device-to-device copy.
    ///
    /// # Safety
    /// Both ranges must be device memory of `bytes` bytes that lives until the copy ran.
    pub unsafe fn copy_on_device_async(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        check("cuMemcpyDtoDAsync", unsafe { cu::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw) })
    }
    /// Asynchronously sets `bytes` bytes at `dst` to `value`.
    ///
    /// # Safety
    /// The range must be device memory that lives until the memset ran.
    pub unsafe fn memset_async(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        check("cuMemsetD8Async", unsafe { cu::cuMemsetD8Async(dst, value, bytes, self.raw) })
    }
    /// Asynchronously sets `bytes` bytes at `dst` to `value`, repeated as
    /// `width`-byte words (2 or 4; `dst` aligned to it, `bytes` a multiple).
    ///
    /// # Safety
    /// The range must be device memory that lives until the fill ran.
    pub unsafe fn fill_async(&self, dst: u64, value: u32, width: u8, bytes: usize) -> Result<()> {
        match width {
            // SAFETY: the caller's guarantee; counts in words.
            2 => check("cuMemsetD16Async", unsafe { cu::cuMemsetD16Async(dst, value as u16, bytes / 2, self.raw) }),
            4 => check("cuMemsetD32Async", unsafe { cu::cuMemsetD32Async(dst, value, bytes / 4, self.raw) }),
            other => Err(CudaError::Invalid(format!("a fill of {other}-byte words (2 or 4)"))),
        }
    }
    /// Asynchronous device-to-host copy.
    ///
    /// # Safety
    /// `dst` must point to `bytes` writable bytes that live until the copy ran.
    pub unsafe fn copy_to_host_async(&self, dst: *mut u8, src: u64, bytes: usize) -> Result<()> {
        check("cuMemcpyDtoHAsync", unsafe { cu::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, self.raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created by cuStreamCreateWithPriority.
        unsafe {
            cu::cuStreamDestroy_v2(self.raw);
        }
    }
}

/// A CUDA event: a point in a stream, to wait for or to time.
pub struct Event {
    raw: cu::CUevent,
}

// SAFETY: event handles may be recorded and queried from any thread of the context.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// An event that records a timestamp.
    pub fn new() -> Result<Event> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer.
        check("cuEventCreate", unsafe { cu::cuEventCreate(&mut raw, cu::CUevent_flags::CU_EVENT_DEFAULT as u32) })?;
        Ok(Event { raw })
    }
    /// An event for completion only (no timestamp): cheaper to record.
    pub fn new_sync_only() -> Result<Event> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: out-pointer.
        check("cuEventCreate", unsafe {
            cu::cuEventCreate(&mut raw, cu::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(Event { raw })
    }
    /// Places the event at the current end of stream `s`.
    pub fn record(&self, s: &Stream) -> Result<()> {
        // SAFETY: valid handles.
        check("cuEventRecord", unsafe { cu::cuEventRecord(self.raw, s.raw) })
    }
    /// [`Event::record`] on a stream known by its raw handle (a launch
    /// record keeps it to record its end lazily: `preempt::WorkerLaunch`).
    ///
    /// # Safety
    /// `s` must be a live stream of the event's context.
    pub(crate) unsafe fn record_raw(&self, s: cu::CUstream) -> Result<()> {
        // SAFETY: the caller's guarantee, and a valid event.
        check("cuEventRecord", unsafe { cu::cuEventRecord(self.raw, s) })
    }
    /// Waits until the work before the record has run.
    pub fn sync(&self) -> Result<()> {
        // SAFETY: valid handle.
        check("cuEventSynchronize", unsafe { cu::cuEventSynchronize(self.raw) })
    }
    /// True once the work before the record has finished.
    pub fn done(&self) -> Result<bool> {
        // SAFETY: valid handle.
        let r = unsafe { cu::cuEventQuery(self.raw) };
        if r == cu::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", r).map(|_| true)
    }
    pub(crate) fn raw(&self) -> cu::CUevent {
        self.raw
    }
    /// Milliseconds from `self` to `later`.
    pub fn elapsed_ms(&self, later: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid handles, both recorded.
        check("cuEventElapsedTime", unsafe { cu::cuEventElapsedTime_v2(&mut ms, self.raw, later.raw) })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate.
        unsafe {
            cu::cuEventDestroy_v2(self.raw);
        }
    }
}

//! Green contexts: the driver's own way to bind work to a set of SMs
//! (`cuGreenCtxCreate`, CUDA 12.4+), next to gpumux's `%smid` filtering.
//!
//! The steps the driver documents (Driver API, "Green Contexts"):
//! 1. the device's SM resource (`cuDeviceGetDevResource`);
//! 2. split it into groups (`cuDevSmResourceSplitByCount`; on compute capability 9.0 the
//!    groups are multiples of 8 SMs, so an H100's 132 SMs give 16 groups of 8 and a
//!    remainder of 4);
//! 3. a descriptor over one or more groups of *the same split* (`cuDevResourceGenerateDesc`);
//! 4. the green context (`cuGreenCtxCreate`, flag `CU_GREEN_CTX_DEFAULT_STREAM`, which the
//!    13.0 documentation calls required);
//! 5. streams on it (`cuGreenCtxStreamCreate`, `CU_STREAM_NON_BLOCKING` required).
//!
//! A green context is "a normal primary context but with the resources of the green
//! context" (`cuCtxFromGreenCtx`): memory allocated in the primary context is valid in it,
//! and events of the primary context may be recorded for it (`cuGreenCtxRecordEvent`:
//! "hEvent and hCtx must be from the same primary context"). Kernels of modules loaded in
//! the primary context are therefore launched on green-context streams as they are;
//! [`GreenContext::module`] loads a module with the green context current, for the case a
//! driver refuses that (see `spatial.rs` in the gpumux-cuda-bench crate).
//!
//! Unlike a worker's SM mask, a green context's SMs are fixed when it is created and a
//! kernel cannot move between green contexts while it runs.

use super::{check, Gpu, Module, Stream};
use crate::error::{CudaError, Result};
use crate::nvrtc;
use cudarc::driver::sys as cu;

/// The lowest driver API version with green contexts (12.4).
pub const MIN_DRIVER_VERSION: i32 = 12040;

/// Driver entry points the wrapper calls; looked up before the first call, because
/// cudarc's loader panics on a missing symbol.
const SYMBOLS: [&str; 9] = [
    "cuDeviceGetDevResource",
    "cuDevSmResourceSplitByCount",
    "cuDevResourceGenerateDesc",
    "cuGreenCtxCreate",
    "cuGreenCtxDestroy",
    "cuGreenCtxStreamCreate",
    "cuGreenCtxGetDevResource",
    "cuGreenCtxRecordEvent",
    "cuCtxFromGreenCtx",
];

/// Why this driver offers no green contexts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GreenUnsupported {
    /// The driver predates CUDA 12.4.
    #[error(
        "green contexts need a CUDA {}.{} driver or newer; this driver implements CUDA {}.{}",
        MIN_DRIVER_VERSION / 1000, MIN_DRIVER_VERSION % 1000 / 10, .driver_version / 1000, .driver_version % 1000 / 10
    )]
    OldDriver {
        /// The driver's API version (`cuDriverGetVersion`, 12030 for 12.3).
        driver_version: i32,
    },
    /// The driver library lacks entry points the wrapper calls.
    #[error(
        "green contexts unavailable: libcuda (CUDA {}.{}) lacks {}",
        .driver_version / 1000, .driver_version % 1000 / 10, .missing.join(", ")
    )]
    MissingSymbols {
        /// The driver's API version.
        driver_version: i32,
        /// The symbols it lacks.
        missing: Vec<String>,
    },
}

/// Whether green contexts can be used with a driver of API version `driver_version`
/// whose library lacks the symbols in `missing`: `Err` says why not.
pub fn support_from(driver_version: i32, missing: &[&str]) -> std::result::Result<(), GreenUnsupported> {
    if driver_version < MIN_DRIVER_VERSION {
        return Err(GreenUnsupported::OldDriver { driver_version });
    }
    if !missing.is_empty() {
        return Err(GreenUnsupported::MissingSymbols {
            driver_version,
            missing: missing.iter().map(|s| s.to_string()).collect(),
        });
    }
    Ok(())
}

/// `Ok` when this process's driver has green contexts; a clear reason otherwise. Never panics.
pub fn supported(gpu: &Gpu) -> Result<()> {
    if !super::driver_present() {
        return Err(CudaError::NoDriver("libcuda.so not found on the loader path".into()));
    }
    // SAFETY: the library is present (checked above), so `culib` does not panic; `get`
    // only looks a symbol up, it calls nothing.
    let lib = unsafe { cu::culib() };
    let missing: Vec<&str> = SYMBOLS
        .iter()
        .copied()
        .filter(|s| unsafe { lib.get::<unsafe extern "C" fn()>(s.as_bytes()) }.is_err())
        .collect();
    Ok(support_from(gpu.summary.driver_version, &missing)?)
}

/// An SM resource: the whole device's, a group of a split, or a split's remainder.
#[derive(Clone, Copy)]
pub struct SmResource {
    raw: cu::CUdevResource,
}

impl std::fmt::Debug for SmResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SmResource {{ sm_count: {}, min_partition: {}, alignment: {} }}",
            self.sm_count(),
            self.min_partition_size(),
            self.coscheduled_alignment()
        )
    }
}

fn zeroed_resource() -> cu::CUdevResource {
    // SAFETY: CUdevResource is plain C data (an enum whose 0 is CU_DEV_RESOURCE_TYPE_INVALID,
    // byte arrays and a union of integers): all zero bytes are a valid value.
    unsafe { std::mem::zeroed() }
}

impl SmResource {
    /// True when the driver filled it in as an SM resource.
    pub fn is_sm(&self) -> bool {
        self.raw.type_ == cu::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM
    }
    /// SMs in the resource (0 when it is not an SM resource).
    pub fn sm_count(&self) -> u32 {
        if !self.is_sm() {
            return 0;
        }
        // SAFETY: the type says the union holds the SM variant.
        unsafe { self.raw.__bindgen_anon_1.sm.smCount }
    }
    /// Smallest SM count a split of this resource can produce (`minSmPartitionSize`).
    pub fn min_partition_size(&self) -> u32 {
        if !self.is_sm() {
            return 0;
        }
        // SAFETY: as above.
        unsafe { self.raw.__bindgen_anon_1.sm.minSmPartitionSize }
    }
    /// Granularity of a split (`smCoscheduledAlignment`; 8 on compute capability 9.0).
    pub fn coscheduled_alignment(&self) -> u32 {
        if !self.is_sm() {
            return 0;
        }
        // SAFETY: as above.
        unsafe { self.raw.__bindgen_anon_1.sm.smCoscheduledAlignment }
    }
}

/// The groups of one `cuDevSmResourceSplitByCount` call. Only resources of the same split
/// may be combined into one descriptor.
#[derive(Clone, Debug)]
pub struct SmSplit {
    /// The groups, each of the split's size.
    pub groups: Vec<SmResource>,
    /// SMs no group got (4 on an H100 split into groups of 8), when there are any.
    pub remainder: Option<SmResource>,
}

impl SmSplit {
    /// SMs of each group when they all have the same count (they should: the driver
    /// promises "symmetrical partitions").
    pub fn group_sms(&self) -> Option<u32> {
        let first = self.groups.first()?.sm_count();
        self.groups.iter().all(|g| g.sm_count() == first).then_some(first)
    }
}

impl Gpu {
    /// The device's whole SM resource (`cuDeviceGetDevResource`).
    pub fn sm_resource(&self) -> Result<SmResource> {
        supported(self)?;
        let mut raw = zeroed_resource();
        // SAFETY: valid device, out-pointer to a local.
        check("cuDeviceGetDevResource", unsafe {
            cu::cuDeviceGetDevResource(self.dev, &mut raw, cu::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM)
        })?;
        let r = SmResource { raw };
        if !r.is_sm() || r.sm_count() == 0 {
            return Err(CudaError::Invalid("cuDeviceGetDevResource returned no SMs".into()));
        }
        Ok(r)
    }

    /// Splits `input` into as many groups of at least `min_count` SMs as the driver allows
    /// (`cuDevSmResourceSplitByCount`, default flags). The driver rounds `min_count` up to
    /// its granularity (8 SMs on compute capability 9.0).
    pub fn split_sms(&self, input: &SmResource, min_count: u32) -> Result<SmSplit> {
        supported(self)?;
        if !input.is_sm() {
            return Err(CudaError::Invalid("split_sms: the input is not an SM resource".into()));
        }
        if min_count > input.sm_count() {
            return Err(CudaError::Invalid(format!(
                "split_sms: groups of {min_count} SMs asked from a resource of {}",
                input.sm_count()
            )));
        }
        // First ask how many groups the split makes (result = NULL), then make them.
        let mut n: std::ffi::c_uint = 0;
        // SAFETY: NULL result asks for the count only; the other pointers are valid.
        check("cuDevSmResourceSplitByCount (count)", unsafe {
            cu::cuDevSmResourceSplitByCount(
                std::ptr::null_mut(),
                &mut n,
                &input.raw,
                std::ptr::null_mut(),
                0,
                min_count,
            )
        })?;
        if n == 0 {
            return Err(CudaError::Invalid(format!(
                "cuDevSmResourceSplitByCount makes no group of {min_count} SMs out of {}",
                input.sm_count()
            )));
        }
        let mut groups = vec![zeroed_resource(); n as usize];
        let mut rem = zeroed_resource();
        // SAFETY: `groups` holds `n` resources, as `n` says; `rem` is a local.
        check("cuDevSmResourceSplitByCount", unsafe {
            cu::cuDevSmResourceSplitByCount(groups.as_mut_ptr(), &mut n, &input.raw, &mut rem, 0, min_count)
        })?;
        groups.truncate(n as usize);
        let groups: Vec<SmResource> = groups.into_iter().map(|raw| SmResource { raw }).collect();
        if groups.iter().any(|g| !g.is_sm() || g.sm_count() == 0) {
            return Err(CudaError::Invalid("cuDevSmResourceSplitByCount returned an empty group".into()));
        }
        let rem = SmResource { raw: rem };
        Ok(SmSplit { groups, remainder: (rem.is_sm() && rem.sm_count() > 0).then_some(rem) })
    }

    /// A green context over `resources` (all from one split, or the device's whole
    /// resource alone): `cuDevResourceGenerateDesc` + `cuGreenCtxCreate`.
    pub fn green_context(&self, resources: &[SmResource]) -> Result<GreenContext> {
        supported(self)?;
        if resources.is_empty() {
            return Err(CudaError::Invalid("green_context: no SM resource given".into()));
        }
        let mut raw: Vec<cu::CUdevResource> = resources.iter().map(|r| r.raw).collect();
        let mut desc: cu::CUdevResourceDesc = std::ptr::null_mut();
        // SAFETY: `raw` holds `raw.len()` resources; out-pointer to a local. The
        // descriptor stays valid for the life of the process (no destroy call exists).
        check("cuDevResourceGenerateDesc", unsafe {
            cu::cuDevResourceGenerateDesc(&mut desc, raw.as_mut_ptr(), raw.len() as std::ffi::c_uint)
        })?;
        // The documentation advises the primary context be active first (it is retained
        // by `Gpu::open`); make it current so the creation does not pay its setup again.
        self.bind()?;
        let mut g: cu::CUgreenCtx = std::ptr::null_mut();
        // SAFETY: a descriptor just generated for this device; out-pointer to a local.
        check("cuGreenCtxCreate", unsafe {
            cu::cuGreenCtxCreate(
                &mut g,
                desc,
                self.dev,
                cu::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as std::ffi::c_uint,
            )
        })?;
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `g` was just created.
        let converted = check("cuCtxFromGreenCtx", unsafe { cu::cuCtxFromGreenCtx(&mut ctx, g) });
        let mut res = zeroed_resource();
        // SAFETY: `g` was just created; out-pointer to a local.
        let queried = check("cuGreenCtxGetDevResource", unsafe {
            cu::cuGreenCtxGetDevResource(g, &mut res, cu::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM)
        });
        let gc = GreenContext {
            raw: g,
            ctx,
            sm_count: SmResource { raw: res }.sm_count(),
            priority_range: self.priority_range,
            arch: self.arch(),
        };
        // `gc` is dropped (and the green context destroyed) on these errors.
        converted?;
        queried?;
        if gc.sm_count == 0 {
            return Err(CudaError::Invalid("cuGreenCtxGetDevResource reports a green context with no SMs".into()));
        }
        Ok(gc)
    }
}

/// A green context: work on its streams runs only on its SMs.
pub struct GreenContext {
    raw: cu::CUgreenCtx,
    /// The same green context as a `CUcontext` (`cuCtxFromGreenCtx`), to make it current.
    ctx: cu::CUcontext,
    sm_count: u32,
    priority_range: (i32, i32),
    arch: u32,
}

// SAFETY: the handle is used only through driver calls that take it explicitly
// (stream creation, event record); making it current is done by `module` on the
// calling thread and undone before it returns.
unsafe impl Send for GreenContext {}
unsafe impl Sync for GreenContext {}

impl GreenContext {
    /// SMs the driver provisioned for it (`cuGreenCtxGetDevResource`).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// A non-blocking stream whose work runs only on this context's SMs
    /// (`cuGreenCtxStreamCreate`); `priority` is clamped to the device's range.
    /// Drop its streams before the context: after `cuGreenCtxDestroy` a stream only
    /// accepts `cuStreamDestroy`.
    pub fn stream(&self, priority: i32) -> Result<Stream> {
        let (least, greatest) = self.priority_range;
        let p = priority.clamp(greatest.min(least), greatest.max(least));
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid green context; out-pointer to a local. CU_STREAM_NON_BLOCKING is
        // the one flag the driver accepts here.
        check("cuGreenCtxStreamCreate", unsafe {
            cu::cuGreenCtxStreamCreate(&mut raw, self.raw, cu::CUstream_flags::CU_STREAM_NON_BLOCKING as u32, p)
        })?;
        Ok(Stream { raw, priority: p })
    }

    /// Lowest-priority stream (the default).
    pub fn low_stream(&self) -> Result<Stream> {
        self.stream(self.priority_range.0)
    }

    /// Highest-priority stream.
    pub fn high_stream(&self) -> Result<Stream> {
        self.stream(self.priority_range.1)
    }

    /// Records `e` over all work submitted to this green context so far
    /// (`cuGreenCtxRecordEvent`; the event may come from the primary context).
    pub fn record(&self, e: &super::Event) -> Result<()> {
        // SAFETY: valid handles.
        check("cuGreenCtxRecordEvent", unsafe { cu::cuGreenCtxRecordEvent(self.raw, e.raw()) })
    }

    /// Compiles `src` (NVRTC, cached) and loads it with this green context current, for
    /// drivers that refuse primary-context kernels on green-context streams. Not cached:
    /// each call loads a new module. The calling thread's current context is restored.
    pub fn module(&self, name: &str, src: &str) -> Result<Module> {
        let compiled = nvrtc::compile(name, src, self.arch, &[])?;
        crate::client::forget_current();
        // SAFETY: `ctx` came from cuCtxFromGreenCtx for this live green context.
        check("cuCtxPushCurrent (green context)", unsafe { cu::cuCtxPushCurrent_v2(self.ctx) })?;
        let mut module = std::ptr::null_mut();
        // SAFETY: the CUBIN outlives the call; the driver copies it.
        let loaded = check("cuModuleLoadData (green context)", unsafe {
            cu::cuModuleLoadData(&mut module, compiled.cubin.as_ptr().cast())
        });
        let mut prev = std::ptr::null_mut();
        // SAFETY: pops what was pushed above.
        let popped = check("cuCtxPopCurrent", unsafe { cu::cuCtxPopCurrent_v2(&mut prev) });
        loaded?;
        popped?;
        Ok(Module::adopt(module, format!("{name} (green context)")))
    }
}

impl Drop for GreenContext {
    fn drop(&mut self) {
        // SAFETY: created by cuGreenCtxCreate; errors at teardown have no one to go to.
        unsafe {
            cu::cuGreenCtxDestroy(self.raw);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn support_needs_12_4_and_every_symbol() {
        assert!(support_from(12040, &[]).is_ok());
        assert!(support_from(13000, &[]).is_ok());
        let old = support_from(12030, &[]).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(old, "green contexts need a CUDA 12.4 driver or newer; this driver implements CUDA 12.3");
        let lacking = support_from(13000, &["cuGreenCtxCreate"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(lacking, "green contexts unavailable: libcuda (CUDA 13.0) lacks cuGreenCtxCreate");
    }

    #[test]
    fn zeroed_resource_is_not_an_sm_resource() {
        let r = SmResource { raw: zeroed_resource() };
        assert!(!r.is_sm());
        assert_eq!((r.sm_count(), r.min_partition_size(), r.coscheduled_alignment()), (0, 0, 0));
        let s = SmSplit { groups: vec![], remainder: None };
        assert_eq!(s.group_sms(), None);
    }

    #[test]
    fn sm_resource_layout_matches_cuda_13_0() {
        // type (4) + 92 bytes of padding + a 48-byte union: 144 bytes, as in cuda.h 13.0.
        assert_eq!(std::mem::size_of::<cu::CUdevResource>(), 144);
    }
}

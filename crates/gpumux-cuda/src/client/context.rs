//! The CUDA context that serves client kernels: a context of its own
//! (`cuCtxCreate`), not the device's primary context.
//!
//! Why its own: a kernel that faults breaks the context it ran in for good
//! (every later call fails with the same sticky error). A created context can
//! be destroyed and created again without touching anything else in the
//! process (the suite device and other code use the primary context), and
//! destroying it is a context operation only: the GPU's settings (clocks,
//! compute mode, MIG, ECC) are never touched and the GPU is never reset.

use crate::error::Result;
use crate::runtime::{check, query_device, DeviceSummary};
use cudarc::driver::sys as cu;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Contexts destroyed so far (by [`ClientContext`]): a handle remembered as
/// current is trusted only within the count it was remembered at, since a
/// destroyed context's handle may come back as a new context's.
static DESTROYED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The [`ClientContext`] this thread made current last (its handle and
    /// [`DESTROYED`] then), while nothing in this crate has set another
    /// current since; (null, 0) when unknown.
    ///
    /// Why it is safe to trust it instead of asking the driver
    /// (`cuCtxGetCurrent`, several times per launch command on the device
    /// process's main thread): a thread's current context changes only by
    /// the calls of that thread, and in this workspace only this crate makes
    /// them (`cuCtxSetCurrent`, `cuCtxPushCurrent`/`PopCurrent`,
    /// `cuCtxCreate`, `cuCtxDestroy`; no other crate calls the driver's
    /// context functions, nor cudarc's safe API that would). Each of them
    /// goes through [`made_current`] or [`forget_current`], so the cache
    /// is either right or empty. A context destroyed on another thread bumps
    /// [`DESTROYED`], which empties every thread's cache.
    static CURRENT: Cell<(usize, u64)> = const { Cell::new((0, 0)) };
}

/// Notes that `ctx` (a [`ClientContext`]'s handle) was made current on this thread.
fn made_current(ctx: cu::CUcontext) {
    CURRENT.with(|c| c.set((ctx as usize, DESTROYED.load(Ordering::Acquire))));
}

/// Notes that this thread's current context may have changed to one this
/// module does not know: the next [`ClientContext::bind`] asks the driver.
/// Every context call of this crate outside this module calls it.
pub(crate) fn forget_current() {
    CURRENT.with(|c| c.set((0, 0)));
}

/// Whether `ctx` is known current on this thread without asking the driver.
fn known_current(ctx: cu::CUcontext) -> bool {
    !ctx.is_null() && CURRENT.with(|c| c.get()) == (ctx as usize, DESTROYED.load(Ordering::Acquire))
}

/// A [`ClientContext`] is destroyed: no thread's remembered handle holds.
fn destroyed() {
    DESTROYED.fetch_add(1, Ordering::AcqRel);
    forget_current();
}

/// One created CUDA context on one GPU, destroyed when dropped.
pub struct ClientContext {
    raw: cu::CUcontext,
    dev: cu::CUdevice,
    /// The GPU.
    pub summary: DeviceSummary,
    /// The driver's index of the GPU.
    pub ordinal: i32,
    /// (least, greatest) stream priority; numerically lower is more urgent.
    pub priority_range: (i32, i32),
}

// SAFETY: a context handle may be made current on any thread; the owner
// binds it before each use (`bind`).
unsafe impl Send for ClientContext {}

impl ClientContext {
    /// The driver's handle (for a thread that makes calls in this context:
    /// `runtime::launcher`).
    pub(crate) fn raw(&self) -> cu::CUcontext {
        self.raw
    }

    /// Creates a context on GPU `ordinal` and makes it current on this thread.
    /// A clear error, never a panic, without a driver or a GPU.
    pub fn create(ordinal: i32) -> Result<ClientContext> {
        let (dev, summary) = query_device(ordinal)?;
        let raw = create_raw(dev)?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: raw is current (create_raw); out-pointers to locals.
        let range =
            check("cuCtxGetStreamPriorityRange", unsafe { cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) });
        let ctx = ClientContext { raw, dev, summary, ordinal, priority_range: (least, greatest) };
        range.map(|_| ctx)
    }

    /// Makes the context current on the calling thread, if it is not yet.
    /// The device binds before every use, several times per command and
    /// poll; asking which context is current reads the thread's state, while
    /// setting it waits for the driver's lock, which the launcher thread
    /// holds through each `cuLaunchKernel` (`runtime::launcher`). Once
    /// made current here, it is known current without the driver's word
    /// until something else may have changed it (`CURRENT`).
    pub fn bind(&self) -> Result<()> {
        if known_current(self.raw) {
            return Ok(());
        }
        let mut current: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut current) })?;
        if current != self.raw {
            // SAFETY: raw is a live created context.
            check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(self.raw) })?;
        }
        made_current(self.raw);
        Ok(())
    }

    /// Destroys the context (with every allocation, module, stream, event and
    /// host registration made in it) and creates a fresh one on the same GPU.
    /// The caller must have dropped its handles of the old context first.
    pub fn recreate(&mut self) -> Result<()> {
        // SAFETY: raw is a live created context; its handles are gone.
        unsafe {
            // A broken context still destroys cleanly; the error, if any, is the fault's.
            cu::cuCtxDestroy_v2(self.raw);
        }
        destroyed();
        self.raw = std::ptr::null_mut();
        self.raw = create_raw(self.dev)?;
        Ok(())
    }

    /// A device attribute (`cuDeviceGetAttribute`).
    pub fn attr(&self, a: cu::CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-pointer to a local; dev is a device of the initialised driver.
        check("cuDeviceGetAttribute", unsafe { cu::cuDeviceGetAttribute(&mut v, a, self.dev) })?;
        Ok(v)
    }

    /// The `sm_XY` architecture number (90 for compute capability 9.0).
    pub fn arch(&self) -> u32 {
        self.summary.compute_capability.0 * 10 + self.summary.compute_capability.1
    }
}

/// A new context on `dev`, current on this thread.
fn create_raw(dev: cu::CUdevice) -> Result<cu::CUcontext> {
    // cuCtxCreate pushes the new context (this thread's current changes).
    forget_current();
    let mut raw = std::ptr::null_mut();
    let mut params = cu::CUctxCreateParams {
        execAffinityParams: std::ptr::null_mut(),
        numExecAffinityParams: 0,
        cigParams: std::ptr::null_mut(),
    };
    // SAFETY: out-pointer to a local; no affinity or CIG parameters. The new
    // context is pushed (made current) by the call.
    check("cuCtxCreate", unsafe {
        cu::cuCtxCreate_v4(&mut raw, &mut params, cu::CUctx_flags::CU_CTX_SCHED_SPIN as u32, dev)
    })?;
    check("cuCtxSetCurrent", unsafe { cu::cuCtxSetCurrent(raw) })?;
    made_current(raw);
    Ok(raw)
}

impl Drop for ClientContext {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: a live created context; its owner dropped its handles first.
            unsafe {
                cu::cuCtxDestroy_v2(self.raw);
            }
            destroyed();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made current, `h` is known current, unless a context was destroyed
    /// meanwhile (another test's, on a GPU machine): then it must not be.
    fn known_after_made(h: cu::CUcontext) -> bool {
        let before = DESTROYED.load(Ordering::Acquire);
        made_current(h);
        let known = known_current(h);
        known || DESTROYED.load(Ordering::Acquire) != before
    }

    #[test]
    fn the_remembered_current_context_holds_only_until_something_may_change_it() {
        // Fake handles: no driver call is made here.
        let (a, b) = (0x1000usize as cu::CUcontext, 0x2000usize as cu::CUcontext);
        forget_current();
        assert!(!known_current(a), "nothing made current yet");
        assert!(!known_current(std::ptr::null_mut()), "a null handle is never known current");
        assert!(known_after_made(a));
        assert!(!known_current(b), "only the one made current");
        forget_current();
        assert!(!known_current(a), "forgotten after another context call");
        assert!(known_after_made(b));
        assert!(!known_current(a));
        // A context destroyed on another thread empties this thread's memory
        // (its handle may come back as a new context's).
        std::thread::spawn(destroyed).join().map_err(|_| "the destroying thread panicked").unwrap();
        assert!(!known_current(b), "a destroy elsewhere invalidates the remembered handle");
        // Another thread's memory is its own: it knows nothing of this one's.
        assert!(known_after_made(a));
        let handle = a as usize;
        let elsewhere = std::thread::spawn(move || known_current(handle as cu::CUcontext));
        assert!(!elsewhere.join().map_err(|_| "the other thread panicked").unwrap());
        forget_current();
    }
}

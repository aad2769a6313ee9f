//! Clients' modules: CUDA C source → preemptible workers → CUBIN (NVRTC,
//! cached) → loaded kernels with what the engine and the daemon need to know
//! of each (parameter sizes, registers, shared memory, block size limit).
//!
//! Compiling needs NVRTC only (no GPU): [`compile`] is what CI tests;
//! loading ([`ClientDevice::load_module`](super::ClientDevice::load_module)) needs the context.

use crate::error::CudaError;
use crate::nvrtc;
use crate::runtime::{Function, Module};
use crate::transform::{self, TransformError};
use cudarc::driver::sys::CUfunction_attribute as FA;
use std::sync::Arc;

/// Option prefixes a client may not give: they change the architecture the
/// daemon compiles for, or what NVRTC produces (the daemon needs a complete,
/// loadable CUBIN for its own GPU).
const REFUSED_OPTIONS: &[(&str, &str)] = &[
    ("-arch", "the daemon compiles for its own GPU's architecture"),
    ("--gpu-architecture", "the daemon compiles for its own GPU's architecture"),
    ("-rdc", "relocatable device code would need a link step the daemon does not do"),
    ("--relocatable-device-code", "relocatable device code would need a link step the daemon does not do"),
    ("-dlto", "link-time-optimisation IR is not a loadable CUBIN"),
    ("--dlink-time-opt", "link-time-optimisation IR is not a loadable CUBIN"),
    ("-ewp", "whole-program mode changes the output"),
    ("--extensible-whole-program", "whole-program mode changes the output"),
    ("-fdevice-syntax-only", "a syntax check produces no code"),
    ("--fdevice-syntax-only", "a syntax check produces no code"),
];

/// Bytes of the two parameters the transformation appends to every worker:
/// the control record's address and the launch description (`gmx_launch_t`).
const WORKER_TAIL: [usize; 2] = [8, 72];

/// Why a client's module did not load.
#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    /// An option the daemon does not accept.
    #[error("option `{option}` is not accepted: {why}")]
    Option {
        /// The option as given.
        option: String,
        /// Why.
        why: &'static str,
    },
    /// The transformation refuses a kernel (the message names the line).
    #[error(transparent)]
    Transform(#[from] TransformError),
    /// NVRTC refuses the source; the log says why.
    #[error("the module does not compile:\n{log}")]
    Compile {
        /// NVRTC's log (line numbers are the client's).
        log: String,
    },
    /// No NVRTC, a driver error while loading, a kernel the module lacks.
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// Refuses options that change the architecture or the output.
pub fn check_options(options: &[String]) -> Result<(), ModuleError> {
    for o in options {
        let head = o.split(['=', ' ']).next().unwrap_or("");
        if let Some((_, why)) = REFUSED_OPTIONS.iter().find(|(p, _)| head == *p) {
            return Err(ModuleError::Option { option: o.clone(), why });
        }
    }
    Ok(())
}

/// A client module compiled to workers (not yet loaded).
#[derive(Debug)]
pub struct CompiledModule {
    /// The worker CUBIN and its exported names.
    pub compiled: Arc<nvrtc::Compiled>,
    /// Launchable kernels: (name as written, exported name, parameter count).
    pub kernels: Vec<(String, String, usize)>,
    /// Found in the compile cache.
    pub cached: bool,
    /// The client's source compiled as it is, and each kernel's exported name
    /// there (in the order of `kernels`), for a device that runs launches
    /// natively under the hardware's stream priorities ([`add_native`]).
    pub native: Option<(Arc<nvrtc::Compiled>, Vec<String>)>,
}

/// Transforms `source` and compiles the workers for `sm_{arch}` with the
/// client's `options` (checked first). Template kernels are skipped: they
/// have no exported name until instantiated.
pub fn compile(name: &str, source: &str, options: &[String], arch: u32) -> Result<CompiledModule, ModuleError> {
    check_options(options)?;
    let t = transform::transform(source)?;
    let mut launchable: Vec<(String, usize)> = Vec::new();
    for k in t.kernels.iter().filter(|k| k.defined && !k.template) {
        if !launchable.iter().any(|(n, _)| *n == k.name) {
            launchable.push((k.name.clone(), k.params.len()));
        }
    }
    // `&K` names the worker (same name, longer signature) however it is linked.
    let exprs: Vec<String> = launchable.iter().map(|(n, _)| format!("&{n}")).collect();
    let expr_refs: Vec<&str> = exprs.iter().map(String::as_str).collect();
    let (compiled, cached) = nvrtc::compile_with(name, &t.source, arch, options, &expr_refs).map_err(|e| match e {
        CudaError::Compile { log, msg, .. } => ModuleError::Compile { log: if log.is_empty() { msg } else { log } },
        other => ModuleError::Cuda(other),
    })?;
    let mut kernels = Vec::new();
    for ((k, params), expr) in launchable.into_iter().zip(&exprs) {
        let lowered = compiled.lowered.iter().find(|(e, _)| e == expr).map(|(_, l)| l.clone());
        let exported = lowered.ok_or_else(|| CudaError::Invalid(format!("NVRTC gave no exported name for `{k}`")))?;
        kernels.push((k, exported, params));
    }
    Ok(CompiledModule { compiled, kernels, cached, native: None })
}

/// Compiles `source` untransformed beside its workers ([`compile`], same
/// name, options and architecture): the kernels' native builds, for
/// launches that need no preemption (`ClientDevice::set_hw_priority`).
pub fn add_native(
    compiled: &mut CompiledModule,
    name: &str,
    source: &str,
    options: &[String],
    arch: u32,
) -> Result<(), ModuleError> {
    let exprs: Vec<String> = compiled.kernels.iter().map(|(n, _, _)| format!("&{n}")).collect();
    let expr_refs: Vec<&str> = exprs.iter().map(String::as_str).collect();
    let (native, _) =
        nvrtc::compile_with(&format!("{name} (native)"), source, arch, options, &expr_refs).map_err(|e| match e {
            CudaError::Compile { log, msg, .. } => ModuleError::Compile { log: if log.is_empty() { msg } else { log } },
            other => ModuleError::Cuda(other),
        })?;
    let mut names = Vec::new();
    for ((k, _, _), expr) in compiled.kernels.iter().zip(&exprs) {
        let lowered = native.lowered.iter().find(|(e, _)| e == expr).map(|(_, l)| l.clone());
        names.push(lowered.ok_or_else(|| CudaError::Invalid(format!("NVRTC gave no exported name for native `{k}`")))?);
    }
    compiled.native = Some((native, names));
    Ok(())
}

/// The client's parameter sizes from a worker's parameter layout: the
/// layout holds the client's `user` parameters, then the worker's two.
pub fn user_param_sizes(layout: &[(usize, usize)], user: usize) -> Result<Vec<u32>, CudaError> {
    let tail: Vec<usize> = layout.iter().skip(user).map(|&(_, size)| size).collect();
    if layout.len() != user + WORKER_TAIL.len() || tail != WORKER_TAIL {
        return Err(CudaError::Check(format!(
            "worker parameters {layout:?} are not the kernel's {user} followed by the control record and launch description"
        )));
    }
    Ok(layout[..user].iter().map(|&(_, size)| size as u32).collect())
}

/// One loaded kernel of a client's module.
#[derive(Clone, Debug)]
pub struct ClientKernel {
    /// Its name in the source.
    pub name: String,
    /// The worker.
    pub worker: Function,
    /// The kernel as the client wrote it, if the module was compiled with
    /// it ([`add_native`]): launched when no preemption is needed.
    pub native: Option<Function>,
    /// The client's parameters' sizes, bytes, in order.
    pub param_sizes: Vec<u32>,
    /// Registers per thread of the worker.
    pub regs_per_thread: u32,
    /// Static shared memory per block of the worker, bytes.
    pub static_smem: u32,
    /// The most threads per block the worker can be launched with.
    pub max_threads_per_block: u32,
    /// The most dynamic shared memory per block it may be given.
    pub max_dynamic_smem: u32,
}

/// A loaded client module (unloaded when the last of its kernels is dropped
/// with it).
pub struct LoadedModule {
    /// The module; kept while its kernels may be launched.
    pub module: Arc<Module>,
    /// Its kernels.
    pub kernels: Vec<ClientKernel>,
    /// NVRTC's warnings.
    pub log: String,
    /// Compiled earlier (cache hit).
    pub cached: bool,
}

/// Loads `compiled` into the current context and reads each kernel's facts.
pub fn load(name: &str, compiled: &CompiledModule) -> Result<LoadedModule, CudaError> {
    let module = Arc::new(Module::load(name, &compiled.compiled.cubin)?);
    let native = match &compiled.native {
        Some((code, names)) => Some((Module::load(&format!("{name} (native)"), &code.cubin)?, names)),
        None => None,
    };
    let mut kernels = Vec::new();
    for (i, (k, exported, params)) in compiled.kernels.iter().enumerate() {
        let worker = module.function(exported)?;
        let native = match &native {
            Some((m, names)) => {
                let n = names.get(i).ok_or_else(|| CudaError::Invalid(format!("no native name for `{k}`")))?;
                Some(m.function(n)?)
            }
            None => None,
        };
        let param_sizes = user_param_sizes(&worker.param_layout(params + WORKER_TAIL.len())?, *params)?;
        let attr = |a| worker.attribute(a).map(|v| v.max(0) as u32);
        kernels.push(ClientKernel {
            name: k.clone(),
            param_sizes,
            regs_per_thread: attr(FA::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            static_smem: attr(FA::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            max_threads_per_block: attr(FA::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_dynamic_smem: attr(FA::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
            worker: worker.clone(),
            native,
        });
    }
    Ok(LoadedModule { module, kernels, log: compiled.compiled.log.clone(), cached: compiled.cached })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_that_change_the_target_are_refused() {
        for bad in ["-arch=sm_80", "--gpu-architecture=compute_90", "-rdc=true", "-dlto"] {
            let e = check_options(&[bad.to_string()]).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.starts_with(&format!("option `{bad}` is not accepted")), "{bad}: {e}");
        }
        let ok: Vec<String> = ["-DN=4", "--use_fast_math", "-std=c++20", "-G"].iter().map(|s| s.to_string()).collect();
        assert!(check_options(&ok).is_ok());
    }

    #[test]
    fn the_workers_trailing_parameters_are_not_the_clients() {
        let layout = [(0, 8), (8, 4), (16, 8), (24, 8), (32, 72)];
        assert_eq!(user_param_sizes(&layout, 3).ok(), Some(vec![8, 4, 8]));
        assert!(user_param_sizes(&layout, 2).is_err(), "the worker's tail must be (8, 72)");
        assert!(user_param_sizes(&layout[..4], 3).is_err());
        assert_eq!(user_param_sizes(&[(0, 8), (8, 72)], 0).ok(), Some(vec![]));
    }
}

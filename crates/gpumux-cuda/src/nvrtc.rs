//! Run-time compilation with NVRTC (loaded dynamically), cached in memory by
//! the SHA-256 of source, architecture and options: the same kernel text is
//! compiled once per process however many clients submit it.

use crate::error::{CudaError, Result};
use cudarc::nvrtc::sys as nv;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// Compiled machine code for one architecture.
#[derive(Debug)]
pub struct Compiled {
    /// CUBIN for `sm_{arch}`.
    pub cubin: Vec<u8>,
    /// Compiler messages (warnings) of a successful compile.
    pub log: String,
    /// (name expression, mangled name) for the name expressions asked for.
    pub lowered: Vec<(String, String)>,
    /// SHA-256 of source, architecture, options and name expressions: the cache key.
    pub key: [u8; 32],
}

/// True when libnvrtc can be loaded. Never panics (cudarc would).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library with libloading.
    unsafe { nv::is_culib_present() }
}

fn check(call: &'static str, r: nv::nvrtcResult, name: &str, log: &str) -> Result<()> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: NVRTC returns a static C string for every result code.
    let msg = unsafe { CStr::from_ptr(nv::nvrtcGetErrorString(r)) }.to_string_lossy().into_owned();
    Err(CudaError::Compile { name: name.to_string(), msg: format!("{call}: {msg}"), log: log.to_string() })
}

/// NVRTC's version, e.g. (13, 0).
pub fn version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let (mut a, mut b) = (0, 0);
    // SAFETY: out-pointers to locals.
    check("nvrtcVersion", unsafe { nv::nvrtcVersion(&mut a, &mut b) }, "", "")?;
    Ok((a, b))
}

fn cache() -> &'static Mutex<HashMap<[u8; 32], Arc<Compiled>>> {
    static C: OnceLock<Mutex<HashMap<[u8; 32], Arc<Compiled>>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Compiles without caching and returns ptxas's resource report (registers, spills).
pub fn compile_log(name: &str, src: &str, arch: u32) -> Result<String> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let opts = [format!("--gpu-architecture=sm_{arch}"), "-std=c++17".to_string(), "--ptxas-options=-v".to_string()];
    Ok(compile_uncached(name, src, &opts, &[], [0; 32])?.log)
}

/// Compiles `src` for compute capability `arch` (e.g. 90) to CUBIN, from cache when seen before.
pub fn compile(name: &str, src: &str, arch: u32, name_exprs: &[&str]) -> Result<Arc<Compiled>> {
    compile_with(name, src, arch, &[], name_exprs).map(|(c, _)| c)
}

/// [`compile`] with `extra` options after gpumux's own (the architecture,
/// `-lineinfo`, and `-std=c++17` unless `extra` names a standard); also
/// says whether the result came from the cache. The caller vets `extra`
/// (options that change the architecture or the output are its to refuse).
pub fn compile_with(
    name: &str,
    src: &str,
    arch: u32,
    extra: &[String],
    name_exprs: &[&str],
) -> Result<(Arc<Compiled>, bool)> {
    if !nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let mut opts = vec![format!("--gpu-architecture=sm_{arch}"), "-lineinfo".to_string()];
    if !extra.iter().any(|o| o.starts_with("-std") || o.starts_with("--std")) {
        opts.insert(1, "-std=c++17".to_string());
    }
    opts.extend(extra.iter().cloned());
    let mut h = Sha256::new();
    h.update(src.as_bytes());
    for o in opts.iter().map(String::as_str).chain(name_exprs.iter().copied()) {
        h.update([0u8]);
        h.update(o.as_bytes());
    }
    let key: [u8; 32] = h.finalize().into();
    let poisoned = |_| CudaError::Poisoned("the compile cache");
    if let Some(c) = cache().lock().map_err(poisoned)?.get(&key) {
        return Ok((c.clone(), true));
    }
    let compiled = Arc::new(compile_uncached(name, src, &opts, name_exprs, key)?);
    cache().lock().map_err(poisoned)?.insert(key, compiled.clone());
    Ok((compiled, false))
}

fn compile_uncached(name: &str, src: &str, opts: &[String], name_exprs: &[&str], key: [u8; 32]) -> Result<Compiled> {
    let nul = |what: &str| {
        let what = format!("{what} of `{name}`");
        move |source| CudaError::Nul { what, source }
    };
    let c_src = CString::new(src).map_err(nul("the source"))?;
    let c_name = CString::new(format!("{name}.cu")).map_err(nul("the name"))?;
    let c_opts: Vec<CString> =
        opts.iter().map(|o| CString::new(o.as_str())).collect::<Result<_, _>>().map_err(nul("an option"))?;
    let c_opt_ptrs: Vec<*const std::ffi::c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    let c_exprs: Vec<CString> =
        name_exprs.iter().map(|e| CString::new(*e)).collect::<Result<_, _>>().map_err(nul("a name expression"))?;

    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all pointers outlive the calls; the program is destroyed below on every path.
    unsafe {
        check(
            "nvrtcCreateProgram",
            nv::nvrtcCreateProgram(&mut prog, c_src.as_ptr(), c_name.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            name,
            "",
        )?;
        let result = (|| {
            for e in &c_exprs {
                check("nvrtcAddNameExpression", nv::nvrtcAddNameExpression(prog, e.as_ptr()), name, "")?;
            }
            let r = nv::nvrtcCompileProgram(prog, c_opt_ptrs.len() as i32, c_opt_ptrs.as_ptr());
            let mut log_len = 0usize;
            check("nvrtcGetProgramLogSize", nv::nvrtcGetProgramLogSize(prog, &mut log_len), name, "")?;
            let mut log = vec![0u8; log_len.max(1)];
            check("nvrtcGetProgramLog", nv::nvrtcGetProgramLog(prog, log.as_mut_ptr().cast()), name, "")?;
            let log = String::from_utf8_lossy(&log).trim_end_matches('\0').trim().to_string();
            check("nvrtcCompileProgram", r, name, &log)?;
            let mut size = 0usize;
            check("nvrtcGetCUBINSize", nv::nvrtcGetCUBINSize(prog, &mut size), name, &log)?;
            let mut cubin = vec![0u8; size];
            check("nvrtcGetCUBIN", nv::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()), name, &log)?;
            let mut lowered = Vec::new();
            for (e, ce) in name_exprs.iter().zip(&c_exprs) {
                let mut p: *const std::ffi::c_char = std::ptr::null();
                check("nvrtcGetLoweredName", nv::nvrtcGetLoweredName(prog, ce.as_ptr(), &mut p), name, &log)?;
                lowered.push((e.to_string(), CStr::from_ptr(p).to_string_lossy().into_owned()));
            }
            Ok(Compiled { cubin, log, lowered, key })
        })();
        nv::nvrtcDestroyProgram(&mut prog);
        result
    }
}

//! Suite references given meaning: which app, kernel and size a kernel's
//! `suite = { name, kernel, params }` asks the real GPU to run, and the rules
//! of multi-kernel instances (one per process and app).
//!
//! The workload parser reads a reference into its parts once
//! ([`SuiteKernelRef`]: app, kernel, params); it cannot judge them, since only
//! this crate knows the suite. [`SuiteTarget::of`] judges them, once per
//! kernel. The same functions serve the check before a run
//! ([`check_workload`]) and the device at a kernel's first launch, which
//! must refuse on its own what a caller did not check: one rule, one message.

use crate::suite::{self, App, Sequence, SequenceError};
use gpumux_engine::kernel::{KernelDesc, SuiteKernelRef};
use gpumux_engine::model::{Op, Workload};
use std::collections::HashMap;

/// Suite apps the device runs (every app of the suite).
pub const SUPPORTED: [App; 10] = App::ALL;

/// Largest sizes of the multi-kernel apps (buffers of a few GiB; 32-bit indices).
const MAX_STENCIL_SIDE: u64 = 1 << 15;
const MAX_REDUCTION_N: u64 = 1 << 31;
const MAX_KMEANS_N: u64 = 1 << 28;
const MAX_KMEANS_K: u64 = 4096;

/// An app with its size parameters: what one set of buffers is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AppConfig {
    /// The suite app.
    pub app: App,
    /// The app's main dimension (see [`SuiteTarget::resolve`]).
    pub size: u64,
    /// kmeans clusters ([`suite::KMEANS_K`] for the other apps).
    pub k: u32,
}

impl AppConfig {
    /// The params as messages show them (`n = 4096, k = 16`).
    fn params(&self) -> String {
        match self.app {
            App::Kmeans => format!("n = {}, k = {}", self.size, self.k),
            _ => format!("n = {}", self.size),
        }
    }
}

/// What a suite reference names: an app at a size, and one of its kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SuiteTarget {
    /// The app and its size.
    pub config: AppConfig,
    /// Which kernel: an index into [`App::kernel_names`].
    pub kernel: usize,
}

/// Why a suite reference names nothing the device can run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SuiteRefError {
    /// No suite app of that name.
    #[error("unknown suite kernel `{name}`; the CUDA device runs: {}", SUPPORTED.map(App::name).join(", "))]
    UnknownApp {
        /// The reference as written (`APP` or `APP.KERNEL`).
        name: String,
    },
    /// The app has no kernel of that name.
    #[error("suite app `{}` has no kernel `{kernel}`; its kernels: {}", .app.name(), .app.kernel_names().join(", "))]
    UnknownKernel {
        /// The app.
        app: App,
        /// The kernel named.
        kernel: String,
    },
    /// A multi-kernel app named without one of its kernels.
    #[error(
        "suite app `{app}` has {count} kernels ({names}): name one, e.g. \
         `suite = {{ name = \"{app}\", kernel = \"{first}\", params = {{ .. }} }}`; they run {order}",
        app = .0.name(), count = .0.kernel_names().len(), names = .0.kernel_names().join(", "),
        first = .0.kernel_names()[0], order = .0.kernel_order()
    )]
    KernelNotNamed(App),
    /// A size parameter that is not a positive whole number.
    #[error("suite kernel `{name}`: parameter {param} = {value} is not a positive whole number")]
    NotWholeNumber {
        /// The reference as written.
        name: String,
        /// The parameter.
        param: String,
        /// Its value.
        value: f64,
    },
    /// sgemm with `m` or `k` other than `n`.
    #[error("suite kernel sgemm is square: {param} = {value} differs from n = {n}")]
    NotSquare {
        /// `m` or `k`.
        param: &'static str,
        /// Its value.
        value: u64,
        /// `n`.
        n: u64,
    },
    /// histogram with other than 256 bins.
    #[error("suite kernel histogram has 256 bins, not {0}")]
    Bins(u64),
    /// No size parameter.
    #[error("suite kernel `{name}` needs a size parameter `n`")]
    NoSize {
        /// The reference as written.
        name: String,
    },
    /// A size beyond what the device takes for the app.
    #[error("suite kernel `{name}`: n = {size} is above the {max} the device takes for {}", .app.name())]
    TooLarge {
        /// The reference as written.
        name: String,
        /// The app.
        app: App,
        /// The size asked for.
        size: u64,
        /// The largest size the device takes.
        max: u64,
    },
    /// kmeans with more clusters than points (or than the device takes).
    #[error("suite kernel `{name}`: k = {k} clusters, but at most {max} (n = {size} points, at most {MAX_KMEANS_K})")]
    TooManyClusters {
        /// The reference as written.
        name: String,
        /// Clusters asked for.
        k: u64,
        /// Points.
        size: u64,
        /// Most clusters allowed.
        max: u64,
    },
}

/// Why a kernel cannot run on its process's instance of a multi-kernel app.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InstanceError {
    /// The kernel's params differ from those the instance was made with.
    #[error(
        "{app} `{kernel}` has {}, but this process's {app} instance was made with {}: the kernels of one \
         instance (one per process and app) must have the same params",
        .target.config.params(), .instance.params(),
        app = .target.config.app.name(),
        kernel = .target.config.app.kernel_names().get(.target.kernel).copied().unwrap_or("?")
    )]
    ParamsDiffer {
        /// What the instance was made for.
        instance: AppConfig,
        /// What the kernel names.
        target: SuiteTarget,
    },
    /// The kernel cannot run now, in the order the instance has run so far.
    #[error(transparent)]
    Order(#[from] SequenceError),
}

/// Why the real GPU refuses a kernel.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refusal {
    /// The kernel names no suite kernel.
    #[error(
        "names no CUDA kernel: the real GPU runs only kernels with `suite = {{ name, params }}` (one of {})",
        SUPPORTED.map(App::name).join(", ")
    )]
    NoSuiteKernel,
    /// Its suite reference names nothing the device runs.
    #[error(transparent)]
    Ref(#[from] SuiteRefError),
    /// Its process's instance of the app cannot run it.
    #[error(transparent)]
    Instance(#[from] InstanceError),
}

impl SuiteTarget {
    /// The suite kernel that `desc` names, or why it names none the device runs.
    pub fn of(desc: &KernelDesc) -> Result<SuiteTarget, Refusal> {
        let r = desc.suite.as_ref().ok_or(Refusal::NoSuiteKernel)?;
        Ok(SuiteTarget::resolve(r)?)
    }

    /// Which suite app, kernel and size a reference names.
    ///
    /// Apps with one kernel need no kernel part (stencil's is `step`);
    /// reduction (`partial`, `final`) and kmeans (`assign`, `update`) need it.
    ///
    /// Size parameters: `n` (or `size`) is the app's main dimension as in
    /// [`App::default_size`], except histogram, whose `n` counts input *bytes*
    /// (`words` counts 32-bit words). sgemm is square: `m`, `n`, `k` must agree.
    /// kmeans: `n` points and `k` clusters (default 16, at most `n`).
    pub fn resolve(r: &SuiteKernelRef) -> Result<SuiteTarget, SuiteRefError> {
        let name = || r.to_string();
        let app = App::from_name(&r.app).ok_or_else(|| SuiteRefError::UnknownApp { name: name() })?;
        let kernel = match &r.kernel {
            Some(k) => app.kernel_index(k).ok_or_else(|| SuiteRefError::UnknownKernel { app, kernel: k.clone() })?,
            None if app.kernel_names().len() == 1 => 0,
            None => return Err(SuiteRefError::KernelNotNamed(app)),
        };
        let get = |param: &str| -> Result<Option<u64>, SuiteRefError> {
            match r.params.get(param) {
                None => Ok(None),
                Some(&v) if v >= 1.0 && v.fract() == 0.0 && v < (1u64 << 40) as f64 => Ok(Some(v as u64)),
                Some(&value) => Err(SuiteRefError::NotWholeNumber { name: name(), param: param.into(), value }),
            }
        };
        let size = match app {
            App::Histogram => match (get("words")?, get("n")?) {
                (Some(w), _) => Some(w),
                (None, Some(bytes)) => Some(bytes.div_ceil(4)),
                (None, None) => None,
            },
            App::Sgemm => {
                let (m, n, k) = (get("m")?, get("n")?.or(get("size")?), get("k")?);
                for (param, v) in [("m", m), ("k", k)] {
                    if let (Some(value), Some(n)) = (v, n) {
                        if value != n {
                            return Err(SuiteRefError::NotSquare { param, value, n });
                        }
                    }
                }
                n.or(m).or(k)
            }
            _ => get("n")?.or(get("size")?),
        };
        if app == App::Histogram {
            if let Some(b) = get("bins")?.filter(|&b| b != 256) {
                return Err(SuiteRefError::Bins(b));
            }
        }
        let size = size.ok_or_else(|| SuiteRefError::NoSize { name: name() })?;
        let max = match app {
            App::Stencil => MAX_STENCIL_SIDE,
            App::Reduction => MAX_REDUCTION_N,
            App::Kmeans => MAX_KMEANS_N,
            _ => u64::MAX,
        };
        if size > max {
            return Err(SuiteRefError::TooLarge { name: name(), app, size, max });
        }
        let k = match app {
            App::Kmeans => match get("k")? {
                Some(k) if k > size.min(MAX_KMEANS_K) => {
                    return Err(SuiteRefError::TooManyClusters { name: name(), k, size, max: size.min(MAX_KMEANS_K) })
                }
                Some(k) => k as u32,
                None => (suite::KMEANS_K as u64).min(size) as u32,
            },
            _ => suite::KMEANS_K,
        };
        Ok(SuiteTarget { config: AppConfig { app, size, k }, kernel })
    }
}

/// Starts kernel `target` on the instance made for `instance` whose kernels
/// so far are `seq`: returns the template it runs, or why it cannot run.
pub(crate) fn begin_on_instance(
    instance: &AppConfig,
    seq: &mut Sequence,
    target: &SuiteTarget,
) -> Result<usize, InstanceError> {
    if *instance != target.config {
        return Err(InstanceError::ParamsDiffer { instance: *instance, target: *target });
    }
    Ok(seq.begin(target.kernel)?)
}

/// A kernel of a workload that the real GPU would refuse, and why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("process {process:?}, kernel `{kernel}`")]
pub struct WorkloadRefused {
    /// The process's name.
    pub process: String,
    /// The kernel's name.
    pub kernel: String,
    /// Why it is refused.
    #[source]
    pub why: Refusal,
}

/// Checks before a run what the device would refuse during it: every kernel
/// names a suite kernel with valid parameters, and each process's kernels of
/// a multi-kernel app agree on the parameters and come in an order the app
/// can run (the device applies the same rules again at each kernel's first launch).
pub fn check_workload(w: &Workload) -> Result<(), WorkloadRefused> {
    for p in &w.processes {
        let mut instances: HashMap<App, (AppConfig, Sequence)> = HashMap::new();
        for op in &p.ops {
            let Op::Kernel(desc) = op else { continue };
            let refused = |why: Refusal| WorkloadRefused { process: p.name.clone(), kernel: desc.name.clone(), why };
            let t = SuiteTarget::of(desc).map_err(refused)?;
            let app = t.config.app;
            if !app.is_multi_kernel() {
                continue;
            }
            let (instance, seq) = instances.entry(app).or_insert_with(|| (t.config, Sequence::new(app)));
            begin_on_instance(instance, seq, &t).map_err(|e| refused(e.into()))?;
            seq.complete().map_err(|e| refused(InstanceError::from(e).into()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Chain;
    use gpumux_engine::kernel::KernelShape;
    use gpumux_engine::model::ProcessSpec;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    /// A reference as a file writes it: `APP` or `APP.KERNEL`.
    fn r(name: &str, params: &[(&str, f64)]) -> SuiteKernelRef {
        let (app, kernel) = match name.split_once('.') {
            Some((a, k)) => (a.to_string(), Some(k.to_string())),
            None => (name.to_string(), None),
        };
        SuiteKernelRef {
            app,
            kernel,
            params: params.iter().map(|(k, v)| (k.to_string(), *v)).collect::<BTreeMap<_, _>>(),
        }
    }

    fn app_size(r: &SuiteKernelRef) -> Option<(App, u64)> {
        SuiteTarget::resolve(r).ok().map(|t| (t.config.app, t.config.size))
    }

    fn err(r: &SuiteKernelRef) -> String {
        SuiteTarget::resolve(r).err().map(|e| e.to_string()).unwrap_or_default()
    }

    #[test]
    fn suite_names_resolve_to_apps_and_sizes() {
        assert_eq!(app_size(&r("triad", &[("n", 1024.0)])), Some((App::Triad, 1024)));
        assert_eq!(app_size(&r("sgemm", &[("m", 4096.0), ("n", 4096.0), ("k", 4096.0)])), Some((App::Sgemm, 4096)));
        assert_eq!(app_size(&r("histogram", &[("n", 1024.0), ("bins", 256.0)])), Some((App::Histogram, 256)));
        let e = err(&r("kmeans", &[("n", 10.0)]));
        assert!(e.contains("has 2 kernels (assign, update): name one"), "{e}");
        assert_eq!(
            SuiteTarget::resolve(&r("sgemm", &[("m", 64.0), ("n", 128.0)])),
            Err(SuiteRefError::NotSquare { param: "m", value: 64, n: 128 })
        );
        assert!(err(&r("triad", &[])).contains("needs a size parameter `n`"));
        assert!(err(&r("triad", &[("n", 1.5)])).contains("parameter n = 1.5 is not a positive whole number"));
        assert_eq!(SuiteTarget::resolve(&r("histogram", &[("n", 64.0), ("bins", 64.0)])), Err(SuiteRefError::Bins(64)));
        assert!(
            err(&r("nope.x", &[("n", 1.0)])).starts_with("unknown suite kernel `nope.x`; the CUDA device runs: triad,")
        );
    }

    #[test]
    fn multi_kernel_apps_resolve_with_their_kernels() {
        let t = SuiteTarget::resolve(&r("kmeans.update", &[("n", 4096.0), ("k", 8.0)])).ok();
        let config = AppConfig { app: App::Kmeans, size: 4096, k: 8 };
        assert_eq!(t, Some(SuiteTarget { config, kernel: 1 }));
        // kmeans: 16 clusters by default, at most n.
        let k = |r: &SuiteKernelRef| SuiteTarget::resolve(r).ok().map(|t| t.config.k);
        assert_eq!(k(&r("kmeans.assign", &[("n", 4096.0)])), Some(16));
        assert_eq!(k(&r("kmeans.assign", &[("n", 5.0)])), Some(5));
        assert!(err(&r("kmeans.assign", &[("n", 5.0), ("k", 6.0)])).contains("k = 6 clusters, but at most 5"));
        assert!(err(&r("kmeans.assign", &[("n", 1e6), ("k", 5000.0)])).contains("at most 4096"));
        let kernel = |r: &SuiteKernelRef| SuiteTarget::resolve(r).ok().map(|t| t.kernel);
        assert_eq!(kernel(&r("reduction.final", &[("n", 1e6)])), Some(1));
        // Stencil has one kernel: `step` may be left out.
        assert_eq!(kernel(&r("stencil", &[("n", 512.0)])), Some(0));
        assert_eq!(kernel(&r("stencil.step", &[("n", 512.0)])), Some(0));
        assert!(err(&r("stencil", &[("n", 1e6)])).contains("above the 32768"));
        let e = err(&r("kmeans.assing", &[("n", 10.0)]));
        assert_eq!(e, "suite app `kmeans` has no kernel `assing`; its kernels: assign, update");
        let e = err(&r("reduction", &[("n", 10.0)]));
        assert!(e.contains("kernel = \"partial\""), "{e}");
        assert!(err(&r("kmeans.update", &[])).contains("needs a size parameter"));
        // Single-kernel apps may name their one kernel.
        assert_eq!(app_size(&r("triad.triad", &[("n", 8.0)])), Some((App::Triad, 8)));
        assert!(err(&r("triad.step", &[("n", 8.0)])).contains("no kernel `step`"));
    }

    fn kdesc(name: &str, suite: &str, params: &[(&str, f64)]) -> Arc<KernelDesc> {
        Arc::new(KernelDesc::new(name, KernelShape::new(16, 256, 32)).with_suite(r(suite, params)))
    }

    fn workload(procs: Vec<Vec<Arc<KernelDesc>>>) -> Workload {
        Workload {
            name: "w".into(),
            processes: procs
                .into_iter()
                .enumerate()
                .map(|(i, ks)| ProcessSpec {
                    name: format!("p{i}"),
                    priority: 0,
                    weight: 1.0,
                    arrival_ns: 0,
                    repetitions: 2,
                    async_depth: 0,
                    ops: ks.into_iter().map(Op::Kernel).collect(),
                })
                .collect(),
            replay_min_runs: None,
        }
    }

    #[test]
    fn workloads_are_checked_before_a_run() {
        let n = [("n", 4096.0)];
        let assign = kdesc("as", "kmeans.assign", &n);
        let update = kdesc("up", "kmeans.update", &n);
        let ok = workload(vec![
            vec![assign.clone(), update.clone(), kdesc("t", "triad", &n)],
            vec![kdesc("s", "stencil", &[("n", 64.0)]), kdesc("s", "stencil.step", &[("n", 64.0)])],
            vec![kdesc("p", "reduction.partial", &n), kdesc("f", "reduction.final", &n)],
        ]);
        assert_eq!(check_workload(&ok), Ok(()));
        // Two processes each get their own instance: different sizes are fine.
        let two = workload(vec![vec![assign.clone()], vec![kdesc("as", "kmeans.assign", &[("n", 100.0)])]]);
        assert_eq!(check_workload(&two), Ok(()));
        let e = |w: &Workload| check_workload(w).err().map(|e| Chain(&e).to_string()).unwrap_or_default();
        let m = e(&workload(vec![vec![update.clone(), assign.clone()]]));
        assert!(m.contains("process \"p0\", kernel `up`: kmeans `update` cannot run before any `assign`"), "{m}");
        let m = e(&workload(vec![vec![assign.clone(), kdesc("up", "kmeans.update", &[("n", 2048.0)])]]));
        assert!(m.contains("kmeans `update` has n = 2048, k = 16, but this process's kmeans instance was made with n = 4096, k = 16"), "{m}");
        let m = e(&workload(vec![vec![kdesc("x", "kmeans.move", &n)]]));
        assert!(m.contains("has no kernel `move`"), "{m}");
        let mut plain = (*assign).clone();
        plain.suite = None;
        let refused = check_workload(&workload(vec![vec![Arc::new(plain)]]));
        assert_eq!(
            refused,
            Err(WorkloadRefused { process: "p0".into(), kernel: "as".into(), why: Refusal::NoSuiteKernel })
        );
    }

    #[test]
    fn instances_differ_in_params_only_by_error() {
        let instance = AppConfig { app: App::Stencil, size: 64, k: 16 };
        let mut seq = Sequence::new(App::Stencil);
        let same = SuiteTarget { config: instance, kernel: 0 };
        assert_eq!(begin_on_instance(&instance, &mut seq, &same), Ok(0));
        let bigger = SuiteTarget { config: AppConfig { size: 128, ..instance }, kernel: 0 };
        let e = begin_on_instance(&instance, &mut seq, &bigger).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            e.contains("stencil `step` has n = 128, but this process's stencil instance was made with n = 64"),
            "{e}"
        );
    }
}

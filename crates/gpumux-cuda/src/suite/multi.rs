//! Multi-kernel apps as the engine runs them: one *instance* (buffers and
//! state) per process, whose kernels the process launches one engine kernel
//! at a time, in an order the app can run.
//!
//! An instance's [`Workload`] (built with one repetition) holds one launch per
//! *template*: the kernels with their arguments. Templates are what a kernel
//! invocation runs:
//!
//! | app | workload kernels | templates |
//! |---|---|---|
//! | stencil | `step` | 0: `b ← step(a)`, 1: `a ← step(b)` (ping-pong by step parity) |
//! | reduction | `partial`, `final` | 0: `partial`, 1: `final` |
//! | kmeans | `assign`, `update` | 0: `assign`, 1: `update` |
//!
//! [`Sequence`] keeps the templates an instance completed, in order; the
//! device replays exactly that sequence natively to check the outputs.

use super::{App, HostData, OutputSpec, Tolerance, Workload};

impl App {
    /// The app's kernels as a workload file names them
    /// (`suite = { name = "kmeans", kernel = "assign" }`), in the app's order.
    pub fn kernel_names(self) -> &'static [&'static str] {
        match self {
            App::Stencil => &["step"],
            App::Reduction => &["partial", "final"],
            App::Kmeans => &["assign", "update"],
            App::Triad => &["triad"],
            App::Transpose => &["transpose"],
            App::Spmv => &["spmv"],
            App::Sgemm => &["sgemm"],
            App::Nbody => &["nbody"],
            App::Histogram => &["histogram"],
            App::Bfs => &["bfs"],
        }
    }

    /// Apps whose kernels share state from one invocation to the next (each
    /// process gets an instance of its own).
    pub fn is_multi_kernel(self) -> bool {
        matches!(self, App::Stencil | App::Reduction | App::Kmeans)
    }

    /// Index of kernel `name` in [`App::kernel_names`].
    pub fn kernel_index(self, name: &str) -> Option<usize> {
        self.kernel_names().iter().position(|k| *k == name)
    }

    /// What the app's kernels must be run as (for messages).
    pub fn kernel_order(self) -> &'static str {
        match self {
            App::Stencil => "step, step, ... (ping-pong between two buffers)",
            App::Reduction => "partial, then final (again as often as wanted)",
            App::Kmeans => "assign, update, assign, update, ...",
            _ => "one kernel, any number of times",
        }
    }
}

/// The kernels an instance of a multi-kernel app has run and is running.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequence {
    app: App,
    /// Templates of the completed kernels, in order.
    done: Vec<u8>,
    /// Completed kernels per template.
    counts: [u64; 2],
    /// (kernel, template) of the invocation in progress.
    running: Option<(usize, u8)>,
}

impl Sequence {
    /// A fresh instance of `app` that has run nothing.
    pub fn new(app: App) -> Sequence {
        Sequence { app, done: Vec::new(), counts: [0; 2], running: None }
    }

    /// The app it is an instance of.
    pub fn app(&self) -> App {
        self.app
    }

    /// Templates of the completed kernels, in order.
    pub fn done(&self) -> &[u8] {
        &self.done
    }

    /// The kernel (index into [`App::kernel_names`]) in progress.
    pub fn running(&self) -> Option<usize> {
        self.running.map(|(k, _)| k)
    }

    /// Forgets everything (a new run on freshly reset buffers).
    pub fn reset(&mut self) {
        *self = Sequence::new(self.app);
    }

    /// Starts kernel `kernel`; returns the template it runs, or why the
    /// instance cannot run it now.
    pub fn begin(&mut self, kernel: usize) -> Result<usize, SequenceError> {
        let app = self.app;
        if kernel >= app.kernel_names().len() {
            return Err(SequenceError::NoSuchKernel { app, kernel });
        }
        if let Some((running, _)) = self.running {
            return Err(SequenceError::StillRunning { app, kernel, running, position: self.done.len() + 1 });
        }
        let template = match app {
            App::Stencil => self.done.len() % 2,
            App::Reduction | App::Kmeans => {
                if kernel == 1 && self.counts[0] == 0 {
                    return Err(SequenceError::BeforeFirst { app, kernel });
                }
                kernel
            }
            _ => return Err(SequenceError::SingleKernelApp(app)),
        };
        self.running = Some((kernel, template as u8));
        Ok(template)
    }

    /// The kernel in progress has run all its blocks; returns its template.
    pub fn complete(&mut self) -> Result<usize, SequenceError> {
        let (_, t) = self.running.take().ok_or(SequenceError::NoneRunning(self.app))?;
        self.done.push(t);
        self.counts[t as usize & 1] += 1;
        Ok(t as usize)
    }

    /// "assign ×3, update ×2" (or "2 steps").
    pub fn describe(&self) -> String {
        match self.app {
            App::Stencil => format!("{} steps", self.done.len()),
            _ => self
                .app
                .kernel_names()
                .iter()
                .zip(self.counts)
                .map(|(n, c)| format!("{n} ×{c}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// Why an instance cannot start or complete a kernel.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SequenceError {
    /// A kernel index beyond the app's kernels.
    #[error("{} has no kernel #{kernel} (its kernels: {})", .app.name(), .app.kernel_names().join(", "))]
    NoSuchKernel {
        /// The app.
        app: App,
        /// The index asked for.
        kernel: usize,
    },
    /// A kernel started before the previous one of the instance finished.
    #[error(
        "{} `{}` started while `{}` (kernel {position} of this instance) has not finished: \
         the kernels of one instance run one after the other",
        .app.name(), kernel_name(*.app, *.kernel), kernel_name(*.app, *.running)
    )]
    StillRunning {
        /// The app.
        app: App,
        /// The kernel that would start.
        kernel: usize,
        /// The kernel still running.
        running: usize,
        /// Its position in the instance's sequence (1 for the first).
        position: usize,
    },
    /// A kernel that reads what the app's first kernel writes, before any first kernel ran.
    #[error(
        "{} `{}` cannot run before any `{first}`: it reads what `{first}` writes (the order is {})",
        .app.name(), kernel_name(*.app, *.kernel), .app.kernel_order(), first = kernel_name(*.app, 0)
    )]
    BeforeFirst {
        /// The app.
        app: App,
        /// The kernel that would start.
        kernel: usize,
    },
    /// A single-kernel app has no instances.
    #[error("{} is a single-kernel app, not an instance", .0.name())]
    SingleKernelApp(App),
    /// A completion with no kernel in progress.
    #[error("{}: a kernel completed, but none was running", .0.name())]
    NoneRunning(App),
}

/// Name of kernel `k` of `app` ("?" beyond its kernels).
fn kernel_name(app: App, k: usize) -> &'static str {
    app.kernel_names().get(k).copied().unwrap_or("?")
}

/// The buffers a sequence of templates has written and how each compares
/// with the CPU reference (with a native run: always bitwise).
///
/// * stencil: the buffer the last step wrote: `a` after an even number of
///   steps, `b` after an odd one;
/// * reduction: `partial` once a `partial` ran, `out` once a `final` ran;
/// * kmeans: the centroids and the labels (labels may differ from the f64
///   CPU reference on near ties: at most 0.1 % of them).
pub fn sequence_outputs(app: App, done: &[u8]) -> Vec<OutputSpec> {
    let o = |buffer, tolerance| OutputSpec { buffer, tolerance };
    match app {
        App::Stencil => vec![o(done.len() % 2, Tolerance::RelL2(1e-5))],
        App::Reduction => {
            let mut v = Vec::new();
            if done.contains(&1) {
                v.push(o(0, Tolerance::RelL2(1e-5)));
            }
            if done.contains(&0) {
                v.push(o(1, Tolerance::RelL2(1e-5)));
            }
            v
        }
        App::Kmeans => {
            let mut v = vec![o(0, Tolerance::RelL2(1e-4))];
            if done.contains(&0) {
                v.push(o(1, Tolerance::Mismatches(1e-3)));
            }
            v
        }
        _ => Vec::new(),
    }
}

/// The instance workload `inst` with its launches replaced by the sequence
/// `done` of templates and its outputs by [`sequence_outputs`]: what the CPU
/// reference computes.
pub fn sequence_workload(inst: &Workload, done: &[u8]) -> Workload {
    let mut w = inst.clone();
    w.launches = done.iter().filter_map(|&t| inst.launches.get(t as usize).cloned()).collect();
    w.outputs = sequence_outputs(inst.app, done);
    w
}

/// Rough CPU work (element operations) of the reference for a sequence.
pub fn cpu_cost(app: App, size: u64, k: u32, done: &[u8]) -> u64 {
    let runs = done.len() as u64;
    let per = match app {
        App::Stencil => size.saturating_mul(size),
        App::Reduction => size,
        App::Kmeans => size.saturating_mul(k.max(1) as u64),
        _ => size,
    };
    per.saturating_mul(runs.max(1))
}

/// Outputs of a sequence, read as their element types, from raw bytes.
pub fn outputs_from_bytes(w: &Workload, outputs: &[OutputSpec], bytes: &[Vec<u8>]) -> Vec<HostData> {
    outputs.iter().zip(bytes).map(|(o, b)| w.element_like(o.buffer).like_from_bytes(b)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{build_with, compare, KMEANS_K};

    #[test]
    fn kernel_names_and_indices() {
        assert_eq!(App::Kmeans.kernel_index("update"), Some(1));
        assert_eq!(App::Reduction.kernel_index("partial"), Some(0));
        assert_eq!(App::Stencil.kernel_index("step"), Some(0));
        assert_eq!(App::Kmeans.kernel_index("step"), None);
        for app in App::ALL {
            assert!(!app.kernel_names().is_empty());
            assert_eq!(app.is_multi_kernel(), matches!(app, App::Stencil | App::Reduction | App::Kmeans));
        }
    }

    #[test]
    fn instance_templates_are_the_apps_kernels_in_order() {
        let w = build_with(App::Kmeans, 1000, 1, 1, 8);
        let names: Vec<&str> = w.launches.iter().map(|l| l.kernel).collect();
        assert_eq!(names, ["kmeans_assign", "kmeans_update"]);
        assert_eq!(w.launches[1].grid, [8, 1, 1], "one update block per cluster");
        let w = build_with(App::Reduction, 100_000, 1, 1, KMEANS_K);
        let names: Vec<&str> = w.launches.iter().map(|l| l.kernel).collect();
        assert_eq!(names, ["reduce_partial", "reduce_final"]);
        // Stencil: template 0 writes b from a, template 1 writes a from b.
        let w = build_with(App::Stencil, 64, 1, 1, KMEANS_K);
        assert_eq!(w.launches.len(), 2);
        assert_eq!(&w.launches[0].args[..2], &[crate::suite::Arg::Buf(1), crate::suite::Arg::Buf(0)]);
        assert_eq!(&w.launches[1].args[..2], &[crate::suite::Arg::Buf(0), crate::suite::Arg::Buf(1)]);
        // k is clamped into 1..=n.
        let w = build_with(App::Kmeans, 4, 1, 1, 16);
        assert_eq!(w.launches[1].grid, [4, 1, 1]);
    }

    #[test]
    fn stencil_steps_ping_pong() {
        let mut s = Sequence::new(App::Stencil);
        let mut templates = Vec::new();
        for _ in 0..5 {
            templates.push(s.begin(0).expect("step"));
            assert_eq!(s.running(), Some(0));
            assert_eq!(s.complete().ok(), templates.last().copied());
        }
        assert_eq!(templates, [0, 1, 0, 1, 0]);
        assert_eq!(s.done(), &[0, 1, 0, 1, 0]);
        // Odd number of steps: the result is in b (buffer 1); even: in a.
        assert_eq!(sequence_outputs(App::Stencil, s.done())[0].buffer, 1);
        assert_eq!(sequence_outputs(App::Stencil, &s.done()[..4])[0].buffer, 0);
        assert_eq!(s.describe(), "5 steps");
        s.reset();
        assert_eq!(s.begin(0), Ok(0), "a reset instance starts from a again");
    }

    #[test]
    fn order_errors() {
        let mut s = Sequence::new(App::Kmeans);
        let e = s.begin(1).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            e,
            "kmeans `update` cannot run before any `assign`: it reads what `assign` writes \
             (the order is assign, update, assign, update, ...)"
        );
        assert_eq!(s.running(), None, "a refused kernel does not start");
        assert_eq!(s.begin(0), Ok(0));
        let e = s.begin(1).err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            e,
            "kmeans `update` started while `assign` (kernel 1 of this instance) has not finished: \
             the kernels of one instance run one after the other"
        );
        assert_eq!(s.complete(), Ok(0));
        assert_eq!(s.begin(1), Ok(1));
        assert_eq!(s.complete(), Ok(1));
        // After the first assign, any order the app can run: assign twice, update twice.
        for k in [0, 0, 1, 1] {
            assert_eq!(s.begin(k), Ok(k));
            assert_eq!(s.complete(), Ok(k));
        }
        assert_eq!(s.describe(), "assign ×3, update ×3");
        assert_eq!(s.complete(), Err(SequenceError::NoneRunning(App::Kmeans)), "nothing running");
        assert_eq!(s.begin(2), Err(SequenceError::NoSuchKernel { app: App::Kmeans, kernel: 2 }), "no third kernel");

        let mut r = Sequence::new(App::Reduction);
        let e = r.begin(1).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("`final` cannot run before any `partial`"), "{e}");
        assert_eq!(Sequence::new(App::Triad).begin(0), Err(SequenceError::SingleKernelApp(App::Triad)));
    }

    #[test]
    fn reduction_outputs_follow_what_ran() {
        let b = |v: &[OutputSpec]| v.iter().map(|o| o.buffer).collect::<Vec<_>>();
        assert_eq!(b(&sequence_outputs(App::Reduction, &[0])), [1]);
        assert_eq!(b(&sequence_outputs(App::Reduction, &[0, 1])), [0, 1]);
        assert_eq!(b(&sequence_outputs(App::Kmeans, &[0, 1, 0])), [0, 1]);
    }

    #[test]
    fn sequence_references_match_the_repeated_workloads() {
        // A sequence of alternating templates is what build_sized repeats.
        for (app, size, reps, seq) in [
            (App::Kmeans, 4096u64, 3, vec![0u8, 1, 0, 1, 0, 1]),
            (App::Stencil, 64, 4, vec![0, 1, 0, 1]),
            (App::Reduction, 50_000, 2, vec![0, 1, 0, 1]),
        ] {
            let inst = build_with(app, size, 1, 5, KMEANS_K);
            let w = sequence_workload(&inst, &seq);
            assert_eq!(w.launches.len(), seq.len());
            let full = crate::suite::build_sized(app, size, reps, 5);
            assert_eq!(full.launches, w.launches, "{app:?}");
            let a = w.reference();
            let b = full.reference();
            // build_sized's outputs are a subset (by buffer) of the sequence's.
            for (o, want) in full.outputs.iter().zip(&b) {
                let i = w.outputs.iter().position(|x| x.buffer == o.buffer).expect("output");
                assert!(compare(&a[i], want, Tolerance::Exact).is_ok(), "{app:?} buffer {}", o.buffer);
            }
        }
    }

    #[test]
    fn odd_stencil_sequence_reference_is_one_more_step() {
        let inst = build_with(App::Stencil, 32, 1, 9, KMEANS_K);
        let two = sequence_workload(&inst, &[0, 1]).reference();
        let three = sequence_workload(&inst, &[0, 1, 0]).reference();
        let (HostData::F32(a), HostData::F32(b)) = (&two[0], &three[0]) else { panic!("stencil outputs are floats") };
        // Interior cell: b = 0.2 × (5-point sum of a).
        let n = 32;
        let (y, x) = (10, 7);
        let want = 0.2 * (a[y * n + x] + a[y * n + x - 1] + a[y * n + x + 1] + a[(y - 1) * n + x] + a[(y + 1) * n + x]);
        assert_eq!(b[y * n + x].to_bits(), want.to_bits());
    }

    #[test]
    fn kmeans_reference_labels_and_centroids() {
        let inst = build_with(App::Kmeans, 2048, 1, 3, 4);
        let r = sequence_workload(&inst, &[0, 1, 0]).reference();
        assert_eq!(r.len(), 2);
        let HostData::U32(labels) = &r[1] else { panic!("labels are u32") };
        assert_eq!(labels.len(), 2048);
        assert!(labels.iter().all(|&l| l < 4));
        let HostData::F32(cent) = &r[0] else { panic!("centroids are f32") };
        assert_eq!(cent.len(), 16);
        assert!(cent.iter().all(|c| c.is_finite()));
        assert_eq!(inst.element_like(1), HostData::U32(Vec::new()));
        assert_eq!(inst.element_like(0), HostData::F32(Vec::new()));
    }

    #[test]
    fn mismatch_tolerance_counts_elements() {
        let want = HostData::U32((0..1000).collect());
        let mut g: Vec<u32> = (0..1000).collect();
        g[5] = 7;
        assert!(compare(&HostData::U32(g.clone()), &want, Tolerance::Mismatches(1e-3)).is_ok());
        g[6] = 7;
        let e = compare(&HostData::U32(g), &want, Tolerance::Mismatches(1e-3)).err().unwrap_or_default();
        assert!(e.contains("2 of 1000 elements differ"), "{e}");
        assert!(compare(&HostData::U32(vec![1]), &HostData::F32(vec![1.0]), Tolerance::Mismatches(1.0)).is_err());
    }

    #[test]
    fn cpu_cost_grows_with_the_sequence() {
        assert_eq!(cpu_cost(App::Stencil, 100, 16, &[0, 1, 0]), 30_000);
        assert_eq!(cpu_cost(App::Kmeans, 1000, 16, &[0, 1]), 32_000);
        assert_eq!(cpu_cost(App::Stencil, u64::MAX, 16, &[0]), u64::MAX);
    }
}

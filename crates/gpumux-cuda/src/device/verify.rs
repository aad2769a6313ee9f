//! Checking what a run computed, when it ends ([`CudaDevice::finish`]).
//!
//! * Single kernels: the outputs against one native (untransformed) launch
//!   on the same inputs (bitwise; for histogram, native × number of completed
//!   invocations), and that native launch against the CPU reference where it
//!   is cheap (not sgemm above 1024, nbody above 16384).
//! * Instances: the final outputs against a native run of the *same template
//!   sequence* the engine completed, on a fresh twin of the instance's
//!   buffers (bitwise: the suite has no float atomics), and that native run
//!   against the CPU reference when its cost (elements × kernels) is at most
//!   2^28.
//!
//! [`CudaDevice::finish`]: super::CudaDevice::finish

use super::state::{CpuCheck, GpuState, Role, SuiteKernel};
use super::suite_ref::AppConfig;
use crate::error::{Chain, CudaError};
use crate::exec::Prepared;
use crate::runtime::{Gpu, Stream};
use crate::suite::{self, compare, App, HostData, Sequence, Tolerance};

/// Most element operations of a multi-kernel app's CPU reference.
const CPU_BUDGET: u64 = 1 << 28;

/// The outcome of a device's run: one check per suite kernel or instance the GPU holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verification {
    /// In the order the kernels were first prepared on the GPU.
    pub kernels: Vec<KernelCheck>,
}

impl Verification {
    /// No kernel's outputs differ from what they must be.
    pub fn passed(&self) -> bool {
        !self.kernels.iter().any(|k| matches!(k.verdict, Verdict::Mismatch(_)))
    }

    /// The checks of kernels that ran in this device run.
    pub fn ran(&self) -> impl Iterator<Item = &KernelCheck> {
        self.kernels.iter().filter(|k| k.verdict != Verdict::NotRun)
    }
}

/// One suite kernel's (or instance's) check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCheck {
    /// The kernel (`triad(4194304)`, `kmeans(65536, k=16) of process 3`).
    pub label: String,
    /// What the check found.
    pub verdict: Verdict,
}

/// What checking one kernel's outputs found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The kernel ran no invocation to its end in this device run.
    NotRun,
    /// The outputs are right: after what, compared with what.
    Ok(String),
    /// The outputs differ: after what, and where.
    Mismatch(String),
    /// The outputs could not be judged, and why.
    NotChecked(String),
}

impl std::fmt::Display for KernelCheck {
    /// One line, as `gpumux run` prints it after `gpumux-cuda verify cuda:N seed S: `.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let label = &self.label;
        match &self.verdict {
            Verdict::NotRun => write!(f, "{label}: not run"),
            Verdict::Ok(how) => write!(f, "{label}: OK {how}"),
            Verdict::Mismatch(how) => write!(f, "{label}: MISMATCH {how}"),
            Verdict::NotChecked(why) => write!(f, "{label}: NOT CHECKED: {why}"),
        }
    }
}

impl GpuState {
    /// Checks every kernel's outputs (the GPU's context must be current and
    /// its streams idle). `Err` when a single kernel's outputs cannot be read
    /// back; an instance whose native twin cannot run is `NotChecked`.
    pub(crate) fn verify(&self) -> Result<Verification, CudaError> {
        let mut kernels = Vec::with_capacity(self.kernels.len());
        for k in &self.kernels {
            let verdict = match &k.role {
                Role::Single { native, cpu_check, completed } => verify_single(k, native, *cpu_check, *completed)?,
                Role::Instance { seq } => verify_instance(&self.gpu, k, seq)
                    .unwrap_or_else(|e| Verdict::NotChecked(format!("could not run its native twin: {}", Chain(&e)))),
            };
            kernels.push(KernelCheck { label: k.label.clone(), verdict });
        }
        Ok(Verification { kernels })
    }
}

/// A single-kernel app's outputs against its native launch (× completed
/// invocations for histogram).
fn verify_single(k: &SuiteKernel, native: &[HostData], cpu: CpuCheck, completed: u64) -> Result<Verdict, CudaError> {
    if completed == 0 {
        return Ok(Verdict::NotRun);
    }
    let got = k.prepared.outputs()?;
    let mut verdict = Ok(());
    for ((g, n), o) in got.iter().zip(native).zip(&k.prepared.workload.outputs) {
        let want = match (k.config.app, n) {
            (App::Histogram, HostData::U32(v)) => {
                HostData::U32(v.iter().map(|x| x.wrapping_mul(completed as u32)).collect())
            }
            _ => n.clone(),
        };
        let tol = if k.prepared.workload.nondeterministic.is_some() { o.tolerance } else { Tolerance::Exact };
        if let Err(e) = compare(g, &want, tol) {
            verdict = Err(e);
            break;
        }
    }
    Ok(match verdict {
        Ok(()) => Verdict::Ok(format!(
            "after {completed} invocations: outputs equal native ({}); {cpu}",
            if k.config.app == App::Histogram { "x invocations" } else { "bitwise" },
        )),
        Err(e) => Verdict::Mismatch(format!("after {completed} invocations: {e}")),
    })
}

/// An instance's final outputs against a native run of the kernel sequence
/// it completed, on fresh buffers (bitwise), and that against the CPU
/// reference where cheap. The instance's own buffers are only read.
fn verify_instance(gpu: &Gpu, k: &SuiteKernel, seq: &Sequence) -> Result<Verdict, CudaError> {
    let app = k.config.app;
    if let Some(r) = seq.running() {
        return Ok(Verdict::NotChecked(format!(
            "kernel `{}` ran only in part (after {})",
            app.kernel_names().get(r).copied().unwrap_or("?"),
            seq.describe()
        )));
    }
    let done = seq.done();
    if done.is_empty() {
        return Ok(Verdict::NotRun);
    }
    let w = &k.prepared.workload;
    let outputs = suite::sequence_outputs(app, done);
    let read = |p: &Prepared| -> Result<Vec<Vec<u8>>, CudaError> {
        outputs
            .iter()
            .map(|o| {
                p.buffers
                    .get(o.buffer)
                    .ok_or_else(|| CudaError::Invalid(format!("{}: no buffer {}", k.label, o.buffer)))?
                    .download()
            })
            .collect()
    };
    let got = suite::outputs_from_bytes(w, &outputs, &read(&k.prepared)?);
    // The same sequence natively on a twin of the instance (fresh inputs, poisoned outputs).
    let mut twin = Prepared::new(gpu, w.clone())?;
    twin.reset()?;
    let stream = Stream::low(gpu)?;
    for chunk in done.chunks(1024) {
        twin.workload.launches = chunk.iter().filter_map(|&t| w.launches.get(t as usize).cloned()).collect();
        twin.enqueue_native(&stream)?;
    }
    stream.sync()?;
    let native = suite::outputs_from_bytes(w, &outputs, &read(&twin)?);
    drop(twin);
    let name = |o: &suite::OutputSpec| w.buffers.get(o.buffer).map(|b| b.name).unwrap_or("?");
    let mut verdict: Result<(), String> = got
        .iter()
        .zip(&native)
        .zip(&outputs)
        .try_for_each(|((g, n), o)| compare(g, n, Tolerance::Exact).map_err(|e| format!("{}: {e}", name(o))));
    let AppConfig { size, k: clusters, .. } = k.config;
    let cpu = if suite::cpu_cost(app, size, clusters, done) <= CPU_BUDGET {
        let want = suite::sequence_workload(w, done).reference();
        if verdict.is_ok() {
            verdict = native.iter().zip(&want).zip(&outputs).try_for_each(|((n, r), o)| {
                compare(n, r, o.tolerance)
                    .map_err(|e| format!("the native run differs from the CPU reference: {}: {e}", name(o)))
            });
        }
        CpuCheck::Matched
    } else {
        CpuCheck::Skipped
    };
    let outs: Vec<&str> = outputs.iter().map(name).collect();
    Ok(match verdict {
        Ok(()) => Verdict::Ok(format!(
            "after {} kernels ({}): outputs ({}) equal a native run of the same sequence (bitwise); {cpu}",
            done.len(),
            seq.describe(),
            outs.join(", ")
        )),
        Err(e) => Verdict::Mismatch(format!("after {} kernels ({}): {e}", done.len(), seq.describe())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_reads_as_one_line() {
        let line = |verdict| KernelCheck { label: "triad(1024)".into(), verdict }.to_string();
        assert_eq!(line(Verdict::NotRun), "triad(1024): not run");
        assert_eq!(line(Verdict::Ok("after 2 invocations".into())), "triad(1024): OK after 2 invocations");
        assert_eq!(
            line(Verdict::Mismatch("after 2 invocations: x".into())),
            "triad(1024): MISMATCH after 2 invocations: x"
        );
        assert_eq!(line(Verdict::NotChecked("why".into())), "triad(1024): NOT CHECKED: why");
        let v = Verification {
            kernels: vec![
                KernelCheck { label: "a".into(), verdict: Verdict::NotRun },
                KernelCheck { label: "b".into(), verdict: Verdict::Ok(String::new()) },
            ],
        };
        assert!(v.passed());
        assert_eq!(v.ran().map(|k| k.label.as_str()).collect::<Vec<_>>(), ["b"]);
        let bad = Verification {
            kernels: vec![KernelCheck { label: "c".into(), verdict: Verdict::Mismatch(String::new()) }],
        };
        assert!(!bad.passed());
    }
}

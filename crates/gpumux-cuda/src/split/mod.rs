//! One launch split over several GPUs (GPU-SPARC's split and merge, seed 004;
//! Share-a-GPU's intra-kernel parallelism, seed 001), as a library of one
//! process holding every GPU's context. gpumuxd's split (`core/split.rs`)
//! uses its GPU-free parts: the analysis, the partition and the merge plan
//! (docs/split.md, "Splitting in the daemon").
//!
//! A transformed kernel's workers run any range of the launch's linear block
//! index with `blockIdx`/`gridDim` of the whole launch, so a split is one
//! worker launch per GPU over disjoint ranges ([`partition`](fn@partition)): the index
//! translation of GPU-SPARC's Table I comes with the workers. Inputs are
//! replicated from the home GPU (index 0); outputs are merged back into the
//! home GPU's copy ([`merge`]: GPU-SPARC's shadow buffers, or slices a kernel
//! declares). A kernel whose writes the merge cannot combine is refused from
//! its source ([`analysis`]) unless the caller declares it splittable.
//!
//! * [`partition`](mod@partition), [`merge`], [`analysis`]: pure, CPU-tested;
//! * [`run`]: the GPUs (contexts, peer access, replicated buffers, the launch);
//! * [`suite`]: a suite kernel's launch as a split launch (GPU tests, the check);
//! * [`links`]: the copies' times over the links (`gpumux-cuda-check links`).

pub mod analysis;
pub mod links;
pub mod merge;
pub mod partition;
pub mod run;
pub mod suite;

pub use analysis::{analyse, Refusal, WriteAnalysis};
pub use merge::{BlockSlices, BufferUse, Merge, Role, SplitPlan};
pub use partition::partition;
pub use run::{LinkKind, Prepared, SplitArg, SplitBuffer, SplitGpus, SplitKernel, SplitTiming};
pub use suite::SuiteLaunch;

use crate::error::CudaError;

/// Whether a kernel may be split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Splittable {
    /// If the source analysis finds nothing that breaks the merge ([`analysis`]).
    IfChecked,
    /// The caller vouches that different blocks write disjoint words (a
    /// kernel the analysis cannot follow, or refuses wrongly); the analysis
    /// still runs and its findings are kept ([`SplitKernel::analysis`]).
    Declared,
}

/// What a split can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// The kernel's writes cannot be merged (or the analysis cannot tell).
    #[error(
        "kernel `{kernel}` is not split: {}; run it on one GPU, or declare it splittable (Splittable::Declared) if its blocks write disjoint words anyway",
        reasons.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    Refused {
        /// The kernel.
        kernel: String,
        /// Why, with lines.
        reasons: Vec<Refusal>,
    },
    /// The source has no kernel of that name.
    #[error("the source defines no kernel `{0}`")]
    NoKernel(String),
    /// Arguments, sizes or declarations that do not fit.
    #[error("{0}")]
    Invalid(String),
    /// A declared write set was wrong: a GPU wrote outside its slices.
    #[error("the write set declared for argument {arg} is wrong: GPU {gpu} changed {words} words outside its slices")]
    WrongDeclaration {
        /// The buffer argument.
        arg: usize,
        /// The GPU (index in the split).
        gpu: usize,
        /// Words changed outside its slices.
        words: u64,
    },
    /// The CUDA backend failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The kernel source could not be transformed.
    #[error(transparent)]
    Transform(#[from] crate::transform::TransformError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_kernel_every_reason_and_the_way_out() {
        let a = analyse(crate::suite::App::Histogram.source(), "histogram").expect("found");
        let e = SplitError::Refused { kernel: a.kernel.clone(), reasons: a.refusals.clone() };
        let text = e.to_string();
        assert!(
            text.starts_with("kernel `histogram` is not split: line 20: atomicAdd on global memory (`hist`)"),
            "{text}"
        );
        assert!(text.contains("declare it splittable (Splittable::Declared)"), "{text}");
    }
}

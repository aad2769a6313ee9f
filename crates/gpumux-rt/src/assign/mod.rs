//! GPU execution-mode assignment (seed 004, Section IV-C and IV-D).
//!
//! Every method returns a mode per task (priority order) and whether the analysis deems the
//! set schedulable under it. Methods other than [`Method::Single`] only consider multi-GPU
//! mode when the platform has at least two GPUs.

use serde::Serialize;

use crate::analysis::Analyzer;
use crate::model::{Mode, TaskSet};

pub mod gema;
pub mod global;
pub mod local;
pub mod refine;
pub mod single;

/// A mode per task plus the analysis verdict under it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Assignment {
    /// `M_i`, in priority order.
    pub modes: Vec<Mode>,
    /// Whether `R_i <= D_i` for all tasks under `modes`.
    pub schedulable: bool,
}

/// Mode-assignment method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// Every task in single-GPU mode (today's CUDA/OpenCL).
    Single,
    /// Each task picks the mode with the smaller WCET on its own (paper's LOCAL).
    Local,
    /// Algorithm 1 of the paper: greedy, one task to multi-GPU mode per step.
    Gema,
    /// Ours: GEMA, then steepest-descent local search over 1- and 2-flips (see `refine`).
    GemaLs,
    /// Exhaustive search over the 2^n assignments with branch-and-bound pruning (exact).
    Global,
}

impl Method {
    /// All methods, in the order reports list them.
    pub const ALL: [Method; 5] = [Method::Single, Method::Local, Method::Gema, Method::GemaLs, Method::Global];

    /// Name as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Method::Single => "single",
            Method::Local => "local",
            Method::Gema => "gema",
            Method::GemaLs => "gema-ls",
            Method::Global => "global",
        }
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Runs `method` on `set`, reusing `an`'s buffers.
pub fn assign_with(set: &TaskSet, method: Method, an: &mut Analyzer) -> Assignment {
    if !set.platform.allows_multi() || method == Method::Single {
        return single::single(set, an);
    }
    match method {
        Method::Single => single::single(set, an),
        Method::Local => local::local(set, an),
        Method::Gema => gema::gema(set, an),
        Method::GemaLs => refine::gema_ls(set, an),
        Method::Global => global::global(set, an),
    }
}

/// Runs `method` on `set`.
pub fn assign(set: &TaskSet, method: Method) -> Assignment {
    assign_with(set, method, &mut Analyzer::new())
}

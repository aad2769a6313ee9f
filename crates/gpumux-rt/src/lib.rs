//! # gpumux-rt: real-time GPU task sets on several GPUs (GPU-SPARC)
//!
//! Before deployment, a real-time engineer wants to know whether a set of periodic GPU
//! pipelines meets its deadlines on N GPUs, and which tasks should split their kernels over
//! several GPUs. This crate implements the model, the holistic end-to-end response-time
//! analysis and the GEMA mode-assignment heuristic of GPU-SPARC (Han et al., seed 004,
//! Sections IV–V), the paper's reference methods (Single-GPU, LOCAL, GLOBAL), our own
//! heuristic GEMA-LS, the paper's task-set generator and its Fig. 7 / Fig. 8 experiments.
//!
//! ```
//! use gpumux_rt::{analysis, assign::{assign, Method}, model::TaskSet};
//! let set = TaskSet::from_toml_str(r#"
//!     [platform]
//!     gpus = 2
//!     [[task]]
//!     period = 100
//!     subtasks = [{ resource = "gpu", single = 80, multi = 40 }]
//! "#, "inline.toml").unwrap();
//! let a = assign(&set, Method::Gema);
//! assert!(a.schedulable);
//! let report = analysis::analyze(&set, &a.modes);
//! assert_eq!(report.tasks[0].response, Some(80.0));
//! ```
//!
//! Module map: [`model`] (task model), [`cost`] (multi-GPU times from single-GPU ones),
//! task-set files (TOML, [`TaskSet::from_file`]), [`analysis`] (response times), [`assign`](mod@assign)
//! (methods), [`generate`] (synthetic sets), [`experiment`] (Fig. 7/8), [`plot`] (SVG),
//! [`bench`](mod@bench) (throughput), [`cli`] (the `gpumux rt` subcommand).

#![warn(missing_docs)]

pub mod analysis;
pub mod assign;
pub mod bench;
pub mod cli;
pub mod cost;
pub mod experiment;
pub mod generate;
pub mod model;
pub mod plot;
pub mod rng;
mod toml_io;

pub use analysis::{Analysis, Analyzer};
pub use assign::{assign, Assignment, Method};
pub use model::{Mode, Platform, Resource, Subtask, Task, TaskSet};
pub use toml_io::{ModelError, MAX_SUBTASKS, MAX_TASKS, MAX_TIME};

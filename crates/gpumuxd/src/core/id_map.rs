//! Hash maps keyed by the core's or the engine's own ids: the engine's
//! ([`gpumux_engine::id_map`] says why), which the CUDA device uses too.

pub(crate) use gpumux_engine::id_map::{IdMap, IdSet};

//! The file as written: every field optional (so that a missing one gets our
//! own message, not serde's), unknown fields rejected (so typos fail).
//! Numbers are read wide (`i64`, `f64`) and range-checked in `parse`.

use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFile {
    pub name: Option<String>,
    pub replay_min_runs: Option<i64>,
    #[serde(default)]
    pub kernels: BTreeMap<String, RawKernel>,
    #[serde(default)]
    pub process: Vec<RawProcess>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProcess {
    pub name: Option<String>,
    pub priority: Option<i64>,
    pub weight: Option<f64>,
    pub arrival_us: Option<f64>,
    pub repetitions: Option<i64>,
    pub async_depth: Option<i64>,
    #[serde(default)]
    pub op: Vec<RawOp>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSuite {
    pub name: Option<String>,
    /// One kernel of a multi-kernel suite app (`name = "kmeans", kernel = "assign"`).
    pub kernel: Option<String>,
    #[serde(default)]
    pub params: BTreeMap<String, f64>,
}

/// A reusable `[kernels.NAME]` table: the kernel fields of an op.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKernel {
    pub name: Option<String>,
    pub grid: Option<toml::Value>,
    pub block: Option<toml::Value>,
    pub regs_per_thread: Option<i64>,
    pub smem_per_block: Option<i64>,
    pub block_time_us: Option<f64>,
    pub block_time_spread: Option<f64>,
    pub mem_intensity: Option<f64>,
    pub idempotent: Option<bool>,
    pub max_blocks_per_sm: Option<i64>,
    pub launches: Option<i64>,
    pub suite: Option<RawSuite>,
}

/// One `[[process.op]]`. Holds the fields of every kind; `parse` checks that
/// only those of the op's `kind` are present.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOp {
    pub kind: Option<String>,
    // h2d / d2h
    pub bytes: Option<i64>,
    pub kb: Option<f64>,
    pub mb: Option<f64>,
    // cpu
    pub us: Option<f64>,
    // record / wait_event
    pub event: Option<String>,
    // loop
    pub times: Option<i64>,
    pub op: Option<Vec<RawOp>>,
    // kernel
    pub kernel: Option<String>,
    pub name: Option<String>,
    pub grid: Option<toml::Value>,
    pub block: Option<toml::Value>,
    pub regs_per_thread: Option<i64>,
    pub smem_per_block: Option<i64>,
    pub block_time_us: Option<f64>,
    pub block_time_spread: Option<f64>,
    pub mem_intensity: Option<f64>,
    pub idempotent: Option<bool>,
    pub max_blocks_per_sm: Option<i64>,
    pub launches: Option<i64>,
    pub suite: Option<RawSuite>,
}

impl RawOp {
    /// Names of the fields present, other than `kind`.
    pub fn present(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        macro_rules! chk {
            ($($f:ident),*) => { $( if self.$f.is_some() { v.push(stringify!($f)); } )* };
        }
        chk!(
            bytes,
            kb,
            mb,
            us,
            event,
            times,
            op,
            kernel,
            name,
            grid,
            block,
            regs_per_thread,
            smem_per_block,
            block_time_us,
            block_time_spread,
            mem_intensity,
            idempotent,
            max_blocks_per_sm,
            launches,
            suite
        );
        v
    }

    /// The kernel fields of this op, over those of `base` (a template).
    pub fn kernel_over(&self, base: &RawKernel) -> RawKernel {
        macro_rules! pick {
            ($($f:ident),*) => { RawKernel { $( $f: self.$f.clone().or_else(|| base.$f.clone()), )* } };
        }
        pick!(
            name,
            grid,
            block,
            regs_per_thread,
            smem_per_block,
            block_time_us,
            block_time_spread,
            mem_intensity,
            idempotent,
            max_blocks_per_sm,
            launches,
            suite
        )
    }
}

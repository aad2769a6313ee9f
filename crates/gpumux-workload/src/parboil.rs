//! The built-in Parboil workload of Tanasic et al. (ISCA 2014), Table 1: ten
//! Parboil applications, 24 kernels, as traced on a Kepler K20c. See
//! docs/workloads.md for how the table's columns become `KernelDesc`s and for
//! what is our estimate rather than the paper's.

use gpumux_engine::kernel::{KernelDesc, KernelShape, SimTiming};
use gpumux_engine::model::{Op, ProcessSpec};
use gpumux_engine::time::us_to_ns;
use std::fmt;
use std::sync::Arc;

/// SMs of the K20c (Tanasic Table 2).
pub const K20C_SMS: u64 = 13;
/// Per-SM limits of the K20c as the simulator's `k20c` preset has them.
pub const K20C_SM_THREADS: u32 = 2048;
pub const K20C_SM_BLOCKS: u32 = 16;
pub const K20C_SM_REGS: u32 = 65536;
pub const K20C_SM_SMEM: u32 = 48 * 1024;

/// Spread of block times we give every Parboil kernel (Table 1 has means only).
pub const BLOCK_TIME_SPREAD: f64 = 0.1;

/// The ten applications, in Table 1's order.
pub const APPS: [&str; 10] =
    ["lbm", "histo", "tpacf", "spmv", "mri-q", "sad", "sgemm", "stencil", "cutcp", "mri-gridding"];

/// Tanasic's length classes of an application (Table 1, columns Class 1 and 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AppClass {
    /// Among the shortest applications of the table.
    Short,
    /// Neither short nor long.
    Medium,
    /// Among the longest applications of the table.
    Long,
}

impl fmt::Display for AppClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AppClass::Short => "SHORT",
            AppClass::Medium => "MEDIUM",
            AppClass::Long => "LONG",
        })
    }
}

/// Which block time a kernel gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BlockTime {
    /// Block time that reproduces Table 1's average kernel time on the 13-SM
    /// K20c: `avg_time / ceil(blocks / (13 × TBs/SM))` (one block per slot,
    /// full waves). The default.
    #[default]
    Fit,
    /// Table 1's "Time/TB" column as printed. It equals
    /// `avg_time × TBs/SM / blocks`, which makes kernels run ~13× shorter
    /// than the table's average times on 13 SMs (see docs/workloads.md).
    Table,
}

/// One row of Table 1, plus our choices (threads, registers per thread,
/// memory intensity, idempotence).
#[derive(Clone, Copy, Debug)]
pub struct TableRow {
    /// Parboil application (one of [`APPS`]).
    pub app: &'static str,
    /// Kernel name as the table gives it.
    pub kernel: &'static str,
    /// Launches of the kernel in one run of the application.
    pub launches: u32,
    /// Average time of one launch on the K20c, µs.
    pub avg_time_us: f64,
    /// Thread blocks per launch.
    pub blocks: u64,
    /// The table's time per thread block, µs (see [`BlockTime::Table`]).
    pub time_per_tb_us: f64,
    /// Shared memory per thread block, bytes.
    pub smem_per_tb: u32,
    /// Registers per thread block.
    pub regs_per_tb: u32,
    /// Resident thread blocks per SM the table reports.
    pub tbs_per_sm: u32,
    /// Ours: threads per block (regs_per_tb / threads is exact).
    pub threads: u32,
    /// Ours: memory intensity estimate.
    pub mem_intensity: f64,
    /// Ours: can a block be flushed and rerun (no atomics, no in-place update)?
    pub idempotent: bool,
}

macro_rules! row {
    ($app:expr, $k:expr, $l:expr, $avg:expr, $n:expr, $t:expr, $sm:expr, $r:expr, $b:expr, $th:expr, $mem:expr, $idem:expr) => {
        TableRow {
            app: $app,
            kernel: $k,
            launches: $l,
            avg_time_us: $avg,
            blocks: $n,
            time_per_tb_us: $t,
            smem_per_tb: $sm,
            regs_per_tb: $r,
            tbs_per_sm: $b,
            threads: $th,
            mem_intensity: $mem,
            idempotent: $idem,
        }
    };
}

/// Table 1, row for row. The last three columns are ours.
#[rustfmt::skip]
pub const TABLE1: [TableRow; 24] = [
    //   app             kernel              launch avg us     TBs     us/TB   smem   regs/TB TB/SM threads mem   idempotent
    row!("lbm",          "StreamCollide",    100, 2905.81,   18000,  2.42,      0,  4320, 15, 120, 0.90, true),
    row!("histo",        "final",             20,   70.24,      42,  5.02,      0, 19456,  3, 512, 0.60, true),
    row!("histo",        "prescan",           20,   20.87,      64,  1.30,   4096,  9216,  4, 512, 0.60, false),
    row!("histo",        "intermediates",     20,   77.88,      65,  4.79,      0,  8964,  4, 498, 0.70, true),
    row!("histo",        "main",              20,  372.58,      84,  4.44,  24576, 16896,  1, 768, 0.50, false),
    row!("tpacf",        "genhists",           1, 14615.33,    201, 72.71,  13312,  7680,  1, 256, 0.05, true),
    row!("spmv",         "spmvjds",           50,   42.38,     374,  1.81,      0,   928, 16,  32, 0.80, true),
    row!("mri-q",        "ComputeQ",           2, 3389.71,    1024, 26.48,      0,  5376,  8, 256, 0.05, false),
    row!("mri-q",        "ComputePhiMag",      1,    4.70,       4,  4.70,      0,  6144,  4, 512, 0.30, true),
    row!("sad",          "largersadcalc8",     1, 8174.21,    8040, 16.27,      0,  3328, 16, 128, 0.50, true),
    row!("sad",          "largersadcalc16",    1, 1529.38,    8040,  3.04,      0,   832, 16,  32, 0.50, true),
    row!("sad",          "mbsadcalc",          1, 15446.02, 128640,  0.84,   2224,  2135,  7,  61, 0.40, true),
    row!("sgemm",        "mysgemmNT",          1, 3717.18,     528, 98.56,    512,  4480, 14, 128, 0.15, true),
    row!("stencil",      "block2Dregtiling", 100, 2227.30,     256,  8.70,      0, 41984,  1, 1024, 0.70, true),
    row!("cutcp",        "lattice6overlap",   11, 1520.11,     121, 37.69,   4116,  3328,  3, 128, 0.10, false),
    row!("mri-gridding", "binning",            1, 2021.41,    5188,  1.56,      0,  4096,  4, 512, 0.60, false),
    row!("mri-gridding", "scaninter1",         9,    7.59,      29,  4.14,    665,  1173, 16,  69, 0.50, false),
    row!("mri-gridding", "scanL1",             8,  826.12,    2084,  1.19,   4368,  9216,  3, 512, 0.60, true),
    row!("mri-gridding", "uniformAdd",         8,  127.30,    2084,  0.24,     16,  4096,  4, 512, 0.70, false),
    row!("mri-gridding", "reorder",            1, 2535.30,    5188,  1.95,      0,  8192,  4, 512, 0.70, false),
    row!("mri-gridding", "splitSort",          7, 3838.84,    2594,  4.44,   4484, 10240,  3, 512, 0.50, true),
    row!("mri-gridding", "griddingGPU",        1, 208398.47, 65536, 31.80,   1536,  3648, 10, 192, 0.50, true),
    row!("mri-gridding", "splitRearrange",     7, 1622.93,    2594,  1.88,   4160,  5888,  3, 256, 0.70, true),
    row!("mri-gridding", "scaninter2",         9,    8.81,      29,  4.80,    665,  1173, 16,  69, 0.50, false),
];

/// Our estimate of each application's host side (Table 1 has none):
/// input bytes copied to the device, output bytes copied back.
#[rustfmt::skip]
#[allow(clippy::identity_op)]
const IO: [(&str, u64, u64); 10] = [
    // app            H2D bytes          D2H bytes
    ("lbm",          165 * MIB,         165 * MIB),
    ("histo",          4 * MIB,           1 * MIB),
    ("tpacf",          5 * MIB,          64 * KIB),
    ("spmv",        1536 * KIB,          48 * KIB),
    ("mri-q",       3277 * KIB,           2 * MIB),
    ("sad",            4 * MIB,           8 * MIB),
    ("sgemm",          8 * MIB,           4 * MIB),
    ("stencil",       64 * MIB,          64 * MIB),
    ("cutcp",          1 * MIB,           4 * MIB),
    ("mri-gridding",  61 * MIB,          16 * MIB),
];
const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// CPU time before the first copy: 1 ms plus 1 ms per MiB of input (reading
/// and preparing input at ~1 GiB/s). Ours.
pub fn cpu_before_us(h2d_bytes: u64) -> f64 {
    1000.0 + h2d_bytes as f64 / MIB as f64 * 1000.0
}

/// CPU time after the last copy: 0.5 ms plus 0.5 ms per MiB of output. Ours.
pub fn cpu_after_us(d2h_bytes: u64) -> f64 {
    500.0 + d2h_bytes as f64 / MIB as f64 * 500.0
}

#[rustfmt::skip]
const CLASSES: [(&str, AppClass, AppClass); 10] = {
    use AppClass::*;
    [
        ("lbm", Medium, Long), ("histo", Short, Medium), ("tpacf", Long, Medium),
        ("spmv", Short, Short), ("mri-q", Medium, Short), ("sad", Long, Long),
        ("sgemm", Medium, Short), ("stencil", Medium, Long), ("cutcp", Medium, Medium),
        ("mri-gridding", Long, Long),
    ]
};

/// Kernel order of each application (Parboil's host code structure).
enum Step {
    K(&'static str),
    Loop(u32, &'static [Step]),
}
use Step::{Loop, K};

const MRI_SCAN: &[Step] = &[K("scanL1"), K("scaninter1"), K("scaninter2"), K("uniformAdd")];

fn order(app: &str) -> &'static [Step] {
    match app {
        "lbm" => &[Loop(100, &[K("StreamCollide")])],
        "histo" => &[Loop(20, &[K("prescan"), K("intermediates"), K("main"), K("final")])],
        "tpacf" => &[K("genhists")],
        "spmv" => &[Loop(50, &[K("spmvjds")])],
        "mri-q" => &[K("ComputePhiMag"), Loop(2, &[K("ComputeQ")])],
        "sad" => &[K("mbsadcalc"), K("largersadcalc8"), K("largersadcalc16")],
        "sgemm" => &[K("mysgemmNT")],
        "stencil" => &[Loop(100, &[K("block2Dregtiling")])],
        "cutcp" => &[Loop(11, &[K("lattice6overlap")])],
        "mri-gridding" => &[
            K("binning"),
            // scan of the bin counts: a large array, two rounds of the inter-block scan
            K("scanL1"),
            K("scaninter1"),
            K("scaninter2"),
            K("scaninter1"),
            K("scaninter2"),
            K("uniformAdd"),
            K("reorder"),
            // 7 passes of split sort: sort, scan, rearrange
            Loop(7, &[K("splitSort"), Loop(1, MRI_SCAN), K("splitRearrange")]),
            K("griddingGPU"),
        ],
        _ => &[],
    }
}

/// Strips a mix's `#n` suffix: `sad#2` → `sad`.
fn base_app(app: &str) -> &str {
    app.split_once('#').map_or(app, |(a, _)| a)
}

/// Tanasic's Class 1 label of an application (`sad#2` works too).
pub fn parboil_class1(app: &str) -> Option<AppClass> {
    let app = base_app(app);
    CLASSES.iter().find(|c| c.0 == app).map(|c| c.1)
}

/// Tanasic's Class 2 label of an application (`sad#2` works too).
pub fn parboil_class2(app: &str) -> Option<AppClass> {
    let app = base_app(app);
    CLASSES.iter().find(|c| c.0 == app).map(|c| c.2)
}

/// Resident blocks of a row on one K20c SM from its resources alone.
pub fn k20c_occupancy(threads: u32, regs_per_block: u32, smem: u32) -> u32 {
    let mut b = K20C_SM_BLOCKS.min(K20C_SM_THREADS / threads.max(1));
    if let Some(r) = K20C_SM_REGS.checked_div(regs_per_block) {
        b = b.min(r);
    }
    if let Some(s) = K20C_SM_SMEM.checked_div(smem) {
        b = b.min(s);
    }
    b
}

impl TableRow {
    /// Registers of one thread (`regs_per_tb / threads`, exact for every row).
    pub fn regs_per_thread(&self) -> u32 {
        self.regs_per_tb / self.threads
    }

    /// Mean time of one block under `mode`, µs.
    pub fn block_time_us(&self, mode: BlockTime) -> f64 {
        match mode {
            BlockTime::Table => self.time_per_tb_us,
            BlockTime::Fit => {
                let slots = K20C_SMS * self.tbs_per_sm as u64;
                let waves = self.blocks.div_ceil(slots);
                self.avg_time_us / waves as f64
            }
        }
    }

    /// The kernel as gpumux runs it: the row's shape, an occupancy cap where
    /// resources alone would allow more than the table's TBs/SM, and `mode`'s
    /// block time.
    pub fn desc(&self, mode: BlockTime) -> KernelDesc {
        let occ = k20c_occupancy(self.threads, self.regs_per_tb, self.smem_per_tb);
        KernelDesc {
            name: self.kernel.to_string(),
            shape: KernelShape {
                blocks: self.blocks,
                threads_per_block: self.threads,
                regs_per_thread: self.regs_per_thread(),
                smem_per_block: self.smem_per_tb,
                max_blocks_per_sm: (occ != self.tbs_per_sm).then_some(self.tbs_per_sm),
            },
            idempotent: self.idempotent,
            sim_timing: Some(SimTiming {
                block_time_ns: us_to_ns(self.block_time_us(mode)),
                block_time_spread: BLOCK_TIME_SPREAD,
                mem_intensity: self.mem_intensity,
            }),
            suite: None,
        }
    }
}

/// The 24 kernels of Table 1, in the table's order.
pub fn parboil_kernels(mode: BlockTime) -> Vec<Arc<KernelDesc>> {
    TABLE1.iter().map(|r| Arc::new(r.desc(mode))).collect()
}

/// One application as a process named `name` (priority 0, arriving at 0).
/// `None` for an unknown application.
pub fn parboil_app(app: &str, name: &str, mode: BlockTime) -> Option<ProcessSpec> {
    let (_, h2d, d2h) = *IO.iter().find(|io| io.0 == app)?;
    let kernels: Vec<(&str, Arc<KernelDesc>)> =
        TABLE1.iter().filter(|r| r.app == app).map(|r| (r.kernel, Arc::new(r.desc(mode)))).collect();
    let mut ops = vec![Op::Cpu { ns: us_to_ns(cpu_before_us(h2d)) }, Op::CopyToDevice { bytes: h2d }];
    fn emit(steps: &[Step], kernels: &[(&str, Arc<KernelDesc>)], ops: &mut Vec<Op>) {
        for s in steps {
            match s {
                K(k) => {
                    if let Some((_, d)) = kernels.iter().find(|(n, _)| n == k) {
                        ops.push(Op::Kernel(d.clone()));
                    }
                }
                Loop(n, body) => {
                    for _ in 0..*n {
                        emit(body, kernels, ops);
                    }
                }
            }
        }
    }
    emit(order(app), &kernels, &mut ops);
    ops.push(Op::CopyToHost { bytes: d2h });
    ops.push(Op::Cpu { ns: us_to_ns(cpu_after_us(d2h)) });
    Some(ProcessSpec {
        name: name.to_string(),
        priority: 0,
        weight: 1.0,
        arrival_ns: 0,
        repetitions: 1,
        async_depth: 0,
        ops,
    })
}

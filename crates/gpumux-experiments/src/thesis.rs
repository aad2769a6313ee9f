//! The thesis's set-up rebuilt for gpumux's simulator: a Quadro FX 5800-like
//! GPU (Table 3.3) and twelve applications built from what Table 3.2 reports
//! of each (kernels, share of GPU time, calls, blocks, threads per block,
//! blocks per SM). What the thesis does not report is ours and labelled so:
//! the length of one run alone, block-time spread, memory intensity.

use anyhow::Result;
use gpumux_engine::kernel::{DeviceInfo, KernelDesc, KernelShape, SimTiming, SmLimits};
use gpumux_engine::model::{Op, ProcessSpec, Workload};
use gpumux_engine::policies::partition::AppChar;
use gpumux_engine::time::Nanos;
use gpumux_sim::memory::MemModel;
use std::sync::Arc;

/// Thesis Table 3.3 (GPGPU-Sim's Quadro FX 5800): 30 SMs, 64 KB of
/// registers (16K) and 16 KB shared memory per SM; GT200 limits of 1024
/// threads and 8 blocks per SM; 102 GB/s (8 GDDR3 channels at 800 MHz, 512
/// bit). PCIe is not modelled by the thesis; ours is PCIe 2.0 x16.
pub fn fx5800() -> DeviceInfo {
    DeviceInfo {
        name: FX5800_NAME.into(),
        num_sms: 30,
        sm: SmLimits { max_threads: 1024, max_blocks: 8, registers: 16384, smem_bytes: 16 * 1024 },
        mem_bandwidth: 102.0e9,
        pcie_bandwidth: 6.0e9,
        pcie_latency_ns: 10_000,
        mem_bytes: 4 << 30,
    }
}

/// The device name of [`fx5800`], by which [`crate::sim::SimSetup::memory_of`] gives it its own memory model.
pub const FX5800_NAME: &str = "sim:fx5800";

/// The FX 5800's memory model. The thesis reports no per-SM bandwidth
/// ceiling, but it does report DRAM utilisation (Table 5.3): one application
/// alone keeps DRAM 37.0 % busy on average over the twelve. κ = 1.5 makes
/// ours match with our memory intensities (39.0 %; κ = 1: 27.3 %, κ = 2.5:
/// 54.4 %; `gpumux experiment adriaens-even --mem-ratio K` prints it), so a
/// memory-bound app (m = 0.75) saturates the 102 GB/s with 27 of 30 SMs.
/// Block times stay calibrated on all 30 SMs when a profile runs on fewer.
pub fn fx5800_memory() -> MemModel {
    MemModel { calibration_sms: Some(30), ..MemModel::with_ratio(&fx5800(), FX5800_SATURATION_RATIO) }
}

/// κ of the FX 5800, fitted to thesis Table 5.3 (see `fx5800_memory`).
pub const FX5800_SATURATION_RATIO: f64 = 1.5;

/// One kernel row of thesis Table 3.2.
#[derive(Clone, Copy, Debug)]
pub struct Row {
    /// Kernel name as the table gives it.
    pub kernel: &'static str,
    /// Share of the application's GPU time, %.
    pub share: f64,
    /// Launches of the kernel in one run.
    pub calls: u32,
    /// Thread blocks per launch.
    pub blocks: u64,
    /// Threads per block.
    pub threads: u32,
    /// Resident blocks per SM the thesis measured (our occupancy cap).
    pub blocks_per_sm: u32,
}

/// How the thesis classifies an application (ch. 4-5), which sets our
/// memory-intensity estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Limited by arithmetic.
    Compute,
    /// Limited by the size of its problem (too few blocks to fill the GPU).
    ProblemSize,
    /// Limited by DRAM bandwidth.
    Memory,
    /// Any other class the thesis gives (fractals, raytrace).
    Other,
}

/// One application of thesis Table 3.2: its kernels and how it is bound.
pub struct App {
    /// Short name, as the experiments print it.
    pub name: &'static str,
    /// The thesis's class, which sets our memory-intensity estimate.
    pub bound: Bound,
    /// Its kernels, as Table 3.2 lists them.
    pub rows: &'static [Row],
}

macro_rules! r {
    ($k:expr, $s:expr, $c:expr, $b:expr, $t:expr, $bps:expr) => {
        Row { kernel: $k, share: $s, calls: $c, blocks: $b, threads: $t, blocks_per_sm: $bps }
    };
}

/// Thesis Table 3.2, row for row (Fractals' row is garbled in our copy; its
/// 8 blocks per SM is from Table 6.1).
#[rustfmt::skip]
pub const APPS: [App; 12] = [
    App { name: "aes-dec", bound: Bound::Compute, rows: &[r!("aesDecrypt128", 100.0, 1, 4097, 256, 5)] },
    App { name: "aes-enc", bound: Bound::Compute, rows: &[r!("aesEncrypt128", 100.0, 1, 4097, 256, 3)] },
    App { name: "dvc", bound: Bound::ProblemSize, rows: &[
        r!("motion_copy_2ref_2b", 19.2, 98, 96, 256, 2), r!("s_transform_h_9_3", 19.1, 387, 240, 256, 4),
        r!("motion_copy_2ref_4b", 16.6, 49, 176, 256, 2), r!("s_transform_v_9_3", 12.8, 150, 5, 128, 1),
        r!("s_transform_v_9_3", 7.2, 150, 3, 128, 1), r!("s_transform_v_9_3", 5.0, 50, 10, 128, 1),
        r!("s_transform_v_9_3", 4.3, 150, 2, 128, 5), r!("s_transform_h_9_3", 3.5, 150, 120, 256, 4),
        r!("add_s16_s16", 3.2, 141, 256, 256, 4), r!("s_transform_h_9_3", 2.0, 150, 60, 256, 2),
        r!("s_transform_v_9_3", 2.0, 100, 1, 128, 1), r!("upsample_vertical", 1.9, 15, 100, 256, 3),
        r!("upsample_vertical", 1.8, 30, 50, 256, 2), r!("s_transform_h_9_3", 1.5, 150, 30, 256, 1)] },
    App { name: "fractals", bound: Bound::Other, rows: &[
        r!("resetPointsKernel", 99.8, 7, 512, 64, 8), r!("setBufferKernel", 0.2, 2, 336, 256, 4)] },
    App { name: "denoise", bound: Bound::Compute, rows: &[r!("NLM2", 100.0, 1, 110592, 64, 8)] },
    App { name: "jpeg-dec", bound: Bound::Compute, rows: &[r!("2IDCT", 100.0, 1, 13824, 64, 8)] },
    App { name: "jpeg-enc", bound: Bound::Memory, rows: &[
        r!("QuantizationFloat", 62.9, 1, 110592, 64, 8), r!("2DCT", 37.1, 1, 13824, 64, 7)] },
    App { name: "rsa", bound: Bound::ProblemSize, rows: &[r!("kern_RSAenc_Montg", 100.0, 1, 4, 32, 3)] },
    App { name: "radix", bound: Bound::ProblemSize, rows: &[
        r!("radixSortBlocksKeysOnly", 51.9, 8, 256, 256, 3), r!("findRadixOffsets", 43.6, 16, 512, 256, 4),
        r!("scan4", 3.0, 16, 8, 128, 1), r!("scan4", 1.5, 8, 1, 128, 1)] },
    App { name: "raytrace", bound: Bound::Other, rows: &[r!("render", 100.0, 33, 2048, 128, 8)] },
    App { name: "sad", bound: Bound::Memory, rows: &[
        r!("mb_sad_calc", 90.0, 7, 4800, 61, 8), r!("larger_sad_calc_8", 7.9, 6, 300, 128, 8),
        r!("larger_sad_calc_16", 2.1, 6, 300, 32, 8)] },
    App { name: "sha1", bound: Bound::ProblemSize, rows: &[r!("sha1_kernel_direct", 100.0, 1, 65, 64, 3)] },
];

/// Ours: GPU time of one run of any application alone on the 30 SMs. The
/// thesis gives none (runs were cut at 5M cycles); equal lengths keep any one
/// application from dominating a fixed-time window.
pub const RUN_ALONE_NS: Nanos = 500_000;
/// The thesis's window: 5M GPU cycles at 650 MHz.
pub const WINDOW_NS: Nanos = 7_692_308;

impl Bound {
    /// Ours: fraction of the FX 5800's bandwidth the kernel uses on all 30 SMs.
    pub fn mem_intensity(self) -> f64 {
        match self {
            Bound::Compute => 0.15,
            Bound::ProblemSize => 0.3,
            Bound::Memory => 0.75,
            Bound::Other => 0.35,
        }
    }
}

/// Occupancy cap: the table's blocks per SM, within the GT200's limits
/// (AES Decrypt's 5 × 256 threads exceed 1024 threads: it gets 4).
pub fn occupancy(row: &Row, dev: &DeviceInfo) -> u32 {
    row.blocks_per_sm.min(dev.sm.max_blocks).min(dev.sm.max_threads / row.threads.max(1)).max(1)
}

fn kernel(row: &Row, dev: &DeviceInfo, blocks: u64, bound: Bound) -> KernelDesc {
    let bps = occupancy(row, dev);
    // Block time that makes this kernel's calls take its share of a run on all SMs.
    let per_call_ns = RUN_ALONE_NS as f64 * row.share / 100.0 / row.calls as f64;
    let waves = row.blocks.div_ceil(bps as u64 * dev.num_sms as u64).max(1);
    let shape = KernelShape::new(blocks, row.threads, 8).with_max_blocks_per_sm(bps);
    let timing = SimTiming::new(((per_call_ns / waves as f64).round() as Nanos).max(100))
        .with_spread(0.1)
        .with_mem_intensity(bound.mem_intensity());
    KernelDesc::new(row.kernel, shape).with_sim_timing(timing)
}

/// Calls in the order one run makes them: the table gives counts, not order,
/// so calls are interleaved round-robin by row (DVC and Radix Sort loop over
/// their kernels per frame / per pass).
fn call_order(app: &App) -> Vec<usize> {
    let mut left: Vec<u32> = app.rows.iter().map(|r| r.calls).collect();
    let mut out = Vec::new();
    while left.iter().any(|&c| c > 0) {
        for (i, c) in left.iter_mut().enumerate() {
            if *c > 0 {
                *c -= 1;
                out.push(i);
            }
        }
    }
    out
}

/// One run of `app`: its kernels, back to back, no host work (the thesis
/// models neither CPU nor PCIe).
pub fn run_ops(app: &App, dev: &DeviceInfo) -> Vec<Op> {
    let descs: Vec<Arc<KernelDesc>> = app.rows.iter().map(|r| Arc::new(kernel(r, dev, r.blocks, app.bound))).collect();
    call_order(app).into_iter().map(|i| Op::Kernel(descs[i].clone())).collect()
}

/// Blocks in one run of `app`.
pub fn run_blocks(app: &App) -> u64 {
    app.rows.iter().map(|r| r.blocks * r.calls as u64).sum()
}

/// The application called `name`, if the table has one.
pub fn app(name: &str) -> Option<&'static App> {
    APPS.iter().find(|a| a.name == name)
}

fn process(name: String, ops: Vec<Op>, repetitions: u32) -> ProcessSpec {
    ProcessSpec { name, priority: 0, weight: 1.0, arrival_ns: 0, repetitions, async_depth: 0, ops }
}

/// The apps restarted over and over (the thesis's RESPAWN_PROCESSES), for a
/// fixed-time window.
pub fn respawning(apps: &[&App], dev: &DeviceInfo) -> Workload {
    Workload {
        name: apps.iter().map(|a| a.name).collect::<Vec<_>>().join("+"),
        processes: apps
            .iter()
            .enumerate()
            .map(|(i, a)| process(format!("{}#{i}", a.name), run_ops(a, dev), 1_000_000))
            .collect(),
        replay_min_runs: None,
    }
}

/// Exactly `blocks[i]` blocks of work of app i, in its own call order (whole
/// runs, then a prefix of one more run, the last kernel cut to size): the
/// same work a fixed-time spatial run did, for the cooperative run.
pub fn fixed_work(apps: &[&App], dev: &DeviceInfo, blocks: &[u64]) -> Result<Workload> {
    let mut processes = Vec::new();
    for (i, (a, &b)) in apps.iter().zip(blocks).enumerate() {
        let one = run_ops(a, dev);
        let per_run = run_blocks(a);
        let mut ops = Vec::new();
        for _ in 0..b / per_run.max(1) {
            ops.extend(one.iter().cloned());
        }
        let mut left = b % per_run.max(1);
        for op in &one {
            if left == 0 {
                break;
            }
            if let Op::Kernel(k) = op {
                let n = k.shape.blocks.min(left);
                left -= n;
                ops.push(Op::Kernel(if n == k.shape.blocks {
                    k.clone()
                } else {
                    let mut part = (**k).clone();
                    part.shape.blocks = n;
                    Arc::new(part)
                }));
            }
        }
        if !ops.is_empty() {
            processes.push(process(format!("{}#{i}", a.name), ops, 1));
        }
    }
    anyhow::ensure!(!processes.is_empty(), "no process did any work in the window");
    Ok(Workload { name: "fixed-work".into(), processes, replay_min_runs: None })
}

/// Thesis Table 6.1 for `app`: blocks and threads per block weighted by share
/// of time (Eq. 6.3); blocks per SM of the kernel with the largest share.
/// `max_bps` is the occupancy the GPU allows the main kernel (Packed uses it).
pub fn characteristics(app: &App, dev: &DeviceInfo, speedup: Vec<f64>) -> AppChar {
    let w: f64 = app.rows.iter().map(|r| r.share).sum();
    let blocks = app.rows.iter().map(|r| r.share * r.blocks as f64).sum::<f64>() / w;
    let tpb = app.rows.iter().map(|r| r.share * r.threads as f64).sum::<f64>() / w;
    let main = app.rows.iter().max_by(|a, b| a.share.total_cmp(&b.share)).unwrap_or(&app.rows[0]);
    let bps = occupancy(main, dev);
    let speedup =
        if speedup.is_empty() { AppChar::predicted(blocks, tpb, bps, dev.num_sms as u32).speedup } else { speedup };
    AppChar { blocks, threads_per_block: tpb, blocks_per_sm: bps, speedup }
}

/// Every multiset of `k` of the `n` apps (thesis: "all combinations, with repetition").
pub fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    fn rec(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            cur.push(i);
            rec(i, n, k, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    rec(0, n, k, &mut Vec::new(), &mut out);
    out
}

/// `count` of `all`, evenly spaced (deterministic subsets for `--quick`).
pub fn spaced<T: Clone>(all: &[T], count: usize) -> Vec<T> {
    if count >= all.len() {
        return all.to_vec();
    }
    (0..count).map(|i| all[i * all.len() / count].clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_with_repetition_match_the_thesis_counts() {
        // 12 applications: 78 pairs (the thesis's "78 combinations").
        assert_eq!(combinations(12, 2).len(), 78);
        assert_eq!(combinations(12, 3).len(), 364);
        assert_eq!(combinations(3, 2), vec![vec![0, 0], vec![0, 1], vec![0, 2], vec![1, 1], vec![1, 2], vec![2, 2]]);
    }

    #[test]
    fn every_app_fits_the_fx5800_and_runs_alone_in_about_the_set_time() {
        let dev = fx5800();
        for a in &APPS {
            for op in run_ops(a, &dev) {
                if let Op::Kernel(k) = op {
                    assert!(dev.blocks_per_sm(&k).is_ok(), "{} {}", a.name, k.name);
                }
            }
        }
        assert_eq!(occupancy(&APPS[0].rows[0], &dev), 4);
    }

    #[test]
    fn fixed_work_has_exactly_the_blocks() {
        let dev = fx5800();
        let a = app("radix").expect("radix");
        let per = run_blocks(a);
        let w = fixed_work(&[a], &dev, &[per + 300]).expect("work");
        let total: u64 =
            w.processes[0].ops.iter().map(|o| if let Op::Kernel(k) = o { k.shape.blocks } else { 0 }).sum();
        assert_eq!(total, per + 300);
    }

    #[test]
    fn table_6_1_weighted_means() {
        let dev = fx5800();
        let c = characteristics(app("sad").expect("sad"), &dev, vec![]);
        // 0.9 × 4800 + 0.079 × 300 + 0.021 × 300 = 4350 (Table 6.1: 4,354).
        assert!((c.blocks - 4350.0).abs() < 1.0, "{}", c.blocks);
        assert_eq!(c.blocks_per_sm, 8);
    }
}

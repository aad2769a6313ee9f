//! What `gpumux calibrate` measures of each kernel alone on a device, and how it turns the
//! measurements into simulator parameters by inverting the simulator itself (`fit_kernel`):
//! a block time is whatever makes the simulated alone time equal the measured one, on the
//! same SMs, so the simulator's wave and tail effects cancel instead of being modelled twice.

use super::file::KernelCal;
use super::probe::Probe;
use anyhow::{Context, Result};
use gpumux_engine::device::CopyDirection;
use gpumux_engine::kernel::{DeviceInfo, KernelDesc, SimTiming};
use gpumux_engine::ranges::BlockRanges;
use gpumux_engine::smset::SmSet;
use gpumux_engine::time::Nanos;
use gpumux_sim::{presets, SimGpu};
use std::sync::Arc;

/// How much `calibrate` measures.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Timed whole-grid launches per kernel (after one warm-up).
    pub runs: u32,
    /// Single-block launches per kernel (the spread).
    pub samples: u32,
}

/// Raw measurements of one kernel alone on the measured device (times in ns).
#[derive(Clone, Debug)]
pub struct KernelRuns {
    /// Resident blocks per SM on the measured device (its declared resources).
    pub bps: u32,
    pub alone: Vec<f64>,
    /// SMs of the small run (fewer than the device's, where DRAM does not saturate).
    pub small_sms: u16,
    pub small: Option<f64>,
    /// Blocks and time of a run of several waves on one SM.
    pub one_sm: Option<(u64, f64)>,
    /// Single-block launches on one SM.
    pub singles: Vec<f64>,
    pub retreat: Option<f64>,
}

pub fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

pub fn sd(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// κ of the target simulator: SMs' summed memory ceiling over DRAM bandwidth.
pub fn kappa(target: &DeviceInfo) -> f64 {
    presets::memory_model(target).saturation_ratio(target)
}

/// SMs of the small run: few enough that even a fully memory-bound kernel stays below the
/// DRAM bandwidth in the target's model (`S · κ / SMs <= 1/2`), so its blocks run at their
/// unstretched speed there.
pub fn small_sms(num_sms: u16, target: &DeviceInfo) -> u16 {
    ((num_sms as f64 / (2.0 * kappa(target))).floor() as u16).clamp(1, num_sms)
}

/// Measures one kernel alone on `p`'s device.
pub fn measure_kernel(p: &mut Probe, desc: &Arc<KernelDesc>, target: &DeviceInfo, plan: Plan) -> Result<KernelRuns> {
    let name = &desc.name;
    let sms = p.num_sms();
    p.whole(desc, sms).with_context(|| format!("warm-up run of `{name}`"))?;
    let mut alone = Vec::new();
    for _ in 0..plan.runs.max(1) {
        alone.push(p.whole(desc, sms).with_context(|| format!("alone run of `{name}`"))?);
    }
    let small_sms = small_sms(sms, target);
    let small = if small_sms < sms { Some(p.whole(desc, small_sms)?) } else { None };

    // One invocation, disjoint parts: several waves on SM 0, then single blocks on SM 0.
    let bps = u64::from(p.blocks_per_sm(desc)?);
    let blocks = desc.shape.blocks;
    let k = p.invocation();
    let mut used = BlockRanges::new();
    let waves = (blocks / 2 / bps).min(8);
    let one_sm = if waves >= 2 {
        let n = waves * bps;
        used.insert(0..n);
        Some((n, p.timed(desc, k, BlockRanges::full(n), SmSet::range(0, 1))?))
    } else {
        None
    };
    let first = used.len();
    let n = u64::from(plan.samples).min(blocks - first);
    let mut singles = Vec::new();
    if let Some(step) = (blocks - first).checked_div(n) {
        let step = step.max(1);
        for j in 0..n {
            let b = first + j * step;
            let mut one = BlockRanges::new();
            one.insert(b..b + 1);
            used.insert(b..b + 1);
            singles.push(p.timed(desc, k, one, SmSet::range(0, 1))?);
        }
    }
    p.finish_invocation(desc, k, &used)?;
    let retreat = p.retreat_latency(desc, (mean(&alone) / 3.0) as Nanos)?;
    Ok(KernelRuns { bps: bps as u32, alone, small_sms, small, one_sm, singles, retreat })
}

/// Launch overhead of one kernel from its runs: `T(n blocks, one SM) = L + (n / bps) · b` and
/// `T(1 block) = L + b` (the mean of the single-block launches). `None` without a several-wave run.
pub fn launch_overhead(r: &KernelRuns) -> Option<f64> {
    let bps = r.bps;
    let (n, t) = r.one_sm?;
    if r.singles.is_empty() {
        return None;
    }
    let waves = n as f64 / bps as f64;
    let t1 = mean(&r.singles);
    let b = (t - t1) / (waves - 1.0);
    Some((t1 - b).max(0.0))
}

/// Mean alone time of `desc` on the first `sms` SMs of a fresh simulated `target`, over the
/// `runs` invocations that follow a first one: the invocations `measure_kernel` times, so
/// the per-block variation (a hash of the invocation) averages the same way on both sides.
pub fn sim_alone(target: &DeviceInfo, desc: &Arc<KernelDesc>, sms: u16, runs: usize) -> Result<f64> {
    let mut gpu = SimGpu::new(target.clone(), 1);
    let mut p = Probe::new(&mut gpu);
    p.invocation();
    let mut t = Vec::new();
    for _ in 0..runs.max(1) {
        t.push(p.whole(desc, sms)?);
    }
    Ok(mean(&t))
}

fn with_timing(desc: &KernelDesc, t: SimTiming) -> Arc<KernelDesc> {
    Arc::new(KernelDesc { sim_timing: Some(t), ..desc.clone() })
}

/// Turns one kernel's runs into simulator parameters for `target` (the entry of the
/// calibration file). `overhead`: the device's launch overhead (ns), taken out of the
/// small-versus-whole comparison but left in the block time, since the simulator has no
/// launch latency of its own and the alone time is what must come out right.
pub fn fit_kernel(desc: &KernelDesc, r: &KernelRuns, target: &DeviceInfo, overhead: f64) -> Result<KernelCal> {
    let mut notes = Vec::new();
    let given = desc.sim_timing.unwrap_or_else(|| SimTiming::new(1000));
    let bps = target.blocks_per_sm(desc)?;
    let alone = mean(&r.alone);

    // Spread: single blocks are uniform in mean × (1 ± s) in the model, so s = √3 · sd / mean.
    let xs: Vec<f64> = r.singles.iter().map(|t| t - overhead).collect();
    let spread = if xs.len() < 8 {
        notes.push("spread: too few blocks to sample; kept the file's".to_string());
        given.block_time_spread
    } else if mean(&xs) < overhead {
        notes.push("spread: a block is shorter than the launch overhead; kept the file's".to_string());
        given.block_time_spread
    } else {
        (3f64.sqrt() * sd(&xs) / mean(&xs)).clamp(0.0, 0.95)
    };

    // Memory intensity: per-block time on all SMs over per-block time on few SMs (where DRAM
    // does not saturate) is the model's stretch f = 1 − m + m · max(1, m κ ρ) alone.
    let n = r.alone.len();
    let unit = |m: f64| with_timing(desc, SimTiming::new(1000).with_spread(spread).with_mem_intensity(m));
    let k = kappa(target);
    let resident = (desc.shape.blocks as f64).min(target.num_sms as f64 * bps as f64);
    let rho = resident / (target.num_sms as f64 * bps as f64);
    let cap = (1.0 / (k * rho)).min(1.0);
    let mut mem = given.mem_intensity.min(cap);
    let mut stretch = None;
    match r.small {
        Some(small) => {
            let u_all = sim_alone(target, &unit(0.0), target.num_sms, n)?;
            let u_small = sim_alone(target, &unit(0.0), r.small_sms.min(target.num_sms), 1)?;
            let f = ((alone - overhead) / u_all) / ((small - overhead) / u_small);
            stretch = Some(f);
            if f > 1.02 {
                mem = ((1.0 + (1.0 + 4.0 * k * rho * (f - 1.0)).sqrt()) / (2.0 * k * rho)).min(1.0);
            } else {
                notes.push(format!(
                    "mem_intensity: DRAM did not saturate alone (stretch {f:.3}); not identifiable, kept the file's {:.2} capped at 1/(κρ) = {cap:.2}",
                    given.mem_intensity
                ));
            }
        }
        None => notes.push("mem_intensity: no small-SM run; kept the file's".to_string()),
    }

    // Block time: scale until the simulated alone time is the measured one.
    let mut bt = alone / sim_alone(target, &unit(mem), target.num_sms, n)? * 1000.0;
    for _ in 0..3 {
        let d = with_timing(
            desc,
            SimTiming { block_time_ns: bt.round().max(1.0) as Nanos, block_time_spread: spread, mem_intensity: mem },
        );
        let t = sim_alone(target, &d, target.num_sms, n)?;
        bt *= alone / t;
    }
    Ok(KernelCal {
        name: desc.name.clone(),
        blocks: desc.shape.blocks,
        threads_per_block: desc.shape.threads_per_block,
        block_time_us: bt / 1000.0,
        block_time_spread: spread,
        mem_intensity: mem,
        given_block_time_us: desc.sim_timing.map(|t| t.block_time_ns as f64 / 1000.0),
        alone_us: alone / 1000.0,
        alone_sd_us: sd(&r.alone) / 1000.0,
        runs: r.alone.len() as u32,
        small_sms: r.small.map(|_| r.small_sms),
        small_us: r.small.map(|t| t / 1000.0),
        stretch,
        launch_overhead_us: launch_overhead(r).map(|l| l / 1000.0),
        single_block_us: (!r.singles.is_empty()).then(|| mean(&r.singles) / 1000.0),
        preempt_latency_us: r.retreat.map(|t| t / 1000.0),
        notes,
    })
}

/// Copy time `latency + bytes / bandwidth` fitted from two sizes (runs of each), per direction.
pub struct Link {
    pub h2d: (f64, f64),
    pub d2h: (f64, f64),
}

/// Sizes of the copy runs: small enough for any device, large enough that the bandwidth
/// dominates the second.
pub const COPY_SIZES: [u64; 2] = [1 << 20, 64 << 20];

pub fn measure_link(p: &mut Probe, runs: u32) -> Result<Link> {
    let mut fit = |d: CopyDirection| -> Result<(f64, f64)> {
        p.copy(d, COPY_SIZES[0])?;
        let mut t = [Vec::new(), Vec::new()];
        for _ in 0..runs.max(1) {
            for (i, &b) in COPY_SIZES.iter().enumerate() {
                t[i].push(p.copy(d, b)?);
            }
        }
        let (t0, t1) = (mean(&t[0]), mean(&t[1]));
        let bw = (COPY_SIZES[1] - COPY_SIZES[0]) as f64 / ((t1 - t0).max(1.0) / 1e9);
        let lat = (t0 - COPY_SIZES[0] as f64 / bw * 1e9).max(0.0);
        Ok((bw, lat))
    };
    Ok(Link { h2d: fit(CopyDirection::HostToDevice)?, d2h: fit(CopyDirection::DeviceToHost)? })
}

//! Calibration arithmetic: how many bytes a copy moves and how many loop iterations a kernel
//! runs so that a subtask takes its stated time.
//!
//! Both costs are measured alone at start, on every GPU, and fitted by a line
//! `t(x) = fixed + per_unit · x` (a copy of `x` bytes; a kernel of `x` iterations per
//! thread): the fixed part is the request's round trip through gpumuxd and the launch, the
//! slope the bus's or the GPU's rate. The slowest GPU's fit is used for all (a WCET is a
//! worst case). A subtask then aims at `fill · C` (the `--fill` margin, default 0.9): the
//! analysis takes `C` as a worst case, and a run that aimed at exactly `C` would overrun it
//! about half the time by the noise of the measurement.

use anyhow::{bail, Result};
use std::time::Instant;

use super::lanes::{first_half, Lane};

/// `t(x) = fixed_s + per_unit_s · x`, seconds.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Linear {
    /// Time of the operation with nothing to do (x = 0).
    pub fixed_s: f64,
    /// Time per unit (byte, iteration).
    pub per_unit_s: f64,
}

impl Linear {
    /// The line through two measurements `(x1, t1)`, `(x2, t2)` with `x2 > x1`. A slope that
    /// is not positive means the measurement saw no cost growing with the work: an error.
    pub fn fit(what: &str, (x1, t1): (f64, f64), (x2, t2): (f64, f64)) -> Result<Linear> {
        if x2 <= x1 || ![x1, t1, x2, t2].iter().all(|v| v.is_finite() && *v >= 0.0) {
            bail!("calibrating {what}: bad measurements ({x1}, {t1} s), ({x2}, {t2} s)");
        }
        let per_unit_s = (t2 - t1) / (x2 - x1);
        if per_unit_s <= 0.0 {
            bail!(
                "calibrating {what}: {x2} units took {:.3} ms, no longer than {x1} units ({:.3} ms): \
                 the device did not slow down with more work",
                t2 * 1e3,
                t1 * 1e3
            );
        }
        Ok(Linear { fixed_s: (t1 - per_unit_s * x1).max(0.0), per_unit_s })
    }

    /// Predicted time of `x` units.
    #[cfg(test)]
    pub fn time(&self, x: f64) -> f64 {
        self.fixed_s + self.per_unit_s * x
    }

    /// Units that take `t` seconds (0 when `t` is below the fixed part).
    pub fn units_for(&self, t: f64) -> f64 {
        ((t - self.fixed_s) / self.per_unit_s).max(0.0)
    }

    /// The slower of two fits in each part (the worst GPU of several).
    pub fn slower(self, other: Linear) -> Linear {
        Linear { fixed_s: self.fixed_s.max(other.fixed_s), per_unit_s: self.per_unit_s.max(other.per_unit_s) }
    }
}

/// The median of some measurements (0 for none): robust to one preempted run.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A PCI subtask as copies: `pieces` times, `bytes` to (or from) each of the task's GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CopyPlan {
    /// Copies in a row (the bus is taken again for each when the subtask is chunked).
    pub pieces: u32,
    /// Bytes of each copy (a multiple of 4, at least 4).
    pub bytes: u64,
}

/// Most pieces a subtask is cut into (a 1 ms copy in 1 µs pieces).
const MAX_PIECES: u32 = 1_000_000;

/// Copies that take `target_s` in all: at least `min_pieces` pieces (a chunked subtask: one
/// per chunk), each of at most `max_piece` bytes, each copied to `gpus` GPUs in a row (multi
/// mode sends inputs to both GPUs and reads both outputs). `fit` is one copy's time by bytes.
pub fn plan_copy(target_s: f64, min_pieces: u32, max_piece: u64, gpus: u32, fit: &Linear) -> CopyPlan {
    let gpus = f64::from(gpus.max(1));
    let mut pieces = min_pieces.max(1);
    loop {
        let per_copy = target_s / (f64::from(pieces) * gpus);
        let bytes = fit.units_for(per_copy);
        if bytes <= max_piece as f64 || pieces >= MAX_PIECES {
            let bytes = ((bytes.min(max_piece as f64) as u64) & !3).max(4);
            return CopyPlan { pieces, bytes };
        }
        // Enough pieces of the largest size, then their bytes again for the fixed parts.
        let total = fit.units_for(target_s / gpus);
        pieces = ((total / max_piece as f64).ceil() as u32).max(pieces + 1).min(MAX_PIECES);
    }
}

/// A GPU subtask as launches: `launches` kernels in a row of `iters` iterations each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KernelPlan {
    /// Kernels in a row (GPU-SPARC's sub-kernels when the subtask is chunked: the GPU is
    /// taken again for each).
    pub launches: u32,
    /// Loop iterations per thread of each kernel.
    pub iters: u32,
}

/// Kernels that take `target_s` in all, at least `min_launches` of them; `fit` is one
/// kernel's time by iterations (on one GPU, or each GPU's half in multi mode).
pub fn plan_kernel(target_s: f64, min_launches: u32, fit: &Linear) -> KernelPlan {
    let launches = min_launches.max(1);
    let iters = fit.units_for(target_s / f64::from(launches)).round().min(f64::from(u32::MAX)) as u32;
    KernelPlan { launches, iters }
}

/// Sections a subtask of `cost` is cut into when its longest non-preemptive section is
/// `chunk` (none: one section).
pub fn sections(cost: f64, chunk: Option<f64>) -> u32 {
    match chunk {
        Some(k) if k > 0.0 && k < cost => ((cost / k).ceil().min(f64::from(MAX_PIECES))) as u32,
        _ => 1,
    }
}

/// The measured costs of one GPU (or the slowest of several).
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Fits {
    /// A host-to-device copy, by bytes.
    pub upload: Linear,
    /// A device-to-host copy, by bytes.
    pub download: Linear,
    /// The whole work kernel on one GPU, by iterations.
    pub whole: Linear,
    /// Half of it (one GPU's part in multi mode), by iterations.
    pub half: Linear,
}

impl Fits {
    /// The slower of two GPUs' fits in every part.
    pub fn slower(self, o: Fits) -> Fits {
        Fits {
            upload: self.upload.slower(o.upload),
            download: self.download.slower(o.download),
            whole: self.whole.slower(o.whole),
            half: self.half.slower(o.half),
        }
    }
}

/// Repetitions of each calibration measurement (their median is used).
const REPS: usize = 7;
/// The longer kernel of the calibration takes at least this long, seconds.
const KERNEL_PROBE_S: f64 = 0.02;

fn timed(f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let t = Instant::now();
    f()?;
    Ok(t.elapsed().as_secs_f64())
}

/// The median of [`REPS`] measurements, after one that is not counted (it may pay for a
/// first use: a grid size, a buffer).
fn median_of(mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    f()?;
    let mut v = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        v.push(f()?);
    }
    Ok(median(v))
}

/// Times a measurement is taken again when its fit fails (a busy host can make 4 KiB take
/// longer than 32 MiB once).
const ATTEMPTS: usize = 3;

/// Measures `lane`'s GPU alone: copies of 4 KiB and of the lane's largest piece each way,
/// and the work kernel (whole and half) with no iterations and with enough to take
/// [`KERNEL_PROBE_S`]. A fit that fails is measured again, [`ATTEMPTS`] times in all.
pub fn measure(lane: &mut Lane) -> Result<Fits> {
    let mut last = None;
    for _ in 0..ATTEMPTS {
        match measure_once(lane) {
            Ok(f) => return Ok(f),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no calibration attempt")))
}

fn measure_once(lane: &mut Lane) -> Result<Fits> {
    let gpu = lane.gpu;
    let (small, big) = (4096u64, lane.piece());
    let up1 = median_of(|| timed(|| lane.upload(small)))?;
    let up2 = median_of(|| timed(|| lane.upload(big)))?;
    let d1 = median_of(|| timed(|| lane.download(small)))?;
    let d2 = median_of(|| timed(|| lane.download(big)))?;
    let upload = Linear::fit(&format!("copies to GPU {gpu}"), (small as f64, up1), (big as f64, up2))?;
    let download = Linear::fit(&format!("copies from GPU {gpu}"), (small as f64, d1), (big as f64, d2))?;
    let grid = lane.grid;
    let kernel = |iters: u32, blocks: u32| -> Result<f64> {
        median_of(|| {
            timed(|| {
                lane.launch(iters, 0, blocks, 0)?;
                lane.sync()
            })
        })
    };
    let fit = |blocks: u32, what: &str| -> Result<Linear> {
        let t0 = kernel(0, blocks)?;
        let mut iters: u32 = 1 << 12;
        let mut t = kernel(iters, blocks)?;
        while t < KERNEL_PROBE_S && iters < 1 << 30 {
            iters *= 4;
            t = kernel(iters, blocks)?;
        }
        Linear::fit(&format!("{what} on GPU {gpu}"), (0.0, t0), (f64::from(iters), t))
    };
    let whole = fit(grid, "the work kernel")?;
    let half = fit(first_half(grid), "half the work kernel")?;
    Ok(Fits { upload, download, whole, half })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_through_two_measurements_gives_back_the_work_for_a_time() {
        // 50 µs round trip, 20 GB/s.
        let f = Linear::fit("copy", (4096.0, 50e-6 + 4096.0 / 20e9), (32e6, 50e-6 + 32e6 / 20e9)).unwrap();
        assert!((f.fixed_s - 50e-6).abs() < 1e-12, "{f:?}");
        assert!((f.per_unit_s - 1.0 / 20e9).abs() < 1e-20);
        assert!((f.units_for(1e-3) - 19e6).abs() < 1.0, "1 ms moves 0.95 ms worth of bytes");
        assert_eq!(f.units_for(10e-6), 0.0, "a time below the round trip is no work");
        assert!((f.time(f.units_for(0.25)) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn a_measurement_that_does_not_grow_with_the_work_is_an_error_naming_it() {
        let e = Linear::fit("the kernel on GPU 1", (1.0, 0.002), (1e6, 0.002)).unwrap_err().to_string();
        assert!(e.contains("GPU 1") && e.contains("did not slow down"), "{e}");
        assert!(Linear::fit("x", (5.0, 1.0), (5.0, 2.0)).is_err());
        assert!(Linear::fit("x", (1.0, f64::NAN), (5.0, 2.0)).is_err());
    }

    #[test]
    fn the_slower_gpu_sets_both_parts_and_the_median_ignores_one_outlier() {
        let a = Linear { fixed_s: 1e-4, per_unit_s: 2e-9 };
        let b = Linear { fixed_s: 2e-4, per_unit_s: 1e-9 };
        assert_eq!(a.slower(b), Linear { fixed_s: 2e-4, per_unit_s: 2e-9 });
        assert_eq!(median(vec![3.0, 1.0, 100.0]), 3.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }

    #[test]
    fn a_copy_is_cut_into_pieces_that_add_up_to_the_target() {
        let fit = Linear { fixed_s: 50e-6, per_unit_s: 1.0 / 20e9 };
        // 1 ms in one piece on one GPU: 19 MB.
        let one = plan_copy(1e-3, 1, 64 << 20, 1, &fit);
        assert_eq!(one.pieces, 1);
        assert!((one.bytes as f64 - 19e6).abs() < 8.0, "{one:?}");
        // The same in multi mode: half as many bytes to each of two GPUs.
        let two = plan_copy(1e-3, 1, 64 << 20, 2, &fit);
        assert!((fit.time(two.bytes as f64) * 2.0 - 1e-3).abs() < 1e-9, "{two:?}");
        // Chunked into 4 sections: 4 pieces, each paying its round trip.
        let four = plan_copy(1e-3, 4, 64 << 20, 1, &fit);
        assert_eq!(four.pieces, 4);
        assert!((fit.time(four.bytes as f64) * 4.0 - 1e-3).abs() < 1e-9);
        // 100 ms is 2 GB: more pieces than asked, none above the largest piece.
        let big = plan_copy(0.1, 1, 64 << 20, 1, &fit);
        assert!(big.bytes <= 64 << 20 && big.pieces >= 30, "{big:?}");
        let total = f64::from(big.pieces) * fit.time(big.bytes as f64);
        assert!((total - 0.1).abs() < 1e-6, "{total}");
        assert_eq!(big.bytes % 4, 0);
        // Below the round trip: the smallest copy.
        assert_eq!(plan_copy(10e-6, 1, 64 << 20, 1, &fit).bytes, 4);
    }

    #[test]
    fn a_kernel_is_cut_into_sub_kernels_of_the_chunk_length() {
        // 30 µs launch + sync, 65 ns per iteration.
        let fit = Linear { fixed_s: 30e-6, per_unit_s: 65e-9 };
        let whole = plan_kernel(0.1, 1, &fit);
        assert_eq!(whole.launches, 1);
        assert!((fit.time(f64::from(whole.iters)) - 0.1).abs() < 1e-7, "{whole:?}");
        let n = sections(135.3, Some(8.5));
        assert_eq!(n, 16);
        let chunked = plan_kernel(0.1353, n, &fit);
        assert_eq!(chunked.launches, 16);
        assert!((fit.time(f64::from(chunked.iters)) * 16.0 - 0.1353).abs() < 1e-6);
        assert_eq!(sections(5.0, None), 1);
        assert_eq!(sections(5.0, Some(8.0)), 1, "a chunk longer than the subtask is the subtask");
        assert_eq!(sections(1.0, Some(1.0)), 1);
    }
}

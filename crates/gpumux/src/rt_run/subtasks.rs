//! A task's subtasks as work: what each does (planned once, after calibration) and how one
//! job runs it.
//!
//! * `cpu`: busy work on the host until `fill · C` has passed (a wall-clock spin: the host
//!   has a core per task, so it takes its time whatever else runs); in multi mode the first
//!   CPU subtask after a download merges the two GPUs' outputs first (GPU-SPARC's host merge,
//!   the "+ merge" of its CPU times), in its time.
//! * `pci`: copies through gpumuxd, sized by the calibration to take `fill · C`; a PCI
//!   subtask is a download when a kernel ran since the last one, else an upload. Multi mode
//!   copies inputs to both GPUs and reads both GPUs' outputs, in a row, on the one bus.
//! * `gpu`: the work kernel, `fill · C` long, on one GPU (single mode) or half its blocks on
//!   each of two (multi mode).
//!
//! A PCI or GPU subtask holds its resource from the arbiter for all of it, or, when it
//! declares a `chunk`, for one piece (copy, sub-kernel) at a time, as the analysis assumes.

use anyhow::{bail, Result};
use gpumux_rt::{Mode, Resource, Task};
use std::time::{Duration, Instant};

use super::arbiter::{Arbiter, Held, Want};
use super::calibrate::{plan_copy, plan_kernel, sections, CopyPlan, Fits, KernelPlan};
use super::lanes::{first_half, Lane, MAX_PIECE};

/// GPUs a multi-mode kernel runs on (the paper's two).
pub const MULTI_GPUS: usize = 2;

/// What one subtask does.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Work {
    /// Host work for this long, seconds.
    Cpu { seconds: f64 },
    /// Host-to-device copies.
    Upload { copy: CopyPlan },
    /// Device-to-host copies.
    Download { copy: CopyPlan },
    /// Work kernels.
    Gpu { kernel: KernelPlan },
}

/// A subtask planned: its work, its stated time and whether it is taken piece by piece.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Step {
    /// What it does.
    pub work: Work,
    /// `C` in its mode, seconds.
    pub stated_s: f64,
    /// Whether the resource is taken again for each piece (the subtask has a `chunk`).
    pub chunked: bool,
}

/// Plans every subtask of `task` in `mode`; the file's times are `unit_s` seconds each.
pub fn plan(task: &Task, mode: Mode, fits: &Fits, fill: f64, unit_s: f64) -> Vec<Step> {
    let gpus = if mode == Mode::Multi { MULTI_GPUS as u32 } else { 1 };
    let mut kernel_since_download = false;
    task.subtasks
        .iter()
        .map(|s| {
            let stated_s = s.cost(mode) * unit_s;
            let target = stated_s * fill;
            let n = sections(s.cost(mode), s.chunk);
            let work = match s.resource {
                Resource::Cpu => Work::Cpu { seconds: target },
                Resource::Pci if kernel_since_download => {
                    kernel_since_download = false;
                    Work::Download { copy: plan_copy(target, n, MAX_PIECE, gpus, &fits.download) }
                }
                Resource::Pci => Work::Upload { copy: plan_copy(target, n, MAX_PIECE, gpus, &fits.upload) },
                Resource::Gpu => {
                    kernel_since_download = true;
                    let fit = if mode == Mode::Multi { &fits.half } else { &fits.whole };
                    Work::Gpu { kernel: plan_kernel(target, n, fit) }
                }
            };
            Step { work, stated_s, chunked: n > 1 }
        })
        .collect()
}

/// The largest copy of a plan, bytes (what a lane must hold).
pub fn largest_copy(steps: &[Step]) -> u64 {
    steps
        .iter()
        .map(|s| match s.work {
            Work::Upload { copy } | Work::Download { copy } => copy.bytes,
            _ => 4,
        })
        .max()
        .unwrap_or(4)
}

/// What a job of one task needs to run its steps.
pub struct Runner<'a> {
    /// The task's lanes, by GPU index.
    pub lanes: Vec<Lane>,
    /// The GPUs.
    pub gpus: &'a Arbiter,
    /// The PCI bus.
    pub bus: &'a Arbiter,
    /// 0 = highest priority.
    pub rank: usize,
    /// The task's mode.
    pub mode: Mode,
    /// Where single-mode inputs go, and the only GPU it may use when partitioned.
    pub home: usize,
    /// Single-mode kernels only on `home` (`--dispatch partitioned`).
    pub pinned: bool,
    /// Check kernels' outputs (a real GPU).
    pub check: bool,
    /// GPUs the last kernel ran on.
    last_gpus: Vec<usize>,
    /// The last download, for the host merge: bytes per GPU.
    pending_merge: Option<u64>,
    /// The stamp the last kernel wrote.
    stamp: u32,
    /// Blocks whose output was wrong (a real GPU only).
    pub wrong_blocks: u64,
    /// Kernels launched on each GPU (a multi-mode kernel counts on both).
    pub launches: Vec<u64>,
}

impl<'a> Runner<'a> {
    /// A runner for one task.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lanes: Vec<Lane>,
        gpus: &'a Arbiter,
        bus: &'a Arbiter,
        rank: usize,
        mode: Mode,
        home: usize,
        pinned: bool,
        check: bool,
    ) -> Runner<'a> {
        Runner {
            lanes,
            gpus,
            bus,
            rank,
            mode,
            home,
            pinned,
            check,
            last_gpus: vec![home],
            pending_merge: None,
            stamp: 0,
            wrong_blocks: 0,
            launches: Vec::new(),
        }
    }

    /// The GPUs copies of the current job go to or come from: inputs to the first two GPUs
    /// (multi mode) or the home GPU, outputs from the GPUs the last kernel ran on (a download
    /// follows a kernel), which [`Runner::merge`] reads.
    fn copy_gpus(&self, upload: bool) -> Vec<usize> {
        match self.mode {
            Mode::Multi if upload => (0..MULTI_GPUS).collect(),
            Mode::Single if upload => vec![self.home],
            Mode::Multi | Mode::Single => self.last_gpus.clone(),
        }
    }

    /// Runs one step of job `job`; returns how long it held its resource (CPU: ran).
    pub fn run(&mut self, step: &Step, job: u64) -> Result<Duration> {
        match step.work {
            Work::Cpu { seconds } => {
                let start = Instant::now();
                if let Some(bytes) = self.pending_merge.take() {
                    self.merge(bytes);
                }
                spin_until(start + Duration::from_secs_f64(seconds));
                Ok(start.elapsed())
            }
            Work::Upload { copy } => {
                let gpus = self.copy_gpus(true);
                self.copies(copy, step.chunked, &gpus, true)
            }
            Work::Download { copy } => {
                let gpus = self.copy_gpus(false);
                let held = self.copies(copy, step.chunked, &gpus, false)?;
                self.pending_merge = Some(copy.bytes);
                Ok(held)
            }
            Work::Gpu { kernel } => self.kernels(kernel, step.chunked, job),
        }
    }

    /// Ends a job: a download not followed by a CPU subtask is merged now.
    pub fn finish_job(&mut self) {
        if let Some(bytes) = self.pending_merge.take() {
            self.merge(bytes);
        }
    }

    fn copies(&mut self, copy: CopyPlan, chunked: bool, gpus: &[usize], upload: bool) -> Result<Duration> {
        let bus = self.bus;
        let mut held = Duration::ZERO;
        let mut grant: Option<Held<'_>> = None;
        for _ in 0..copy.pieces {
            if grant.is_none() {
                grant = Some(bus.hold(self.rank, Want::Any(1)));
            }
            for &g in gpus {
                let lane = self.lane(g)?;
                if upload {
                    lane.upload(copy.bytes)?;
                } else {
                    lane.download(copy.bytes)?;
                }
            }
            if chunked {
                if let Some(g) = grant.take() {
                    held += g.release();
                }
            }
        }
        if let Some(g) = grant.take() {
            held += g.release();
        }
        Ok(held)
    }

    fn lane(&mut self, gpu: usize) -> Result<&mut Lane> {
        let n = self.lanes.len();
        match self.lanes.get_mut(gpu) {
            Some(l) => Ok(l),
            None => bail!("no lane to GPU {gpu}: this task has lanes to {n} GPUs"),
        }
    }

    fn kernels(&mut self, plan: KernelPlan, chunked: bool, job: u64) -> Result<Duration> {
        let want = match (self.mode, self.pinned) {
            (Mode::Multi, _) => Want::Any(MULTI_GPUS),
            (Mode::Single, true) => Want::Unit(self.home),
            (Mode::Single, false) => Want::Any(1),
        };
        // A different stamp for every job and subtask, so a stale output is caught.
        self.stamp = (job as u32).wrapping_mul(1 << 16).wrapping_add(self.stamp & 0xffff).wrapping_add(1);
        let stamp = self.stamp;
        let arbiter = self.gpus;
        let mut held = Duration::ZERO;
        let mut grant: Option<Held<'_>> = None;
        for _ in 0..plan.launches {
            if grant.is_none() {
                grant = Some(arbiter.hold(self.rank, want));
            }
            let gpus = grant.as_ref().map(|g| g.units.clone()).unwrap_or_default();
            match gpus.as_slice() {
                [g] => {
                    let lane = self.lane(*g)?;
                    lane.launch(plan.iters, 0, lane.grid, stamp)?;
                    lane.sync()?;
                }
                [g0, g1, ..] => {
                    let grid = self.lane(*g0)?.grid;
                    let half = first_half(grid);
                    self.lane(*g0)?.launch(plan.iters, 0, half, stamp)?;
                    self.lane(*g1)?.launch(plan.iters, half, grid - half, stamp)?;
                    self.lane(*g0)?.sync()?;
                    self.lane(*g1)?.sync()?;
                }
                [] => bail!("the GPU arbiter granted no GPU"),
            }
            for &g in &gpus {
                if self.launches.len() <= g {
                    self.launches.resize(g + 1, 0);
                }
                self.launches[g] += 1;
            }
            self.last_gpus = gpus;
            if chunked {
                if let Some(g) = grant.take() {
                    held += g.release();
                }
            }
        }
        if let Some(g) = grant.take() {
            held += g.release();
        }
        Ok(held)
    }

    /// The host merge: block b's word comes from the GPU that ran it (the first GPU of the
    /// last kernel ran blocks [0, G/2), the second the rest); on a real GPU each is checked
    /// against the stamp of the last kernel.
    fn merge(&mut self, bytes: u64) {
        let Some(&first) = self.last_gpus.first() else { return };
        let grid = self.lanes.get(first).map_or(0, |l| l.grid);
        let split = if self.last_gpus.len() > 1 { first_half(grid) } else { grid };
        let mut wrong = 0u64;
        let mut merged = Vec::with_capacity(grid as usize);
        for b in 0..grid {
            let from = if b < split { first } else { self.last_gpus.get(1).copied().unwrap_or(first) };
            match self.lanes.get(from).and_then(|l| l.downloaded_word(b as usize, bytes)) {
                Some(w) => merged.push(w),
                None => break,
            }
        }
        if self.check {
            for (b, w) in merged.iter().enumerate() {
                if *w != self.stamp.wrapping_add(b as u32) {
                    wrong += 1;
                }
            }
        }
        self.wrong_blocks += wrong;
    }
}

/// Busy work on this thread until `until` (a wall-clock spin).
pub fn spin_until(until: Instant) {
    let mut x = 0u64;
    while Instant::now() < until {
        for _ in 0..64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    std::hint::black_box(x);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_are_downloaded_from_the_gpus_the_last_kernel_ran_on() {
        // A multi-mode kernel granted GPUs 2 and 3 of four: `merge` reads those lanes, so the
        // download must fill them, not GPUs 0 and 1.
        let (gpus, bus) = (Arbiter::new(4), Arbiter::new(1));
        let mut r = Runner::new(Vec::new(), &gpus, &bus, 0, Mode::Multi, 0, false, false);
        r.last_gpus = vec![2, 3];
        assert_eq!(r.copy_gpus(true), vec![0, 1]);
        assert_eq!(r.copy_gpus(false), vec![2, 3]);
        let mut s = Runner::new(Vec::new(), &gpus, &bus, 0, Mode::Single, 1, false, false);
        s.last_gpus = vec![3];
        assert_eq!((s.copy_gpus(true), s.copy_gpus(false)), (vec![1], vec![3]));
    }
}

//! Runs a suite [`Workload`] on the GPU: natively, or through preemptible
//! workers, optionally under a storm of random retreats and SM-set changes.

use crate::error::{CudaError, Result};
use crate::launch_plan::Chunk;
use crate::preempt::{SmMask, WorkerLaunch};
use crate::runtime::{DeviceBuffer, Function, Gpu, Params, Stream};
use crate::suite::{Arg, HostData, Init, Rng, Workload};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A workload with its buffers allocated and its kernels loaded both ways.
pub struct Prepared {
    /// What runs: buffers and launches.
    pub workload: Workload,
    /// The workload's buffers on the GPU, in its order.
    pub buffers: Vec<DeviceBuffer>,
    native: HashMap<&'static str, Function>,
    worker: HashMap<&'static str, Function>,
}

/// Counters of a chaotic run.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct ChaosStats {
    /// Worker launches started (first starts and resumes).
    pub starts: u64,
    /// Retreats asked for.
    pub retreats: u64,
    /// Retreats that stopped a launch before it had finished.
    pub effective_retreats: u64,
}

impl Prepared {
    /// Compiles the workload's app both as written and transformed (cached),
    /// loads its kernels and allocates its buffers (not yet initialised: [`Prepared::reset`]).
    pub fn new(gpu: &Gpu, workload: Workload) -> Result<Prepared> {
        let (native_m, worker_m, _) = gpu.native_and_worker(workload.app.name(), workload.app.source())?;
        let mut native = HashMap::new();
        let mut worker = HashMap::new();
        for l in &workload.launches {
            if !native.contains_key(l.kernel) {
                native.insert(l.kernel, native_m.function(l.kernel)?);
                worker.insert(l.kernel, worker_m.function(l.kernel)?);
            }
        }
        let buffers =
            workload.buffers.iter().map(|b| DeviceBuffer::new(b.init.byte_len())).collect::<Result<Vec<_>>>()?;
        Ok(Prepared { workload, buffers, native, worker })
    }

    /// The measured block times of the workload's transformed kernels.
    pub fn worker_profiles(&self) -> std::sync::Arc<crate::launch_plan::ProfileCache> {
        self.worker.values().next().map(|f| f.profiles.clone()).unwrap_or_default()
    }

    /// Puts every buffer in its initial state: inputs uploaded, outputs poisoned.
    pub fn reset(&self) -> Result<()> {
        for (spec, buf) in self.workload.buffers.iter().zip(&self.buffers) {
            match &spec.init {
                Init::Data(d) => buf.upload(&d.to_bytes())?,
                Init::Poison { .. } => buf.fill(0xFF)?,
                Init::Zero { .. } => buf.fill(0)?,
            }
        }
        Ok(())
    }

    fn arg_bytes(&self, args: &[Arg]) -> Result<Vec<Vec<u8>>> {
        args.iter()
            .map(|a| {
                Ok(match a {
                    Arg::Buf(i) => self
                        .buffers
                        .get(*i)
                        .ok_or_else(|| CudaError::Invalid(format!("no buffer {i}")))?
                        .ptr
                        .to_le_bytes()
                        .to_vec(),
                    Arg::U32(v) => v.to_le_bytes().to_vec(),
                    Arg::I32(v) => v.to_le_bytes().to_vec(),
                    Arg::F32(v) => v.to_le_bytes().to_vec(),
                    Arg::U64(v) => v.to_le_bytes().to_vec(),
                })
            })
            .collect()
    }

    /// Enqueues the native launches on `stream`.
    pub fn enqueue_native(&self, stream: &Stream) -> Result<()> {
        for l in &self.workload.launches {
            let f = &self.native[l.kernel];
            let mut p = Params::default();
            for a in &l.args {
                p.arg(a, &self.buffers)?;
            }
            // SAFETY: the suite's argument lists match its kernels.
            unsafe { f.launch(l.grid, l.block, l.shared_bytes, stream, &mut p)? };
        }
        Ok(())
    }

    /// Enqueues the native launches with `mark` recorded after each one, as a
    /// worker launch records its completion event: sizes that cost apart from
    /// the transformation's.
    pub fn enqueue_native_marked(&self, stream: &Stream, mark: &crate::runtime::Event) -> Result<()> {
        for l in &self.workload.launches {
            let f = &self.native[l.kernel];
            let mut p = Params::default();
            for a in &l.args {
                p.arg(a, &self.buffers)?;
            }
            // SAFETY: the suite's argument lists match its kernels.
            unsafe { f.launch(l.grid, l.block, l.shared_bytes, stream, &mut p)? };
            mark.record(stream)?;
        }
        Ok(())
    }

    /// One preemptible launch per launch of the workload, each with the
    /// kernel's native build beside it (used by [`Chunk::Auto`] for short launches).
    pub fn worker_launches(&self, gpu: &Gpu, chunk: impl Into<Chunk> + Copy) -> Result<Vec<WorkerLaunch>> {
        self.workload
            .launches
            .iter()
            .map(|l| {
                Ok(WorkerLaunch::new(
                    self.worker[l.kernel].clone(),
                    self.arg_bytes(&l.args)?,
                    l.grid,
                    l.block,
                    l.shared_bytes,
                    chunk,
                    gpu.sm_count(),
                )?
                .with_native(self.native[l.kernel].clone()))
            })
            .collect()
    }

    /// Enqueues all worker launches back to back on every SM (no preemption).
    pub fn enqueue_workers(&self, launches: &mut [WorkerLaunch], stream: &Stream, sms: SmMask) -> Result<()> {
        for w in launches.iter_mut() {
            w.rewind()?;
            w.start(stream, sms)?;
        }
        Ok(())
    }

    /// Waits for enqueued worker launches and checks that each ran to the end.
    pub fn finish_workers(&self, launches: &mut [WorkerLaunch]) -> Result<()> {
        for w in launches.iter_mut() {
            let o = w.finish()?;
            if !o.done() {
                return Err(CudaError::Check(format!("a launch stopped at {} of {} without a retreat", o.next, o.end)));
            }
        }
        Ok(())
    }

    /// Runs the workers launch by launch, each started on random SM sets and
    /// retreated after random delays until it is done.
    pub fn run_chaotic(
        &self,
        gpu: &Gpu,
        chunk: u32,
        rng: &mut Rng,
        stream: &Stream,
        ctl: &Stream,
    ) -> Result<ChaosStats> {
        let n = gpu.sm_count();
        let mut st = ChaosStats::default();
        let mut launches = self.worker_launches(gpu, chunk)?;
        for w in launches.iter_mut() {
            let mut rounds = 0;
            while !w.done() {
                let mask = random_mask(rng, n);
                w.start(stream, mask)?;
                st.starts += 1;
                rounds += 1;
                // After 40 rounds let it finish, so a run always ends.
                if rounds < 40 {
                    // Suite launches at check size take tens of microseconds:
                    // most requests must land while they run.
                    let delay = match rng.below(4) {
                        0 => 0,
                        1 => rng.below(10),
                        2 => rng.below(40),
                        _ => rng.below(200),
                    };
                    spin_for(Duration::from_micros(delay));
                    w.retreat(ctl)?;
                    st.retreats += 1;
                }
                let before = w.next;
                let o = w.finish()?;
                if !o.done() && o.next >= before {
                    st.effective_retreats += 1;
                }
            }
        }
        Ok(st)
    }

    /// The outputs named by the workload, read back.
    pub fn outputs(&self) -> Result<Vec<HostData>> {
        self.workload
            .outputs
            .iter()
            .map(|o| {
                let like = match &self.workload.buffers[o.buffer].init {
                    Init::Data(d) => d.clone(),
                    _ => match self.workload.app {
                        crate::suite::App::Histogram => HostData::U32(Vec::new()),
                        _ => HostData::F32(Vec::new()),
                    },
                };
                Ok(like.like_from_bytes(&self.buffers[o.buffer].download()?))
            })
            .collect()
    }
}

/// A random SM set: a contiguous range, a random subset, or everything.
pub fn random_mask(rng: &mut Rng, n: u32) -> SmMask {
    match rng.below(3) {
        0 => {
            let lo = rng.below(n as u64) as u32;
            let hi = lo + 1 + rng.below((n - lo) as u64) as u32;
            SmMask::range(lo, hi)
        }
        1 => {
            let mut m = SmMask::empty();
            for s in 0..n {
                if rng.below(2) == 0 {
                    m.insert(s);
                }
            }
            if m.count() == 0 {
                m.insert(rng.below(n as u64) as u32);
            }
            m
        }
        _ => SmMask::range(0, n),
    }
}

/// Busy-waits: sleeping would add scheduler jitter of tens of microseconds.
pub fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

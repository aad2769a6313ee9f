//! A suite kernel's launch as a split launch: its buffers on every GPU of
//! the split, reset to the workload's initial contents, its arguments with
//! roles from the source analysis, and its outputs read back. For the GPU
//! tests and `gpumux-cuda-check split`.

use super::merge::{Merge, Role};
use super::run::{SplitArg, SplitBuffer, SplitGpus, SplitKernel};
use super::{SplitError, Splittable};
use crate::suite::{Arg, BufferSpec, Init, LaunchSpec, Workload};

/// One launch of a suite workload (or of any kernel described the same
/// way), ready to run split or on one GPU.
pub struct SuiteLaunch<'g> {
    gpus: &'g SplitGpus,
    /// The buffers and their initial contents.
    pub buffers: Vec<BufferSpec>,
    /// The launch.
    pub launch: LaunchSpec,
    /// The kernel, analysed and loaded on every GPU.
    pub kernel: SplitKernel,
    bufs: Vec<SplitBuffer>,
}

impl<'g> SuiteLaunch<'g> {
    /// Launch `index` of `workload` (its inputs must be the workload's
    /// initial contents: a first launch), its kernel analysed per `mode`
    /// (a refusal is [`SplitError::Refused`]).
    pub fn new(gpus: &'g SplitGpus, workload: Workload, index: usize, mode: Splittable) -> Result<Self, SplitError> {
        let launch = workload.launches.get(index).cloned().ok_or_else(|| {
            SplitError::Invalid(format!(
                "{} has {} launches, not {}",
                workload.app.name(),
                workload.launches.len(),
                index + 1
            ))
        })?;
        Self::from_parts(gpus, workload.app.source(), workload.buffers, launch, mode)
    }

    /// A launch of kernel `launch.kernel` of `src` on `buffers` (any
    /// kernel, described as a suite workload's are).
    pub fn from_parts(
        gpus: &'g SplitGpus,
        src: &str,
        buffers: Vec<BufferSpec>,
        launch: LaunchSpec,
        mode: Splittable,
    ) -> Result<Self, SplitError> {
        let kernel = gpus.kernel(src, launch.kernel, mode)?;
        let bufs = buffers.iter().map(|b| gpus.buffer(b.init.byte_len())).collect::<Result<Vec<_>, _>>()?;
        let me = SuiteLaunch { gpus, buffers, launch, kernel, bufs };
        me.reset()?;
        Ok(me)
    }

    /// Sets every buffer's home copy to its initial contents (outputs poisoned).
    pub fn reset(&self) -> Result<(), SplitError> {
        self.gpus.bind_home()?;
        for (spec, buf) in self.buffers.iter().zip(&self.bufs) {
            let home = buf.home()?;
            match &spec.init {
                Init::Data(d) => home.upload(&d.to_bytes())?,
                Init::Poison { .. } => home.fill(0xFF)?,
                Init::Zero { .. } => home.fill(0)?,
            }
        }
        Ok(())
    }

    /// Sets the outputs' home copies ([`SuiteLaunch::outputs`]) to their
    /// initial contents, leaving the inputs as they are (the kernel does not
    /// change them): between runs of the same launch.
    pub fn reset_outputs(&self) -> Result<(), SplitError> {
        self.gpus.bind_home()?;
        for b in self.outputs() {
            let home = self.bufs[b].home()?;
            match &self.buffers[b].init {
                Init::Data(d) => home.upload(&d.to_bytes())?,
                Init::Poison { .. } => home.fill(0xFF)?,
                Init::Zero { .. } => home.fill(0)?,
            }
        }
        Ok(())
    }

    /// The launch's arguments: a buffer the kernel stores into is an output
    /// merged by `merge(buffer index)`, any other an input.
    pub fn args(&self, merge: &dyn Fn(usize) -> Merge) -> Result<Vec<SplitArg<'_>>, SplitError> {
        self.launch
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| {
                Ok(match *a {
                    Arg::Buf(b) => {
                        let buf = self.bufs.get(b).ok_or_else(|| SplitError::Invalid(format!("no buffer {b}")))?;
                        let written = self.kernel.analysis.params.get(i).is_some_and(|p| p.written);
                        let role = if written { Role::Out } else { Role::In };
                        SplitArg::Buffer { buf, role, merge: merge(b) }
                    }
                    Arg::U32(v) => SplitArg::Value(v.to_le_bytes().to_vec()),
                    Arg::I32(v) => SplitArg::Value(v.to_le_bytes().to_vec()),
                    Arg::F32(v) => SplitArg::Value(v.to_le_bytes().to_vec()),
                    Arg::U64(v) => SplitArg::Value(v.to_le_bytes().to_vec()),
                })
            })
            .collect()
    }

    /// The workload buffers the kernel stores into, by index.
    pub fn outputs(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .launch
            .args
            .iter()
            .zip(&self.kernel.analysis.params)
            .filter_map(|(a, p)| match a {
                Arg::Buf(b) if p.written => Some(*b),
                _ => None,
            })
            .collect();
        out.dedup();
        out
    }

    /// The home copies of [`SuiteLaunch::outputs`], as bytes.
    pub fn read_outputs(&self) -> Result<Vec<Vec<u8>>, SplitError> {
        self.gpus.bind_home()?;
        self.outputs().iter().map(|&b| Ok(self.bufs[b].home()?.download()?)).collect()
    }

    /// Runs the native kernel on the home GPU (after a reset), ms.
    pub fn run_native(&self) -> Result<f64, SplitError> {
        let args = self.args(&|_| Merge::Shadow)?;
        let l = &self.launch;
        self.gpus.run_native(&self.kernel, l.grid, l.block, l.shared_bytes, &args)
    }
}

//! The multi-GPU cost model: how a task's times on two GPUs follow from its
//! times on one (GPU-SPARC, Section III-C). Part of the task model: files that
//! omit `multi` and the generator both derive `C^M` with it.

use crate::model::{Resource, Task};

/// How multi-GPU (two-GPU) times follow from single-GPU times, after the paper's III-C.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct MultiCostModel {
    /// Kernel time factor on two GPUs (Fig. 4(b): a sub-kernel takes half the time).
    pub kernel: f64,
    /// Copy-time factor without inter-kernel dependency (Fig. 4(a),(c): about twice).
    pub copy: f64,
    /// Upload factor with inter-kernel dependency (Pagerank, III-C: 4.7×).
    pub dep_upload: f64,
    /// Download factor with inter-kernel dependency (Pagerank, III-C: 11.7×).
    pub dep_download: f64,
    /// Output merge on the CPU, as a multiple of the single-mode download time (III-C:
    /// "similar to that of buffer read"). Added to the CPU subtask after the download.
    pub merge: f64,
}

impl Default for MultiCostModel {
    fn default() -> Self {
        MultiCostModel { kernel: 0.5, copy: 2.0, dep_upload: 4.7, dep_download: 11.7, merge: 1.0 }
    }
}

impl MultiCostModel {
    /// Sets `C^M` of every subtask of `task` from its `C^S`.
    ///
    /// A PCI subtask is a *download* when the closest earlier non-PCI subtask is a GPU
    /// kernel, an *upload* otherwise. The merge of a download is charged to the next CPU
    /// subtask; if no CPU subtask follows, to the download itself.
    pub fn apply(&self, task: &mut Task) {
        let (up, down) =
            if task.data_dependency { (self.dep_upload, self.dep_download) } else { (self.copy, self.copy) };
        let mut last_compute: Option<Resource> = None;
        let mut pending_merge = 0.0;
        let mut last_download: Option<usize> = None;
        for s in task.subtasks.iter_mut() {
            match s.resource {
                Resource::Gpu => {
                    s.multi = s.single * self.kernel;
                    last_compute = Some(Resource::Gpu);
                }
                Resource::Pci => {
                    if last_compute == Some(Resource::Gpu) {
                        s.multi = s.single * down;
                        pending_merge += s.single * self.merge;
                    } else {
                        s.multi = s.single * up;
                    }
                }
                Resource::Cpu => {
                    s.multi = s.single + pending_merge;
                    pending_merge = 0.0;
                    last_compute = Some(Resource::Cpu);
                }
            }
        }
        if pending_merge > 0.0 {
            for (j, s) in task.subtasks.iter().enumerate() {
                if s.resource == Resource::Pci {
                    last_download = Some(j);
                }
            }
            if let Some(j) = last_download {
                task.subtasks[j].multi += pending_merge;
            }
        }
    }
}

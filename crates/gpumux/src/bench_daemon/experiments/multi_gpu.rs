//! `--only multi-gpu`: issue 38's third goal, four clients on two GPUs
//! under the default placement against the same four on one GPU
//! (docs/multi-gpu.md, "The STP goal").
//!
//! The clients are the co-run loops (triad, FMA chains, SGEMM, histogram),
//! one process each, each calibrated to run `--corun-seconds` alone and
//! each of which keeps a whole GPU busy: clients that leave a GPU mostly
//! idle (the example clients) already overlap well on one GPU, so no
//! placement can double their STP, and the goal would measure them, not the
//! placement. The reference of each client's NTT is its loop alone natively
//! (on a simulated device, alone through a daemon of one simulated GPU).
//! Both shared runs go through the bench's default policy, one daemon
//! serving the first GPU of `--device`, one serving all of them; where each
//! client went comes from the daemon's log (`connected on GPU N`).

use super::super::jobs::LoopKernel;
use super::super::procs::ProcPlan;
use super::super::report::{stp_fairness, table};
use super::{loops, Bench, DaemonConfig};
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;

/// The four clients, one of each co-run loop.
pub const CLIENTS: [LoopKernel; 4] = [LoopKernel::Triad, LoopKernel::Fma, LoopKernel::Sgemm, LoopKernel::Histogram];

/// The goal: STP on two GPUs at least this many times STP on one.
pub const GOAL: f64 = 1.9;

/// One client's row.
#[derive(Clone, Debug, Serialize)]
pub struct MultiGpuRow {
    pub kernel: String,
    /// Its loop alone (the reference), ms.
    pub alone_ms: f64,
    /// With the other three, through the one-GPU daemon, ms.
    pub one_gpu_ms: f64,
    /// With the other three, through the daemon of every GPU, ms.
    pub all_gpus_ms: f64,
    /// The GPU the daemon of every GPU placed it on (from its log).
    pub gpu: Option<u32>,
    /// Both shared runs' outputs equal the alone run's, bitwise.
    pub outputs_equal: bool,
}

/// The experiment's figures.
#[derive(Clone, Debug, Serialize)]
pub struct MultiGpuReport {
    /// The one-GPU daemon's device, and the daemon of every GPU's.
    pub one_device: String,
    pub all_device: String,
    /// GPUs the second daemon serves.
    pub gpus: usize,
    /// What the alone times are (native, or through a one-GPU daemon).
    pub reference: String,
    pub rows: Vec<MultiGpuRow>,
    pub stp_one: f64,
    pub stp_all: f64,
    /// `stp_all / stp_one`, against [`GOAL`].
    pub ratio: f64,
    pub goal: f64,
    pub met: bool,
}

impl MultiGpuReport {
    /// The report from each client's (elapsed ns, checksum) alone, on one
    /// GPU and on all of them, in [`CLIENTS`] order, and their placement.
    #[allow(clippy::too_many_arguments)]
    pub fn of(
        one_device: &str,
        all_device: &str,
        gpus: usize,
        reference: &str,
        alone: &[(u64, u64)],
        one: &[(u64, u64)],
        all: &[(u64, u64)],
        placed: &[Option<u32>],
    ) -> MultiGpuReport {
        let ms = |ns: u64| ns as f64 / 1e6;
        let ntt = |shared: &[(u64, u64)]| -> Vec<f64> {
            shared.iter().zip(alone).map(|(s, a)| if a.0 > 0 { s.0 as f64 / a.0 as f64 } else { f64::NAN }).collect()
        };
        let (stp_one, _) = stp_fairness(&ntt(one));
        let (stp_all, _) = stp_fairness(&ntt(all));
        let rows = CLIENTS
            .iter()
            .enumerate()
            .map(|(i, k)| MultiGpuRow {
                kernel: k.name().into(),
                alone_ms: ms(alone[i].0),
                one_gpu_ms: ms(one[i].0),
                all_gpus_ms: ms(all[i].0),
                gpu: placed.get(i).copied().flatten(),
                outputs_equal: one[i].1 == alone[i].1 && all[i].1 == alone[i].1,
            })
            .collect();
        let ratio = if stp_one > 0.0 { stp_all / stp_one } else { f64::NAN };
        MultiGpuReport {
            one_device: one_device.into(),
            all_device: all_device.into(),
            gpus,
            reference: reference.into(),
            rows,
            stp_one,
            stp_all,
            ratio,
            goal: GOAL,
            met: ratio >= GOAL,
        }
    }

    /// The clients' table and the goal's.
    pub fn render(&self) -> String {
        let mut out = format!(
            "\nFour GPU-filling clients on {} GPUs ({}) against the same on one ({}); alone: {}\n",
            self.gpus, self.all_device, self.one_device, self.reference
        );
        let mut rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.kernel.clone(),
                    format!("{:.0}", r.alone_ms),
                    format!("{:.0}", r.one_gpu_ms),
                    format!("{:.0}", r.all_gpus_ms),
                    r.gpu.map_or("-".into(), |g| g.to_string()),
                    if r.outputs_equal { "yes" } else { "NO" }.into(),
                ]
            })
            .collect();
        rows.push(vec![
            "STP".into(),
            String::new(),
            format!("{:.2}", self.stp_one),
            format!("{:.2}", self.stp_all),
            String::new(),
            String::new(),
        ]);
        out += &table(
            &["client", "alone, ms", "4 on 1 GPU, ms", &format!("4 on {} GPUs, ms", self.gpus), "GPU", "outputs equal"],
            &rows,
        );
        out += "\n";
        out += &table(
            &["goal", "measured", "target", "met"],
            &[vec![
                format!("4 clients on {} GPUs, default placement: STP / STP on 1 GPU", self.gpus),
                format!("{:.2}x", self.ratio),
                format!(">= {:.1}x", self.goal),
                if self.met { "yes" } else { "NO" }.into(),
            ]],
        );
        out
    }
}

/// `client N `NAME` (pid P, uid U) connected on GPU G` lines of a daemon's
/// log: each named client's GPU (the last line of a name wins).
pub fn placements(log: &str) -> BTreeMap<String, u32> {
    let mut placed = BTreeMap::new();
    for line in log.lines() {
        let Some((head, gpu)) = line.rsplit_once(" connected on GPU ") else { continue };
        let Some(gpu) = gpu.trim().parse::<u32>().ok() else { continue };
        let mut ticks = head.rsplitn(3, '`');
        let (_, name) = (ticks.next(), ticks.next());
        if let Some(name) = name {
            placed.insert(name.to_owned(), gpu);
        }
    }
    placed
}

impl Bench {
    /// The experiment (module doc), given each client's launches and its
    /// (elapsed ns, checksum) alone, measured by the caller.
    pub(super) fn multi_gpu(
        &self,
        default: &DaemonConfig,
        launches: &BTreeMap<LoopKernel, u32>,
        alone: &BTreeMap<LoopKernel, (u64, u64)>,
    ) -> Result<MultiGpuReport> {
        let Some((all_device, gpus)) = self.many.clone() else {
            anyhow::bail!("the multi-gpu experiment needs a device of 2 GPUs or more (cuda:0,1, cuda:all, sim:h100x2)");
        };
        let plans: Vec<ProcPlan> =
            CLIENTS.iter().map(|&k| ProcPlan::daemon(vec![self.loop_job(k, launches)])).collect();
        let mut shared = Vec::new();
        let mut placed = Vec::new();
        for (device, tag) in [(self.device.clone(), " multi-gpu one"), (all_device.clone(), " multi-gpu all")] {
            let d = self.start_daemon_on(default, &device, tag)?;
            let log_path = d.log.clone();
            let env = self.env(Some(d.socket.clone()), &[]);
            let label = format!("multi-gpu: the four clients at once through gpumuxd on {device}");
            shared.push(loops(&self.setting(&label, &plans, &env, None)?)?);
            drop(d);
            let log = std::fs::read_to_string(&log_path).with_context(|| format!("reading {}", log_path.display()))?;
            // Role process i's one job is the client `bench-i-0` (role.rs names them).
            let by_name = placements(&log);
            placed = (0..CLIENTS.len()).map(|i| by_name.get(&format!("bench-{i}-0")).copied()).collect();
        }
        let alone: Vec<(u64, u64)> = CLIENTS.iter().map(|k| alone.get(k).copied().unwrap_or((0, 0))).collect();
        let reference = if self.ordinal.is_some() {
            "each natively, alone on the first GPU"
        } else {
            "each alone through a daemon of one simulated GPU"
        };
        Ok(MultiGpuReport::of(&self.device, &all_device, gpus, reference, &alone, &shared[0], &shared[1], &placed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_are_read_from_the_daemons_log_lines() {
        let log = "2026-11-28T10:00:00Z INFO gpumuxd::core::requests: client 2 `bench-probe` (pid 9, uid 0) connected on GPU 0\n\
                   INFO client 3 `bench-0-0` (pid 10, uid 1000) connected on GPU 1\n\
                   INFO client 4 `bench-1-0` (pid 11, uid 1000) connected on GPU 0\n\
                   INFO client 5 `solo` (pid 12, uid 1000) connected\n\
                   INFO client 6 `bench-2-0` (pid 13, uid 1000) connected on GPU x\n";
        let p = placements(log);
        assert_eq!(p.get("bench-0-0"), Some(&1));
        assert_eq!(p.get("bench-1-0"), Some(&0));
        assert_eq!(p.get("bench-probe"), Some(&0));
        assert!(!p.contains_key("solo") && !p.contains_key("bench-2-0"), "{p:?}");
    }

    #[test]
    fn stp_on_each_device_and_their_ratio_come_from_the_alone_times() {
        // Alone 1 s each; on one GPU each took 4 s (STP 1), on two 2 s (STP 2).
        let alone = [(1_000_000_000, 7); 4];
        let one = [(4_000_000_000, 7); 4];
        let mut all = [(2_000_000_000, 7); 4];
        let r = MultiGpuReport::of("cuda:0", "cuda:0,1", 2, "native", &alone, &one, &all, &[Some(0), Some(1)]);
        assert!((r.stp_one - 1.0).abs() < 1e-9 && (r.stp_all - 2.0).abs() < 1e-9, "{r:?}");
        assert!((r.ratio - 2.0).abs() < 1e-9 && r.met, "{r:?}");
        assert_eq!((r.rows[0].gpu, r.rows[2].gpu), (Some(0), None));
        assert!(r.rows.iter().all(|x| x.outputs_equal));
        let text = r.render();
        assert!(text.contains("2.00x") && text.contains(">= 1.9x"), "{text}");
        // A wrong output is shown, and a ratio under the goal is not met.
        all[1] = (3_000_000_000, 8);
        let r = MultiGpuReport::of("cuda:0", "cuda:0,1", 2, "native", &alone, &one, &all, &[]);
        assert!(!r.rows[1].outputs_equal && r.rows[0].outputs_equal);
        assert!(r.ratio < GOAL && !r.met, "{r:?}");
        assert!(r.render().contains("NO"));
    }
}

//! `gpumux bench sim`: how fast the simulator is, in simulated blocks per
//! second of wall time on one core, and how that scales with SMs, processes
//! and blocks. A run is one engine + simulator on one thread.

use anyhow::Result;
use gpumux_engine::driver::{self, NoHooks};
use gpumux_engine::{policies, Device, Replay};
use gpumux_sim::{presets, SimGpu};
use serde::Serialize;
use std::time::Instant;

#[derive(Debug, Serialize)]
pub struct SimBenchRow {
    pub sms: u16,
    pub processes: usize,
    pub blocks: u64,
    pub policy: String,
    pub wall_s: f64,
    pub events: u64,
    pub blocks_per_s: f64,
    pub events_per_s: f64,
}

pub fn measure(sms: u16, processes: usize, blocks: u64, policy: &str) -> Result<SimBenchRow> {
    let mut info = presets::h100();
    info.num_sms = sms;
    let w = gpumux_sim::synthetic::workload(processes, blocks);
    let mut engine = Replay::new(&w, info.clone(), policies::by_name(policy)?, None)?;
    let mut gpu = SimGpu::new(info, 1);
    // Through `dyn Device`, as `gpumux run` drives it.
    let device: &mut dyn Device = &mut gpu;
    let t0 = Instant::now();
    let out = driver::run(&mut engine, device, &mut NoHooks)?;
    let wall = t0.elapsed().as_secs_f64();
    Ok(SimBenchRow {
        sms,
        processes,
        blocks: out.stats.blocks_completed,
        policy: policy.to_string(),
        wall_s: wall,
        events: out.stats.events,
        blocks_per_s: out.stats.blocks_completed as f64 / wall,
        events_per_s: out.stats.events as f64 / wall,
    })
}

/// The sweep: SMs, processes and blocks varied one at a time around a base
/// point, then every policy at the base point.
pub fn sweep(quick: bool) -> Result<Vec<SimBenchRow>> {
    let base_blocks: u64 = if quick { 200_000 } else { 2_000_000 };
    let mut rows = Vec::new();
    for sms in [13u16, 66, 132, 256] {
        rows.push(measure(sms, 4, base_blocks, "fcfs")?);
    }
    for procs in [1usize, 2, 8, 16] {
        rows.push(measure(132, procs, base_blocks, "fcfs")?);
    }
    for blocks in [base_blocks / 10, base_blocks * 4] {
        rows.push(measure(132, 4, blocks, "fcfs")?);
    }
    for (p, _) in policies::CATALOGUE {
        rows.push(measure(132, 4, base_blocks, p)?);
    }
    Ok(rows)
}

pub fn render(rows: &[SimBenchRow]) -> String {
    let mut s = format!(
        "{:>5} {:>6} {:>10} {:<16} {:>8} {:>11} {:>13} {:>13}\n",
        "SMs", "procs", "blocks", "policy", "wall s", "events", "blocks/s", "events/s"
    );
    for r in rows {
        s += &format!(
            "{:>5} {:>6} {:>10} {:<16} {:>8.3} {:>11} {:>13.0} {:>13.0}\n",
            r.sms, r.processes, r.blocks, r.policy, r.wall_s, r.events, r.blocks_per_s, r.events_per_s
        );
    }
    s
}

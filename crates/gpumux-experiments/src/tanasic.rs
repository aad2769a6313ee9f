//! Tanasic et al., ISCA 2014, section 4: Figs. 5-8 on the simulated K20c with
//! the built-in Parboil workload (Table 1).

use crate::report::{bars, f2, lines, mean, Table};
use crate::sim::{self, parallel};
use crate::Ctx;
use anyhow::{anyhow, Context, Result};
use gpumux_engine::ids::ProcessId;
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::metrics::{self, PolicyMetrics};
use gpumux_engine::model::Workload;
use gpumux_engine::policies;
use gpumux_engine::record::RunRecord;
use gpumux_workload::{
    parboil_app, parboil_class1, parboil_class2, parboil_mix_apps, AppClass, BlockTime, PARBOIL_APPS,
};
use std::collections::HashMap;

/// Process counts of the paper's workloads.
const NS: [u32; 4] = [2, 4, 6, 8];
const CLASSES: [AppClass; 3] = [AppClass::Short, AppClass::Medium, AppClass::Long];

/// The paper's numbers, as printed in section 4 (only the ends of each
/// range, 2 and 8 processes, are given in the text).
pub mod paper {
    /// Fig. 5, improvement of the high-priority NTT, averaged over all apps.
    pub const NPQ_ALL: (f64, f64) = (1.1, 1.6); // "for 4 or more processes"; ~1.0 at 2
    pub const PPQ_CS_ALL: (f64, f64) = (2.0, 15.6);
    pub const PPQ_DRAIN_ALL: (f64, f64) = (1.6, 6.0);
    pub const PPQ_CS_SHORT: (f64, f64) = (5.1, 63.7);
    pub const PPQ_DRAIN_SHORT: (f64, f64) = (2.84, 16.2);
    pub const PPQ_CS_MEDIUM: (f64, f64) = (1.06, 4.6);
    pub const PPQ_DRAIN_MEDIUM: (f64, f64) = (1.33, 4.5);
    pub const PPQ_CS_LONG: (f64, f64) = (1.26, 1.76);
    pub const PPQ_DRAIN_LONG: (f64, f64) = (1.0, 1.54); // start not given
    /// Fig. 6a, STP overhead of exclusive PPQ over NPQ.
    pub const OVERHEAD_EXCL_CS: (f64, f64) = (1.08, 1.12);
    pub const OVERHEAD_EXCL_DRAIN: (f64, f64) = (1.09, 1.38);
    /// Fig. 7a, NTT improvement of DSS over FCFS by Class 2.
    pub const DSS_CS_SHORT: (f64, f64) = (2.45, 4.0);
    pub const DSS_DRAIN_SHORT: (f64, f64) = (2.2, 3.7);
    pub const DSS_CS_MEDIUM: (f64, f64) = (1.3, 1.7);
    pub const DSS_DRAIN_MEDIUM: (f64, f64) = (1.2, 1.4);
    pub const DSS_LONG: (f64, f64) = (0.9, 0.55);
    pub const DSS_CS_ALL: (f64, f64) = (1.5, 2.0);
    pub const DSS_DRAIN_ALL: (f64, f64) = (1.4, 1.65);
    /// Fig. 7b fairness improvement, Fig. 7c STP degradation.
    pub const DSS_CS_FAIRNESS: (f64, f64) = (1.1, 3.35);
    pub const DSS_DRAIN_FAIRNESS: (f64, f64) = (1.05, 2.7);
    pub const DSS_CS_STP_LOSS: (f64, f64) = (1.06, 1.34);
    pub const DSS_DRAIN_STP_LOSS: (f64, f64) = (1.08, 1.5);
}

fn range((a, b): (f64, f64)) -> String {
    format!("{a:.2}→{b:.2}")
}

/// One multiprogrammed workload: apps (base names) and the workload.
struct Mix {
    n: u32,
    apps: Vec<&'static str>,
    hp: Option<usize>,
    workload: Workload,
}

fn device() -> DeviceInfo {
    gpumux_sim::presets::k20c()
}

fn replay(ctx: &Ctx) -> u32 {
    // The paper replays until every app ran 3 times; --quick settles for one.
    if ctx.quick {
        1
    } else {
        3
    }
}

fn build_mix(n: u32, apps: Vec<&'static str>, hp: Option<usize>, replay: u32) -> Result<Mix> {
    let mut processes = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, a) in apps.iter().enumerate() {
        let k = seen.entry(a).or_default();
        *k += 1;
        let name = if *k == 1 { a.to_string() } else { format!("{a}#{k}") };
        let mut p = parboil_app(a, &name, BlockTime::Fit).ok_or_else(|| anyhow!("unknown Parboil app {a}"))?;
        if hp == Some(i) {
            p.priority = 1;
        }
        processes.push(p);
    }
    let label = format!("{}{}", apps.join("+"), hp.map(|i| format!(" hp={}", apps[i])).unwrap_or_default());
    Ok(Mix { n, apps, hp, workload: Workload { name: label, processes, replay_min_runs: Some(replay) } })
}

/// Fig. 5 workloads: each app in turn is the high-priority process (index 0),
/// with n-1 random others, so every app is prioritised equally often.
fn priority_mixes(ctx: &Ctx) -> Result<Vec<Mix>> {
    let hp_apps: Vec<&'static str> = if ctx.quick { vec!["spmv", "cutcp", "tpacf"] } else { PARBOIL_APPS.to_vec() };
    let reps = if ctx.quick { 1 } else { 2 };
    let mut out = Vec::new();
    for n in NS {
        for (ai, hp) in hp_apps.iter().enumerate() {
            for r in 0..reps {
                let seed = ctx.seed.wrapping_mul(7919).wrapping_add(1000 * n as u64 + 10 * ai as u64 + r);
                let mut apps = vec![*hp];
                apps.extend(parboil_mix_apps(n - 1, seed).into_iter().map(|(a, _)| a));
                out.push(build_mix(n, apps, Some(0), replay(ctx))?);
            }
        }
    }
    Ok(out)
}

/// Fig. 7-8 workloads: random mixes, nobody prioritised.
fn dss_mixes(ctx: &Ctx) -> Result<Vec<Mix>> {
    let per_n = if ctx.quick { 3 } else { 12 };
    let mut out = Vec::new();
    for n in NS {
        for s in 0..per_n {
            let seed = ctx.seed.wrapping_mul(104729).wrapping_add(100 * n as u64 + s);
            let apps = parboil_mix_apps(n, seed).into_iter().map(|(a, _)| a).collect();
            out.push(build_mix(n, apps, None, replay(ctx))?);
        }
    }
    Ok(out)
}

/// Runs every mix under every policy (plus each distinct app alone once) and
/// returns metrics[mix][policy].
fn run_all(ctx: &Ctx, label: &str, mixes: &[Mix], pols: &[&str]) -> Result<Vec<Vec<PolicyMetrics>>> {
    let info = device();
    let mut distinct: Vec<&'static str> = mixes.iter().flat_map(|m| m.apps.iter().copied()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let rep = replay(ctx);
    // An app alone does not depend on the mix it is in: run each once.
    let alone: Vec<RunRecord> = parallel(&format!("{label}: alone"), &distinct, ctx.threads, ctx.progress, |a| {
        let m = build_mix(1, vec![*a], None, rep)?;
        Ok(sim::simulate(&m.workload, &info, Box::new(policies::fcfs::Fcfs), None, ctx.seed, None)?.record)
    })?;
    let alone: HashMap<&str, RunRecord> = distinct.iter().copied().zip(alone).collect();
    let jobs: Vec<(usize, &str)> = (0..mixes.len()).flat_map(|i| pols.iter().map(move |p| (i, *p))).collect();
    let outs = parallel(label, &jobs, ctx.threads, ctx.progress, |(i, p)| {
        let m = &mixes[*i];
        let pol = policies::by_name(p)?;
        let out = sim::simulate(&m.workload, &info, pol, None, ctx.seed, None)?;
        let base: Vec<RunRecord> = m
            .apps
            .iter()
            .enumerate()
            .map(|(k, a)| {
                let mut r = alone[a].clone();
                r.processes[0].id = ProcessId(k as u32);
                r
            })
            .collect();
        metrics::compute(&out.record, &out.stats, info.num_sms, &base)
            .with_context(|| format!("{p} on {}", m.workload.name))
    })?;
    let mut it = outs.into_iter();
    Ok(mixes.iter().map(|_| pols.iter().filter_map(|_| it.next()).collect()).collect())
}

fn by_n<'a, T>(mixes: &'a [Mix], vals: &'a [T], n: u32) -> impl Iterator<Item = (&'a Mix, &'a T)> {
    mixes.iter().zip(vals).filter(move |(m, _)| m.n == n)
}

const PRIO_POLICIES: [&str; 6] = ["fcfs", "npq", "ppq-excl-cs", "ppq-excl-drain", "ppq-shared-cs", "ppq-shared-drain"];

pub fn priority(ctx: &Ctx) -> Result<String> {
    let mixes = priority_mixes(ctx)?;
    let res = run_all(ctx, "tanasic-priority", &mixes, &PRIO_POLICIES[..4])?;
    // Improvement of the high-priority process's NTT over its nonprioritised (FCFS) run.
    let improvement = |m: &Mix, r: &Vec<PolicyMetrics>, j: usize| -> f64 {
        let hp = m.hp.unwrap_or(0);
        r[0].processes[hp].ntt / r[j].processes[hp].ntt
    };
    let mut t = Table::new(&["policy / class", "n=2", "n=4", "n=6", "n=8", "paper 2→8"]);
    let mut plot_vals = Vec::new();
    let names = ["npq", "ppq-cs", "ppq-drain"];
    let papers: [[Option<(f64, f64)>; 4]; 3] = [
        [None, None, None, Some(paper::NPQ_ALL)],
        [Some(paper::PPQ_CS_SHORT), Some(paper::PPQ_CS_MEDIUM), Some(paper::PPQ_CS_LONG), Some(paper::PPQ_CS_ALL)],
        [
            Some(paper::PPQ_DRAIN_SHORT),
            Some(paper::PPQ_DRAIN_MEDIUM),
            Some(paper::PPQ_DRAIN_LONG),
            Some(paper::PPQ_DRAIN_ALL),
        ],
    ];
    for (pi, name) in names.iter().enumerate() {
        for (ci, class) in CLASSES.iter().map(Some).chain([None]).enumerate() {
            let mut cells = vec![format!("{name} {}", class.map_or("ALL".to_string(), |c| c.to_string()))];
            let mut row_vals = Vec::new();
            for n in NS {
                let v: Vec<f64> = by_n(&mixes, &res, n)
                    .filter(|(m, _)| class.is_none_or(|c| parboil_class1(m.apps[m.hp.unwrap_or(0)]) == Some(*c)))
                    .map(|(m, r)| improvement(m, r, pi + 1))
                    .collect();
                let a = mean(&v);
                row_vals.push(a.unwrap_or(f64::NAN));
                cells.push(f2(a));
            }
            cells.push(papers[pi][ci].map_or("-".into(), range));
            t.row(cells);
            if class.is_none() {
                plot_vals.push(row_vals);
            }
        }
    }
    let groups: Vec<String> = NS.iter().map(|n| format!("{n} processes")).collect();
    let transposed: Vec<Vec<f64>> = (0..NS.len()).map(|i| plot_vals.iter().map(|r| r[i]).collect()).collect();
    bars(
        &ctx.out.join("tanasic-priority.svg"),
        "Fig. 5: high-priority NTT improvement over FCFS (gpumux sim:k20c)",
        "NTT improvement (x)",
        &groups,
        &names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        &transposed,
    )?;
    let lat = preemption_latency(&res);
    Ok(format!(
        "Fig. 5: improvement of the high-priority process's NTT over its nonprioritised (FCFS) run,\n\
         mean over workloads, by Class 1 of the prioritised app ({} workloads)\n\n{}\n{lat}",
        mixes.len(),
        t.render()
    ))
}

/// Median preemption latency per mechanism: the reason context switch beats draining.
fn preemption_latency(res: &[Vec<PolicyMetrics>]) -> String {
    let mut out = String::from("preemption latency p50 / p99 (mean over workloads):\n");
    for j in [2usize, 3] {
        let ps: Vec<&PolicyMetrics> =
            res.iter().filter_map(|r| r.get(j)).filter(|m| m.preemption_latency.count > 0).collect();
        let p50 = mean(&ps.iter().map(|m| m.preemption_latency.p50_ns as f64 / 1e3).collect::<Vec<_>>());
        let p99 = mean(&ps.iter().map(|m| m.preemption_latency.p99_ns as f64 / 1e3).collect::<Vec<_>>());
        let name = res.first().and_then(|r| r.get(j)).map_or("?".into(), |m| m.policy.clone());
        // How much of the high-priority turnaround preemption could account for.
        let hp = mean(&ps.iter().filter_map(|m| m.high_priority_turnaround_ns).map(|t| t / 1e6).collect::<Vec<_>>());
        let count = mean(&ps.iter().map(|m| m.preemption_latency.count as f64).collect::<Vec<_>>());
        out.push_str(&format!(
            "  {name:<16} {} us / {} us; {} SM preemptions per workload; high-priority run {} ms\n",
            f2(p50),
            f2(p99),
            f2(count),
            f2(hp)
        ));
    }
    out
}

pub fn overhead(ctx: &Ctx) -> Result<String> {
    let mixes = priority_mixes(ctx)?;
    let pols = ["npq", "ppq-excl-cs", "ppq-excl-drain", "ppq-shared-cs", "ppq-shared-drain"];
    let res = run_all(ctx, "tanasic-overhead", &mixes, &pols)?;
    let mut t = Table::new(&["STP overhead vs NPQ", "n=2", "n=4", "n=6", "n=8", "paper 2→8"]);
    let paper_vals = [Some(paper::OVERHEAD_EXCL_CS), Some(paper::OVERHEAD_EXCL_DRAIN), None, None];
    let mut plot = vec![vec![f64::NAN; 4]; NS.len()];
    for j in 1..pols.len() {
        let mut cells = vec![pols[j].to_string()];
        for (ni, n) in NS.iter().enumerate() {
            let v: Vec<f64> = by_n(&mixes, &res, *n).map(|(_, r)| r[0].stp / r[j].stp).collect();
            let a = mean(&v);
            plot[ni][j - 1] = a.unwrap_or(f64::NAN);
            cells.push(f2(a));
        }
        cells.push(paper_vals[j - 1].map_or("(higher than excl.)".into(), range));
        t.row(cells);
    }
    let mut u = Table::new(&["mean STP", "n=2", "n=4", "n=6", "n=8"]);
    for (j, p) in pols.iter().enumerate() {
        let mut cells = vec![p.to_string()];
        for n in NS {
            cells.push(f2(mean(&by_n(&mixes, &res, n).map(|(_, r)| r[j].stp).collect::<Vec<_>>())));
        }
        u.row(cells);
    }
    bars(
        &ctx.out.join("tanasic-overhead.svg"),
        "Fig. 6: STP overhead of PPQ over NPQ (gpumux sim:k20c)",
        "STP(NPQ) / STP(PPQ)",
        &NS.iter().map(|n| format!("{n} processes")).collect::<Vec<_>>(),
        &pols[1..].iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        &plot,
    )?;
    Ok(format!(
        "Fig. 6: STP overhead (STP of NPQ / STP of PPQ), mean over {} workloads\n\n{}\n{}",
        mixes.len(),
        t.render(),
        u.render()
    ))
}

pub fn dss(ctx: &Ctx) -> Result<String> {
    let mixes = dss_mixes(ctx)?;
    let pols = ["fcfs", "dss-cs", "dss-drain"];
    let res = run_all(ctx, "tanasic-dss", &mixes, &pols)?;
    let mut t = Table::new(&["DSS vs FCFS", "n=2", "n=4", "n=6", "n=8", "paper 2→8"]);
    type Metric = fn(&Mix, &[PolicyMetrics], usize, Option<AppClass>) -> Vec<f64>;
    let ntt_class: Metric = |m, r, j, c| {
        (0..m.apps.len())
            .filter(|&k| c.is_none_or(|c| parboil_class2(m.apps[k]) == Some(c)))
            .map(|k| r[0].processes[k].ntt / r[j].processes[k].ntt)
            .collect()
    };
    let antt: Metric = |_, r, j, _| vec![r[0].antt / r[j].antt];
    let fairness: Metric = |_, r, j, _| vec![r[j].fairness / r[0].fairness];
    let stp_loss: Metric = |_, r, j, _| vec![r[0].stp / r[j].stp];
    let improved: Metric = |_, r, j, _| vec![if r[j].antt < r[0].antt { 100.0 } else { 0.0 }];
    let util: Metric = |_, r, j, _| vec![100.0 * r[j].sm_utilisation];
    use paper::*;
    let rows: Vec<(String, Metric, Option<AppClass>, usize, String)> = vec![
        ("NTT impr. SHORT, cs".into(), ntt_class, Some(AppClass::Short), 1, range(DSS_CS_SHORT)),
        ("NTT impr. SHORT, drain".into(), ntt_class, Some(AppClass::Short), 2, range(DSS_DRAIN_SHORT)),
        ("NTT impr. MEDIUM, cs".into(), ntt_class, Some(AppClass::Medium), 1, range(DSS_CS_MEDIUM)),
        ("NTT impr. MEDIUM, drain".into(), ntt_class, Some(AppClass::Medium), 2, range(DSS_DRAIN_MEDIUM)),
        ("NTT impr. LONG, cs".into(), ntt_class, Some(AppClass::Long), 1, range(DSS_LONG)),
        ("NTT impr. LONG, drain".into(), ntt_class, Some(AppClass::Long), 2, range(DSS_LONG)),
        ("NTT impr. all apps, cs".into(), ntt_class, None, 1, range(DSS_CS_ALL)),
        ("NTT impr. all apps, drain".into(), ntt_class, None, 2, range(DSS_DRAIN_ALL)),
        ("ANTT(FCFS)/ANTT, cs".into(), antt, None, 1, "-".into()),
        ("ANTT(FCFS)/ANTT, drain".into(), antt, None, 2, "-".into()),
        ("fairness impr., cs".into(), fairness, None, 1, range(DSS_CS_FAIRNESS)),
        ("fairness impr., drain".into(), fairness, None, 2, range(DSS_DRAIN_FAIRNESS)),
        ("STP degradation, cs".into(), stp_loss, None, 1, range(DSS_CS_STP_LOSS)),
        ("STP degradation, drain".into(), stp_loss, None, 2, range(DSS_DRAIN_STP_LOSS)),
        ("% workloads ANTT better, cs".into(), improved, None, 1, "20→~100".into()),
        ("% workloads ANTT better, drain".into(), improved, None, 2, "20→~100".into()),
        ("SM busy %, fcfs".into(), util, None, 0, "-".into()),
        ("SM busy %, dss-cs".into(), util, None, 1, "-".into()),
        ("SM busy %, dss-drain".into(), util, None, 2, "-".into()),
    ];
    for (name, f, class, j, p) in &rows {
        let mut cells = vec![name.clone()];
        for n in NS {
            let v: Vec<f64> = by_n(&mixes, &res, n).flat_map(|(m, r)| f(m, r, *j, *class)).collect();
            cells.push(f2(mean(&v)));
        }
        cells.push(p.clone());
        t.row(cells);
    }
    // Fig. 8: ANTT of every workload, sorted, per policy.
    for n in NS {
        let series: Vec<(String, Vec<(f64, f64)>)> = pols
            .iter()
            .enumerate()
            .map(|(j, p)| {
                let mut v: Vec<f64> = by_n(&mixes, &res, n).map(|(_, r)| r[j].antt).collect();
                v.sort_by(f64::total_cmp);
                (p.to_string(), v.into_iter().enumerate().map(|(i, a)| (i as f64, a)).collect())
            })
            .collect();
        lines(
            &ctx.out.join(format!("tanasic-dss-antt-{n}.svg")),
            &format!("Fig. 8: ANTT per workload, {n} processes (sorted)"),
            "workload (sorted by ANTT)",
            "ANTT",
            &series,
        )?;
    }
    Ok(format!(
        "Figs. 7-8: DSS against FCFS, mean over {} workloads (ratios > 1 are better, except STP degradation)\n\n{}",
        mixes.len(),
        t.render()
    ))
}

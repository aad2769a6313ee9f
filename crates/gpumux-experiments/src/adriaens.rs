//! Adriaens's thesis, chapters 5-7, on the FX 5800-like simulated GPU with
//! the applications rebuilt in `thesis.rs`, using his fixed-work method:
//! run spatial multitasking for a fixed window (5M cycles), count the work
//! (blocks) each application did, run exactly that work under cooperative
//! multitasking, and report speedup = cooperative time / window.

use crate::report::{bars, f2, geomean, lines, max, min, Table};
use crate::sim::{self, parallel};
use crate::thesis::{self, App, APPS, WINDOW_NS};
use crate::Ctx;
use anyhow::{Context, Result};
use gpumux_engine::device::Mechanism;
use gpumux_engine::kernel::DeviceInfo;
use gpumux_engine::model::Workload;
use gpumux_engine::policies::coop::Coop;
use gpumux_engine::policies::partition::{qos_reservation, AppChar};
use gpumux_engine::policies::spatial::{Heuristic, Reservation, Spatial};
use gpumux_svg::lines::Series;
use std::collections::HashMap;

/// The thesis's numbers (labelled; never computed).
pub mod paper {
    /// Table 5.1: even spatial vs cooperative, 2/3/4 applications, mean speedup.
    pub const EVEN_MEAN: [f64; 3] = [1.14, 1.22, 1.30];
    /// Table 5.1: the largest speedup, 2/3/4 applications.
    pub const EVEN_MAX: [f64; 3] = [2.00, 2.91, 3.83];
    /// Table 5.1: the smallest speedup, 2/3/4 applications.
    pub const EVEN_MIN: [f64; 3] = [0.99, 0.99, 0.99];
    /// Table 6.2: (heuristic, geo mean, min, max), two applications.
    pub const TABLE_6_2: [(&str, f64, f64, f64); 13] = [
        ("oracle-best", 1.19, 1.00, 2.00),
        ("oracle-worst", 1.00, 0.89, 1.97),
        ("even", 1.14, 0.99, 2.00),
        ("smart-even", 1.16, 0.99, 2.00),
        ("packed", 1.16, 0.99, 2.00),
        ("rounds", 1.16, 0.99, 2.00),
        ("profile", 1.17, 0.99, 2.00),
        ("fair-exhaustive", 1.16, 0.99, 2.00),
        ("fair", 1.17, 0.97, 2.00),
        ("blocks", 1.13, 0.99, 2.00),
        ("tpb", 1.13, 0.99, 2.00),
        ("threads", 1.12, 0.99, 2.00),
        ("", 0.0, 0.0, 0.0),
    ];
    /// Table 7.1: SMs reserved for QoS SAD → speedup by heuristic
    /// (even, smart-even, fair, rounds, profile).
    pub const TABLE_7_1: [(u32, [f64; 5]); 5] = [
        (5, [1.22, 1.23, 1.22, 1.25, 1.25]),
        (10, [1.20, 1.21, 1.22, 1.22, 1.22]),
        (15, [1.21, 1.23, 1.22, 1.22, 1.22]),
        (20, [1.20, 1.20, 1.20, 1.20, 1.20]),
        (25, [1.12, 1.12, 1.13, 1.13, 1.13]),
    ];
    /// Table 7.3: SAD needs 16-22 SMs for 75 % of its performance alone.
    pub const SAD_QOS_MIN_MAX_SMS: (u32, u32) = (16, 22);
    /// Table 7.3: speedup over cooperative with dynamic QoS.
    pub const SAD_DYNAMIC_QOS_SPEEDUP: f64 = 1.35;
}

fn device() -> DeviceInfo {
    thesis::fx5800()
}

/// What policy a trial runs in the fixed window.
#[derive(Clone, Debug)]
struct Spec {
    heuristic: Heuristic,
    dynamic: bool,
    /// Index into the trial's apps and SM count (QoS).
    reserve: Option<(usize, u32)>,
}

#[derive(Clone, Debug)]
struct Trial {
    apps: Vec<usize>,
    spec: Spec,
}

#[derive(Clone, Debug)]
struct TrialResult {
    speedup: f64,
    blocks: Vec<u64>,
    /// SMs preempted in the window (dynamic re-splits), per ms.
    preemptions_per_ms: f64,
    /// DRAM utilisation in the spatial window (time-weighted min(D, 1)) and
    /// the share of the window with DRAM saturated (simulator counters).
    dram_util: f64,
    dram_saturated: f64,
}

/// Speedup of isolated-scaling profiles: `speedup[app][j-1]` on j SMs,
/// relative to one SM, measured by running one run of each app alone.
fn measure_profiles(ctx: &Ctx) -> Result<Vec<Vec<f64>>> {
    let info = device();
    let n = info.num_sms as u32;
    // --quick measures a subset of SM counts and interpolates between them.
    let js: Vec<u32> =
        if ctx.quick { vec![1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 18, 22, 26, 30] } else { (1..=n).collect() };
    let jobs: Vec<(usize, u32)> = (0..APPS.len()).flat_map(|a| js.iter().map(move |&j| (a, j))).collect();
    let times = parallel("profiles (apps alone on 1..30 SMs)", &jobs, ctx.threads, ctx.progress, |&(a, j)| {
        let mut d = info.clone();
        d.num_sms = j as u16;
        let w = Workload {
            name: APPS[a].name.into(),
            processes: vec![gpumux_engine::model::ProcessSpec {
                name: APPS[a].name.into(),
                priority: 0,
                weight: 1.0,
                arrival_ns: 0,
                repetitions: 1,
                async_depth: 0,
                ops: thesis::run_ops(&APPS[a], &info),
            }],
            replay_min_runs: None,
        };
        Ok(sim::simulate(&w, &d, Box::new(Coop::default()), None, &ctx.sim, None)?.end_ns as f64)
    })?;
    let mut out = Vec::new();
    for a in 0..APPS.len() {
        let t: Vec<(u32, f64)> = jobs.iter().zip(&times).filter(|(j, _)| j.0 == a).map(|(j, t)| (j.1, *t)).collect();
        let t1 = t[0].1;
        let s: Vec<f64> = (1..=n)
            .map(|j| {
                let hi = t.iter().position(|p| p.0 >= j).unwrap_or(t.len() - 1);
                let (j1, t1j) = t[hi];
                let v = if j1 == j || hi == 0 {
                    t1 / t1j
                } else {
                    let (j0, t0j) = t[hi - 1];
                    let f = (j - j0) as f64 / (j1 - j0) as f64;
                    (1.0 - f) * (t1 / t0j) + f * (t1 / t1j)
                };
                v.max(1e-9)
            })
            .collect();
        out.push(s);
    }
    Ok(out)
}

fn chars(profiles: &[Vec<f64>]) -> Vec<AppChar> {
    let info = device();
    APPS.iter().zip(profiles).map(|(a, p)| thesis::characteristics(a, &info, p.clone())).collect()
}

fn proc_name(app: &App, i: usize) -> String {
    format!("{}#{i}", app.name)
}

/// One fixed-work comparison: spatial for the window, then the same blocks under coop.
fn run_trial(ctx: &Ctx, t: &Trial, chars: &[AppChar]) -> Result<TrialResult> {
    let info = device();
    let apps: Vec<&App> = t.apps.iter().map(|&i| &APPS[i]).collect();
    let w = thesis::respawning(&apps, &info);
    // Static heuristics use the thesis's per-application characteristics
    // (Table 6.1 and the measured profile); dynamic ones characterise each
    // kernel as it arrives, except for the profile-based ones, which need curves.
    let needs_curves = matches!(t.spec.heuristic, Heuristic::Profile | Heuristic::Fair);
    let mut p = Spatial::new(t.spec.heuristic.clone(), t.spec.dynamic, Mechanism::ContextSwitch);
    if !t.spec.dynamic || needs_curves {
        // Without measured profiles, the Table 6.1 figures with a predicted curve.
        let char_of =
            |a: usize| chars.get(a).cloned().unwrap_or_else(|| thesis::characteristics(&APPS[a], &info, vec![]));
        p = p.with_profiles(t.apps.iter().enumerate().map(|(i, &a)| (proc_name(&APPS[a], i), char_of(a))).collect());
    }
    if let Some((i, n)) = t.spec.reserve {
        p = p.with_reservation(Reservation { process_name: proc_name(&APPS[t.apps[i]], i), sms: n });
    }
    let spatial = sim::simulate(&w, &info, Box::new(p), None, &ctx.sim, Some(WINDOW_NS))?;
    let work = thesis::fixed_work(&apps, &info, &spatial.blocks_done)?;
    let coop =
        sim::simulate(&work, &info, Box::new(Coop::default()), None, &ctx.sim, None).context("cooperative run")?;
    Ok(TrialResult {
        speedup: coop.end_ns as f64 / spatial.end_ns.max(1) as f64,
        blocks: spatial.blocks_done,
        preemptions_per_ms: spatial.record.preemptions.len() as f64 / (spatial.end_ns.max(1) as f64 / 1e6),
        dram_util: spatial.mem.busy_ns / spatial.end_ns.max(1) as f64,
        dram_saturated: spatial.mem.saturated_ns / spatial.end_ns.max(1) as f64,
    })
}

fn run_trials(ctx: &Ctx, label: &str, trials: &[Trial], chars: &[AppChar]) -> Result<Vec<TrialResult>> {
    parallel(label, trials, ctx.threads, ctx.progress, |t| run_trial(ctx, t, chars))
}

fn combos(k: usize, quick: bool) -> Vec<Vec<usize>> {
    let all = thesis::combinations(APPS.len(), k);
    let count = match (k, quick) {
        (2, true) => 4,
        (_, true) => 4,
        (2, false) => all.len(),
        (_, false) => 60,
    };
    thesis::spaced(&all, count)
}

fn spec(h: Heuristic, dynamic: bool) -> Spec {
    Spec { heuristic: h, dynamic, reserve: None }
}

fn combo_name(c: &[usize]) -> String {
    c.iter().map(|&i| APPS[i].name).collect::<Vec<_>>().join("+")
}

/// DRAM utilisation of each app alone for the window (thesis Table 5.3's "1 App" column).
fn dram_alone(ctx: &Ctx) -> Result<Vec<(f64, f64)>> {
    let info = device();
    parallel("DRAM alone", &(0..APPS.len()).collect::<Vec<_>>(), ctx.threads, ctx.progress, |&a| {
        let w = thesis::respawning(&[&APPS[a]], &info);
        let o = sim::simulate(&w, &info, Box::new(Coop::default()), None, &ctx.sim, Some(WINDOW_NS))?;
        let end = o.end_ns.max(1) as f64;
        Ok((o.mem.busy_ns / end, o.mem.saturated_ns / end))
    })
}

/// Mean / max / min of percentages, formatted.
fn pct3(v: &[f64]) -> String {
    let p: Vec<f64> = v.iter().map(|x| 100.0 * x).collect();
    format!("{} / {} / {}", f2(crate::report::mean(&p)), f2(max(&p)), f2(min(&p)))
}

/// `adriaens-even` (Table 5.1, Fig. 5.1): even spatial partitioning against
/// cooperative multitasking over 2-, 3- and 4-application mixes; returns the report.
pub fn even(ctx: &Ctx) -> Result<String> {
    let mut t = Table::new(&["even vs coop", "2 apps", "3 apps", "4 apps", "paper 2/3/4"]);
    let mut dram = String::new();
    let alone = dram_alone(ctx)?;
    dram.push_str(&format!(
        "  1 app:  utilisation {} %, saturated {} % of the time    paper 37.0 / 92.6 / 2.2 %\n",
        pct3(&alone.iter().map(|a| a.0).collect::<Vec<_>>()),
        pct3(&alone.iter().map(|a| a.1).collect::<Vec<_>>()),
    ));
    let mut rows: Vec<Vec<Option<f64>>> = vec![vec![]; 7];
    let mut dist = Vec::new();
    let mut detail = String::new();
    for k in [2usize, 3, 4] {
        let cs = combos(k, ctx.quick);
        let trials: Vec<Trial> = cs
            .iter()
            .flat_map(|c| [false, true].map(|d| Trial { apps: c.clone(), spec: spec(Heuristic::Even, d) }))
            .collect();
        let res = run_trials(ctx, &format!("adriaens-even {k} apps"), &trials, &[])?;
        let st: Vec<f64> = res.iter().step_by(2).map(|r| r.speedup).collect();
        let paper_dram = ["38.6 / 94.5 / 2.3", "40.5 / 93.3 / 2.4", "42.2 / 91.7 / 2.6"][k - 2];
        dram.push_str(&format!(
            "  {k} apps: utilisation {} %, saturated {} % of the time    paper {paper_dram} %\n",
            pct3(&res.iter().step_by(2).map(|r| r.dram_util).collect::<Vec<_>>()),
            pct3(&res.iter().step_by(2).map(|r| r.dram_saturated).collect::<Vec<_>>()),
        ));
        let dy: Vec<f64> = res.iter().skip(1).step_by(2).map(|r| r.speedup).collect();
        for (row, v) in [geomean(&st), max(&st), min(&st), geomean(&dy), max(&dy), min(&dy)].into_iter().enumerate() {
            rows[row].push(v);
        }
        rows[6].push(Some(cs.len() as f64));
        let mut sorted = st.clone();
        sorted.sort_by(f64::total_cmp);
        dist.push(Series {
            name: format!("{k} apps"),
            points: sorted.iter().enumerate().map(|(i, s)| (i as f64 / sorted.len().max(1) as f64, *s)).collect(),
        });
        if k == 2 {
            for (c, s) in cs.iter().zip(&st) {
                detail.push_str(&format!("  {:<22} {s:.2}\n", combo_name(c)));
            }
        }
    }
    let labels = [
        "static: geo mean",
        "static: max",
        "static: min",
        "dynamic: geo mean",
        "dynamic: max",
        "dynamic: min",
        "combinations",
    ];
    let paper_cells = [
        paper::EVEN_MEAN.map(|v| format!("{v:.2}")).join("/"),
        paper::EVEN_MAX.map(|v| format!("{v:.2}")).join("/"),
        paper::EVEN_MIN.map(|v| format!("{v:.2}")).join("/"),
        "(not studied)".into(),
        "".into(),
        "".into(),
        "78/364/1365".into(),
    ];
    for (i, l) in labels.iter().enumerate() {
        let mut cells = vec![l.to_string()];
        cells.extend(rows[i].iter().map(|v| if i == 6 { v.map_or("-".into(), |x| format!("{x:.0}")) } else { f2(*v) }));
        cells.push(paper_cells[i].clone());
        t.row(cells);
    }
    lines(
        &ctx.out.join("adriaens-even.svg"),
        "Fig. 5.1 / Table 5.1: even spatial vs cooperative (sorted)",
        "fraction of combinations",
        "speedup over cooperative",
        &dist,
    )?;
    Ok(format!(
        "Table 5.1: speedup of even spatial multitasking over cooperative (fixed work, {:.2} ms window)\n\n{}\n\
         DRAM under static even spatial, mean / max / min over combinations (thesis Table 5.3):\n{dram}\n\
         per pair (static even):\n{detail}",
        WINDOW_NS as f64 / 1e6,
        t.render()
    ))
}

/// The heuristics compared for k applications (thesis: all for 2, five for 3-4).
fn heuristics_for(k: usize) -> Vec<Heuristic> {
    use Heuristic::*;
    if k == 2 {
        vec![Even, SmartEven, Packed, Rounds, Profile, Fair, Blocks, ThreadsPerBlock, Threads]
    } else {
        vec![Even, SmartEven, Rounds, Profile, Fair]
    }
}

/// A combination where Fair's split did worse than Even's (printed as evidence).
struct FairLoss {
    combo: String,
    even_split: Vec<u32>,
    /// Speedups over cooperative.
    even: f64,
    fair_split: Vec<u32>,
    fair: f64,
}

impl FairLoss {
    fn loss(&self) -> f64 {
        self.even - self.fair
    }
}

/// `adriaens-heuristics` (Table 6.2, Fig. 6.2): every SM-partitioning
/// heuristic, static and dynamic, against cooperative; returns the report.
pub fn heuristics(ctx: &Ctx) -> Result<String> {
    let profiles = measure_profiles(ctx)?;
    let ch = chars(&profiles);
    let info = device();
    let n = info.num_sms as u32;
    let mut out = String::new();
    let mut per_k: Vec<Vec<(String, Vec<f64>)>> = Vec::new();
    // Alone blocks in the window on all SMs: the base of Fair Exhaustive's "loss".
    let alone =
        parallel("alone in the window", &(0..APPS.len()).collect::<Vec<_>>(), ctx.threads, ctx.progress, |&a| {
            let w = thesis::respawning(&[&APPS[a]], &info);
            Ok(sim::simulate(&w, &info, Box::new(Coop::default()), None, &ctx.sim, Some(WINDOW_NS))?.blocks_done[0]
                as f64)
        })?;
    for k in [2usize, 3, 4] {
        let cs = combos(k, ctx.quick);
        let hs = heuristics_for(k);
        let dyn_hs = [Heuristic::Even, Heuristic::SmartEven, Heuristic::Packed, Heuristic::Rounds];
        // Every distinct static split needed, per combination (oracle: all of them for 2 apps).
        let mut trials: Vec<Trial> = Vec::new();
        let mut index: HashMap<(usize, Vec<u32>), usize> = HashMap::new();
        let mut want = |ci: usize, split: Vec<u32>, trials: &mut Vec<Trial>| {
            if let std::collections::hash_map::Entry::Vacant(e) = index.entry((ci, split.clone())) {
                e.insert(trials.len());
                trials.push(Trial { apps: cs[ci].clone(), spec: spec(Heuristic::Fixed(split), false) });
            }
        };
        let mut picks: Vec<Vec<(String, Vec<u32>)>> = Vec::new();
        for (ci, c) in cs.iter().enumerate() {
            let apps: Vec<AppChar> = c.iter().map(|&a| ch[a].clone()).collect();
            let mut p = Vec::new();
            for h in &hs {
                let s = h.split(&apps, n);
                want(ci, s.clone(), &mut trials);
                p.push((h.name(), s));
            }
            if k == 2 {
                for s in 1..n {
                    want(ci, vec![s, n - s], &mut trials);
                }
            }
            picks.push(p);
        }
        let dyn_start = trials.len();
        for c in &cs {
            for h in &dyn_hs {
                trials.push(Trial { apps: c.clone(), spec: spec(h.clone(), true) });
            }
        }
        let res = run_trials(ctx, &format!("adriaens-heuristics {k} apps"), &trials, &ch)?;
        let mut by_h: Vec<(String, Vec<f64>)> = Vec::new();
        let mut push = |name: String, v: f64| match by_h.iter_mut().find(|(n, _)| *n == name) {
            Some(e) => e.1.push(v),
            None => by_h.push((name, vec![v])),
        };
        let mut splits_detail = String::new();
        let mut fair_losses: Vec<FairLoss> = Vec::new();
        // The pair whose worst split is best (Oracle Worst's max), as evidence.
        let mut worst_max: Option<(String, String, f64)> = None;
        for (ci, c) in cs.iter().enumerate() {
            let get = |s: &Vec<u32>| index.get(&(ci, s.clone())).map(|&i| &res[i]);
            if k == 2 {
                let all: Vec<(u32, &TrialResult)> = (1..n).filter_map(|s| Some((s, get(&vec![s, n - s])?))).collect();
                if let Some(b) = all.iter().max_by(|a, b| a.1.speedup.total_cmp(&b.1.speedup)) {
                    push("oracle-best".into(), b.1.speedup);
                    splits_detail.push_str(&format!("  {:<22} oracle-best {}/{}", combo_name(c), b.0, n - b.0));
                }
                if let Some(w) = all.iter().min_by(|a, b| a.1.speedup.total_cmp(&b.1.speedup)) {
                    push("oracle-worst".into(), w.1.speedup);
                    splits_detail.push_str(&format!(" worst {}/{}", w.0, n - w.0));
                    if worst_max.as_ref().is_none_or(|m| w.1.speedup > m.2) {
                        worst_max = Some((combo_name(c), format!("{}/{}", w.0, n - w.0), w.1.speedup));
                    }
                }
                // Fair Exhaustive: the split whose measured losses against running alone differ least.
                let loss = |r: &TrialResult, i: usize| r.blocks[i] as f64 / alone[c[i]].max(1.0);
                if let Some(f) = all
                    .iter()
                    .min_by(|a, b| (loss(a.1, 0) - loss(a.1, 1)).abs().total_cmp(&(loss(b.1, 0) - loss(b.1, 1)).abs()))
                {
                    push("fair-exhaustive".into(), f.1.speedup);
                }
            }
            for (name, s) in &picks[ci] {
                if let Some(r) = get(s) {
                    push(name.clone(), r.speedup);
                    if k == 2 && (name == "smart-even" || name == "rounds" || name == "profile" || name == "fair") {
                        splits_detail.push_str(&format!(
                            " {name} {}",
                            s.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("/")
                        ));
                    }
                }
            }
            if k == 2 {
                splits_detail.push('\n');
            } else {
                // Where Fair loses to Even: the splits and what each got, as evidence.
                let pick = |h: &str| picks[ci].iter().find(|(n, _)| n == h).and_then(|(_, s)| Some((s, get(s)?)));
                if let (Some((es, er)), Some((fs, fr))) = (pick("even"), pick("fair")) {
                    if fr.speedup < er.speedup - 0.005 {
                        fair_losses.push(FairLoss {
                            combo: combo_name(c),
                            even_split: es.clone(),
                            even: er.speedup,
                            fair_split: fs.clone(),
                            fair: fr.speedup,
                        });
                    }
                }
            }
            for (j, h) in dyn_hs.iter().enumerate() {
                let r = &res[dyn_start + ci * dyn_hs.len() + j];
                push(format!("{}-dyn", h.name()), r.speedup);
                push(format!("{}-dyn preemptions/ms", h.name()), r.preemptions_per_ms);
            }
        }
        let mut t = Table::new(&["heuristic", "geo mean", "min", "max", "paper mean", "paper min", "paper max"]);
        let mut rates = String::new();
        for (name, v) in &by_h {
            if name.ends_with("preemptions/ms") {
                rates.push_str(&format!("  {name}: mean {}, max {}\n", f2(crate::report::mean(v)), f2(max(v))));
                continue;
            }
            let p = paper::TABLE_6_2.iter().find(|p| k == 2 && p.0 == name);
            t.row(vec![
                name.clone(),
                f2(geomean(v)),
                f2(min(v)),
                f2(max(v)),
                p.map_or("-".into(), |p| format!("{:.2}", p.1)),
                p.map_or("-".into(), |p| format!("{:.2}", p.2)),
                p.map_or("-".into(), |p| format!("{:.2}", p.3)),
            ]);
        }
        out.push_str(&format!(
            "Table 6.2{}: speedup over cooperative, {k} applications, {} combinations\n\n{}\nSMs preempted by dynamic re-splits:\n{rates}\n",
            if k == 2 { "" } else { " (3-4 application version)" },
            cs.len(),
            t.render()
        ));
        if k == 2 {
            out.push_str(&format!("splits chosen (first app/second app):\n{splits_detail}\n"));
            if let Some((pair, split, v)) = &worst_max {
                out.push_str(&format!("oracle-worst max: {pair} split {split}, speedup {v:.2}\n\n"));
            }
        } else if !fair_losses.is_empty() {
            let slash = |v: &[u32]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("/");
            out.push_str(&format!(
                "fair below even in {} of {} combinations (split, speedup over cooperative):\n",
                fair_losses.len(),
                cs.len()
            ));
            // Largest losses first; the rest summarised.
            fair_losses.sort_by(|a, b| b.loss().total_cmp(&a.loss()));
            const SHOWN: usize = 8;
            for l in fair_losses.iter().take(SHOWN) {
                out.push_str(&format!(
                    "  {:<34} even {:<12} {:.2}   fair {:<12} {:.2}\n",
                    l.combo,
                    slash(&l.even_split),
                    l.even,
                    slash(&l.fair_split),
                    l.fair
                ));
            }
            if let Some(next) = fair_losses.get(SHOWN) {
                out.push_str(&format!(
                    "  ... {} more, each losing at most {:.3}\n",
                    fair_losses.len() - SHOWN,
                    next.loss()
                ));
            }
            out.push('\n');
        }
        per_k.push(by_h);
    }
    // Fig. 6.2: geo mean per heuristic (those run for every k), one bar per k.
    let common = ["even", "smart-even", "rounds", "profile", "fair", "even-dyn", "smart-even-dyn", "rounds-dyn"];
    let vals: Vec<Vec<f64>> = common
        .iter()
        .map(|h| {
            per_k
                .iter()
                .map(|by_h| by_h.iter().find(|x| x.0 == *h).and_then(|x| geomean(&x.1)).unwrap_or(f64::NAN))
                .collect()
        })
        .collect();
    bars(
        &ctx.out.join("adriaens-heuristics.svg"),
        "Fig. 6.2: speedup over cooperative by heuristic (gpumux sim:fx5800)",
        "geo mean speedup",
        &common.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        &["2 apps".to_string(), "3 apps".into(), "4 apps".into()],
        &vals,
    )?;
    out.push_str(&profile_table(&profiles));
    Ok(out)
}

/// The measured isolated-scaling profiles (Fig. 6.1 / 4.1 analogue).
fn profile_table(p: &[Vec<f64>]) -> String {
    let mut t = Table::new(&["app", "S(1)", "S(4)", "S(8)", "S(15)", "S(22)", "S(30)"]);
    for (a, s) in APPS.iter().zip(p) {
        let g = |j: usize| f2(s.get(j - 1).copied());
        t.row(vec![a.name.into(), g(1), g(4), g(8), g(15), g(22), g(30)]);
    }
    format!("measured speedup alone vs SMs (Fig. 6.1 analogue):\n{}", t.render())
}

/// `adriaens-qos` (Tables 7.1 and 7.3): SAD kept at a quality of service by
/// reserved SMs, and by a performance target; returns the report.
pub fn qos(ctx: &Ctx) -> Result<String> {
    let profiles = measure_profiles(ctx)?;
    let ch = chars(&profiles);
    let info = device();
    let sad = APPS.iter().position(|a| a.name == "sad").context("no sad")?;
    let pairs = thesis::spaced(&thesis::combinations(APPS.len(), 2), if ctx.quick { 3 } else { 20 });
    let hs = [Heuristic::Even, Heuristic::SmartEven, Heuristic::Fair, Heuristic::Rounds, Heuristic::Profile];
    let reserves = [5u32, 10, 15, 20, 25];
    let mut trials = Vec::new();
    for &r in &reserves {
        for h in &hs {
            for p in &pairs {
                trials.push(Trial {
                    apps: vec![sad, p[0], p[1]],
                    spec: Spec { heuristic: h.clone(), dynamic: false, reserve: Some((0, r)) },
                });
            }
        }
    }
    let res = run_trials(ctx, "adriaens-qos (Table 7.1)", &trials, &ch)?;
    let mut t = Table::new(&["SMs for SAD", "even", "smart-even", "fair", "rounds", "profile", "paper (same order)"]);
    let mut series: Vec<Series> = hs.iter().map(|h| Series { name: h.name(), points: Vec::new() }).collect();
    let mut it = res.iter();
    for (ri, &r) in reserves.iter().enumerate() {
        let mut cells = vec![r.to_string()];
        for (hi, _) in hs.iter().enumerate() {
            let v: Vec<f64> = pairs.iter().filter_map(|_| it.next().map(|x| x.speedup)).collect();
            let g = geomean(&v);
            series[hi].points.push((r as f64, g.unwrap_or(f64::NAN)));
            cells.push(f2(g));
        }
        cells.push(paper::TABLE_7_1[ri].1.map(|v| format!("{v:.2}")).join(" "));
        t.row(cells);
    }
    lines(
        &ctx.out.join("adriaens-qos.svg"),
        "Fig. 7.1: QoS SAD on reserved SMs, speedup over cooperative",
        "SMs reserved for SAD",
        "speedup",
        &series,
    )?;

    // QoS by target: SAD must keep 75 % of its performance alone. Static: the
    // reservation its isolated profile predicts, whoever it runs with.
    // Co-run aware (thesis's "dynamic QoS", Table 7.3): the fewest SMs that
    // meet the target with these co-runners, found by search.
    let target = 0.75;
    let predicted = qos_reservation(&profiles[sad], target).context("empty SAD profile")?;
    let alone_w = thesis::respawning(&[&APPS[sad]], &info);
    let sad_alone = sim::simulate(&alone_w, &info, Box::new(Coop::default()), None, &ctx.sim, Some(WINDOW_NS))?
        .blocks_done[0] as f64;
    let be_pairs: Vec<Vec<usize>> =
        thesis::spaced(&(0..APPS.len()).map(|a| vec![a]).collect::<Vec<_>>(), if ctx.quick { 3 } else { 12 });
    let scan: Vec<(usize, u32)> =
        (0..be_pairs.len()).flat_map(|i| (1..info.num_sms as u32).map(move |r| (i, r))).collect();
    let scan_trials: Vec<Trial> = scan
        .iter()
        .map(|&(i, r)| Trial {
            apps: vec![sad, be_pairs[i][0]],
            spec: Spec { heuristic: Heuristic::Even, dynamic: false, reserve: Some((0, r)) },
        })
        .collect();
    let sres = run_trials(ctx, "adriaens-qos (target search)", &scan_trials, &ch)?;
    let mut u = Table::new(&[
        "best-effort app",
        "SMs needed",
        "SAD perf at predicted",
        "DRAM saturated % at predicted",
        "BE speedup (needed vs static)",
    ]);
    let mut needed_all = Vec::new();
    let mut rows = Vec::new();
    for (i, be) in be_pairs.iter().enumerate() {
        let perf =
            |r: u32| -> Option<&TrialResult> { scan.iter().position(|&(j, x)| j == i && x == r).map(|k| &sres[k]) };
        let needed =
            (1..info.num_sms as u32).find(|&r| perf(r).is_some_and(|t| t.blocks[0] as f64 >= target * sad_alone));
        needed_all.push(needed);
        rows.push((
            be[0],
            needed,
            perf(predicted).map(|t| t.blocks[0] as f64 / sad_alone),
            perf(predicted).map(|t| 100.0 * t.dram_saturated),
        ));
    }
    // Static reservation: enough for the worst co-runner seen.
    let static_r = needed_all.iter().flatten().copied().max();
    let mut gains = Vec::new();
    for (i, (be, needed, at_pred, saturated)) in rows.iter().enumerate() {
        let perf = |r: u32| scan.iter().position(|&(j, x)| j == i && x == r).map(|k| sres[k].blocks[1] as f64);
        let gain = match (needed, static_r) {
            (Some(n), Some(s)) => perf(*n).zip(perf(s)).map(|(a, b)| a / b.max(1.0)),
            _ => None,
        };
        if let Some(g) = gain {
            gains.push(g);
        }
        u.row(vec![
            APPS[*be].name.into(),
            needed.map_or("never".into(), |n| n.to_string()),
            f2(*at_pred),
            f2(*saturated),
            f2(gain),
        ]);
    }
    Ok(format!(
        "Table 7.1: QoS SAD given a fixed number of SMs, two best-effort apps split the rest; speedup over\n\
         cooperative (geo mean over {} best-effort pairs)\n\n{}\n\
         QoS target: SAD keeps {:.0} % of its performance alone (window {:.2} ms, {:.0} blocks alone).\n\
         Isolated profile predicts {predicted} SMs. Static reservation (worst co-runner): {}.\n\
         paper: SAD needs {}-{} SMs; co-run-aware (dynamic) QoS speeds best-effort apps up {:.2}x\n\n{}\
         co-run-aware vs static, geo mean: {}\n",
        pairs.len(),
        t.render(),
        target * 100.0,
        WINDOW_NS as f64 / 1e6,
        sad_alone,
        static_r.map_or("-".into(), |s| s.to_string()),
        paper::SAD_QOS_MIN_MAX_SMS.0,
        paper::SAD_QOS_MIN_MAX_SMS.1,
        paper::SAD_DYNAMIC_QOS_SPEEDUP,
        u.render(),
        f2(geomean(&gains)),
    ))
}

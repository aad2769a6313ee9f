//! Sensitivity of the paper's simulation to the readings it leaves open (docs/rt.md,
//! "Differences from the paper"). Not part of the tool: a self-contained re-implementation of
//! the analysis with a switchable blocking term, and GLOBAL by plain enumeration, run on the
//! crate's generator at a few `U_G` values.
//!
//! ```text
//! cargo run --release -p gpumux-rt --example readings -- [SETS] [cpu,pci,gpu] [U_G,U_G,...]
//! ```
//!
//! Blocking readings compared (all with the paper's interference term):
//! * `literal` — the paper's formula: `B_ij` = longest lower-priority section on `H_ij`,
//!   added to every GPU/PCI subtask outside the division by `m` (what `analysis.rs` does);
//! * `div-m` — lower-priority sections filling the `m` units, summed and divided by `m`
//!   (the usual global-multiprocessor argument; equals `literal` on the single PCI bus);
//! * `once/job` — `literal`, but charged only to the first subtask of each resource
//!   (optimistic: a lower-priority task can block every subtask of a pipeline);
//! * `none` — no blocking at all (optimistic; bounds what any blocking reading can give).
//!
//! It then breaks down, with the crate's own analysis, why GLOBAL rejects sets at
//! `U_G = 1.2` and `2.0`: how many sets blocking alone proves infeasible under every mode
//! assignment, and the mean terms of the first task that misses under LOCAL's modes.

use gpumux_rt::analysis::{Analyzer, Status, SubtaskReport, MAX_ITERATIONS};
use gpumux_rt::assign::{assign_with, Method};
use gpumux_rt::generate::{set_near_utilisation, GenConfig, ShareWeights};
use gpumux_rt::model::{Mode, Resource, TaskSet};
use gpumux_rt::rng::Rng;

#[derive(Clone, Copy, PartialEq)]
enum Blocking {
    Literal,
    DivM,
    OncePerJob,
    None,
}

/// Holistic analysis of the paper with the chosen blocking term; true if every `R_i <= D_i`.
fn schedulable(set: &TaskSet, modes: &[Mode], b: Blocking) -> bool {
    let res = [Resource::Cpu, Resource::Pci, Resource::Gpu];
    let units: Vec<f64> = res.iter().map(|&r| set.platform.units(r) as f64).collect();
    // (jitter, alpha, period) of higher-priority subtasks, per resource.
    let mut interf: [Vec<(f64, f64, f64)>; 3] = Default::default();
    let n = set.tasks.len();
    for i in 0..n {
        let t = &set.tasks[i];
        let mut blk = [0.0f64; 3];
        for r in [Resource::Pci, Resource::Gpu] {
            // Longest section of each lower-priority task on r, with the units it holds.
            let mut secs: Vec<(f64, f64)> = Vec::new();
            for (lp, &mode) in set.tasks.iter().zip(modes).skip(i + 1) {
                let len = lp.subtasks.iter().filter(|p| p.resource == r).map(|p| p.cost(mode)).fold(0.0, f64::max);
                let held = if r == Resource::Gpu && mode == Mode::Multi { 2.0 } else { 1.0 };
                if len > 0.0 {
                    secs.push((len, held));
                }
            }
            secs.sort_by(|a, b| b.0.total_cmp(&a.0));
            let m = units[r.index()];
            blk[r.index()] = match b {
                Blocking::Literal | Blocking::OncePerJob => secs.first().map_or(0.0, |s| s.0),
                Blocking::None => 0.0,
                Blocking::DivM => {
                    let (mut left, mut sum) = (m, 0.0);
                    for (len, held) in secs {
                        if left <= 0.0 {
                            break;
                        }
                        let take = held.min(left);
                        sum += len * take;
                        left -= take;
                    }
                    sum / m
                }
            };
        }
        let mut charged = [false; 3];
        let (mut pw, mut pc) = (0.0, 0.0);
        let mut jitters = Vec::with_capacity(t.subtasks.len());
        for s in &t.subtasks {
            let r = s.resource.index();
            let c = s.cost(modes[i]);
            let mut bb = blk[r];
            if b == Blocking::OncePerJob {
                if charged[r] {
                    bb = 0.0;
                }
                charged[r] = true;
            }
            let mut w = c + bb;
            loop {
                if pw + w > t.deadline {
                    return false;
                }
                let sum: f64 = interf[r].iter().map(|&(j, a, p)| ((j + w) / p).ceil() * a).sum();
                let next = c + bb + (sum / units[r]).ceil();
                if next <= w {
                    break;
                }
                w = next;
            }
            jitters.push(pw - pc);
            pw += w;
            pc += c;
        }
        for (s, j) in t.subtasks.iter().zip(jitters) {
            let a = if s.resource == Resource::Gpu { s.single } else { s.cost(modes[i]) };
            interf[s.resource.index()].push((j, a, t.period));
        }
    }
    true
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let sets: usize = match args.first().map(|s| s.parse()) {
        None => 1000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: readings [SETS] [cpu,pci,gpu] [U_G,U_G,...]");
            std::process::exit(2);
        }
    };
    let mut cfg = GenConfig::default();
    if let Some(w) = args.get(1) {
        let v: Vec<f64> = w.split(',').filter_map(|x| x.parse().ok()).collect();
        if v.len() != 3 || v.iter().any(|x| !x.is_finite() || *x < 0.0) {
            eprintln!("weights must be three non-negative numbers cpu,pci,gpu");
            std::process::exit(2);
        }
        cfg.weights = ShareWeights { cpu: v[0], pci: v[1], gpu: v[2] };
    }
    println!(
        "GLOBAL-schedulable sets of {sets} per U_G (± 0.05), weights {},{},{}; [single-GPU in brackets]",
        cfg.weights.cpu, cfg.weights.pci, cfg.weights.gpu
    );
    let ugs: Vec<f64> = match args.get(2) {
        None => vec![0.8, 1.2, 1.6, 2.0],
        Some(list) => {
            let v: Vec<f64> = list.split(',').filter_map(|x| x.parse().ok()).collect();
            if v.is_empty() || v.iter().any(|u| !(0.1..=8.0).contains(u)) {
                eprintln!("U_G values must be numbers in 0.1..=8, comma-separated");
                std::process::exit(2);
            }
            v
        }
    };
    print!("{:10}", "blocking");
    for &u in &ugs {
        print!("  U_G={u:<11}");
    }
    println!();
    for (name, b) in [
        ("literal", Blocking::Literal),
        ("div-m", Blocking::DivM),
        ("once/job", Blocking::OncePerJob),
        ("none", Blocking::None),
    ] {
        print!("{name:10}");
        for &ug in &ugs {
            let mut rng = Rng::new(1);
            let (mut single, mut global, mut skipped) = (0, 0, 0);
            for _ in 0..sets {
                let set = set_near_utilisation(&mut rng, &cfg, ug, 0.05);
                let n = set.len();
                if schedulable(&set, &vec![Mode::Single; n], b) {
                    single += 1;
                }
                if n > 16 {
                    skipped += 1;
                    continue;
                }
                let any = (0..1u32 << n).any(|mask| {
                    let modes: Vec<Mode> =
                        (0..n).map(|i| if mask >> i & 1 == 1 { Mode::Multi } else { Mode::Single }).collect();
                    schedulable(&set, &modes, b)
                });
                global += any as usize;
            }
            let cell = if skipped > 0 {
                format!("{global} [{single}] ({skipped} skipped)")
            } else {
                format!("{global} [{single}]")
            };
            print!("  {cell:<15}");
        }
        println!();
    }
    breakdown(&cfg, sets);
}

/// True when some task misses its deadline on its own cost plus blocking alone, with its own
/// mode and every lower-priority task in whichever mode gives the shorter bound: then no
/// mode assignment makes the set schedulable.
fn blocking_proves_infeasible(set: &TaskSet) -> bool {
    set.tasks.iter().enumerate().any(|(i, t)| {
        let own = |m: Mode| t.subtasks.iter().map(|s| s.cost(m)).sum::<f64>();
        let blocking: f64 = t
            .subtasks
            .iter()
            .filter(|s| s.resource != Resource::Cpu)
            .map(|s| {
                set.tasks[i + 1..]
                    .iter()
                    .flat_map(|lp| &lp.subtasks)
                    .filter(|p| p.resource == s.resource)
                    .map(|p| p.single.min(p.multi))
                    .fold(0.0, f64::max)
            })
            .sum();
        own(Mode::Single).min(own(Mode::Multi)) + blocking > t.deadline
    })
}

fn breakdown(cfg: &GenConfig, sets: usize) {
    println!();
    println!("why GLOBAL rejects (crate analysis); terms of the first task missing under LOCAL, / D:");
    let mut an = Analyzer::new();
    for ug in [1.2, 2.0] {
        let mut rng = Rng::new(1);
        let (mut global, mut proof, mut tasks) = (0, 0, 0);
        // own C, B_gpu, B_pci, I_gpu, I_pci, I_cpu
        let mut terms = [0.0f64; 6];
        let mut counted = 0.0f64;
        for _ in 0..sets {
            let set = set_near_utilisation(&mut rng, cfg, ug, 0.05);
            tasks += set.len();
            proof += blocking_proves_infeasible(&set) as usize;
            if assign_with(&set, Method::Global, &mut an).schedulable {
                global += 1;
                continue;
            }
            let modes = assign_with(&set, Method::Local, &mut an).modes;
            let report = an.analyze(&set, &modes, MAX_ITERATIONS);
            let Some(t) = report.tasks.iter().find(|t| t.status != Status::Meets) else {
                continue;
            };
            if t.subtasks.is_empty() {
                continue; // unbounded: no per-subtask terms
            }
            let sum = |r: Option<Resource>, f: fn(&SubtaskReport) -> f64| {
                t.subtasks.iter().filter(|s| r.is_none_or(|r| s.resource == r)).map(f).sum::<f64>() / t.deadline
            };
            let interference = |s: &SubtaskReport| s.w - s.cost - s.blocking;
            terms[0] += sum(None, |s| s.cost);
            terms[1] += sum(Some(Resource::Gpu), |s| s.blocking);
            terms[2] += sum(Some(Resource::Pci), |s| s.blocking);
            terms[3] += sum(Some(Resource::Gpu), interference);
            terms[4] += sum(Some(Resource::Pci), interference);
            terms[5] += sum(Some(Resource::Cpu), interference);
            counted += 1.0;
        }
        let m = |k: usize| terms[k] / counted.max(1.0);
        println!(
            "U_G={ug}: {sets} sets, mean {:.2} tasks, GLOBAL {global}, blocking alone proves infeasible {proof}",
            tasks as f64 / sets as f64
        );
        println!(
            "  {counted} bounded misses: C {:.2}  B_gpu {:.2}  B_pci {:.2}  I_gpu {:.2}  I_pci {:.2}  I_cpu {:.2}",
            m(0),
            m(1),
            m(2),
            m(3),
            m(4),
            m(5)
        );
    }
}

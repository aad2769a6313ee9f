//! `--only copy-beside`: issue 35's last goal, "a client copying 1 GiB
//! beside a client launching short kernels: the latter within 10 % of
//! alone".
//!
//! The launching client runs the programs experiment's chain (511
//! dependent short launches, one sync, checked against its CPU reference)
//! `--copy-beside-reps` times: alone, then beside a copying client that
//! moves `--program-copy-mib` up and down, round after round, until the
//! chain is done ([`super::super::copier`]: every round checked), once from
//! ordinary memory and once from pinned memory (natively `cuMemHostAlloc`,
//! through gpumuxd `Client::alloc_host`); and that sequence
//! `--copy-beside-rounds` times, so that a drift of the machine's speed
//! weighs on both sides alike. Each client is a process of its own,
//! natively (two CUDA contexts under the driver's time slicing, for
//! comparison) and through the bench's default daemon, the alone runs and
//! the runs beside in the same daemon. The figure is the chain's median
//! beside over its median alone in the same setting, every repetition of
//! every round counted; the ratio of the minimums beside it says what is
//! left when both sides' slow repetitions are set aside.

use super::super::copier::CopierResult;
use super::super::gpu::HostMemory;
use super::super::jobs::{Job, JobResult};
use super::super::procs::{Env, ProcPlan};
use super::super::programs::{self, size, Check, Program, ProgramResult};
use super::super::report::{percentile, table};
use super::super::role::Mode;
use super::Bench;
use anyhow::{bail, Result};
use serde::Serialize;

/// The goal: the chain beside the copier at most this many times its time alone.
pub const GOAL: f64 = 1.10;

/// The copier's kinds of host memory, one run beside each.
const COPIER_HOST_MEMORY: [HostMemory; 2] = [HostMemory::Pageable, HostMemory::Pinned];

/// The chain in one run: alone, or beside a copier.
#[derive(Clone, Debug, Serialize)]
pub struct CopyBesideRow {
    /// `native` or the daemon configuration.
    pub setting: String,
    /// The copier's host memory (`pageable`, `pinned`); `None`: the chain alone.
    pub copier: Option<String>,
    /// The chain's output against its reference (every repetition).
    pub check: Check,
    pub reps: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// `median_ms` over the same setting's alone median (`None` alone).
    pub vs_alone: Option<f64>,
    /// `min_ms` over the same setting's alone minimum (`None` alone).
    pub min_vs_alone: Option<f64>,
    /// The copier's rounds while the chain ran, their check, and GB/s
    /// (10^9 bytes/s) of its median upload and download.
    pub copier_rounds: Option<usize>,
    pub copier_check: Option<Check>,
    pub copier_up_gb_s: Option<f64>,
    pub copier_down_gb_s: Option<f64>,
}

/// The experiment's figures.
#[derive(Clone, Debug, Serialize)]
pub struct CopyBesideReport {
    /// Bytes the copier moves each way a round.
    pub bytes: u64,
    /// Rounds of alone and beside runs (`--copy-beside-rounds`).
    pub rounds: u32,
    pub goal: f64,
    pub rows: Vec<CopyBesideRow>,
}

impl CopyBesideRow {
    /// The chain's row in `setting` from its result, beside `copier` (its
    /// host memory and result) or alone; `alone`: the setting's alone row.
    fn of(
        setting: &str,
        chain: &ProgramResult,
        copier: Option<(HostMemory, &CopierResult)>,
        alone: Option<&CopyBesideRow>,
    ) -> CopyBesideRow {
        let ms = |p: f64| percentile(&chain.total_ns, p) as f64 / 1e6;
        let (median_ms, min_ms) = (ms(50.0), chain.total_ns.iter().min().map_or(0.0, |&t| t as f64 / 1e6));
        let over = |x: f64, a: f64| (a > 0.0).then(|| x / a);
        let gb_s = |c: &CopierResult, ns: &[u64]| {
            let t = percentile(ns, 50.0);
            (t > 0).then(|| c.bytes as f64 / t as f64)
        };
        CopyBesideRow {
            setting: setting.into(),
            copier: copier.map(|(h, _)| h.name().into()),
            check: chain.check.clone(),
            reps: chain.total_ns.len(),
            median_ms,
            min_ms,
            max_ms: ms(100.0),
            vs_alone: copier.and(alone).and_then(|a| over(median_ms, a.median_ms)),
            min_vs_alone: copier.and(alone).and_then(|a| over(min_ms, a.min_ms)),
            copier_rounds: copier.map(|(_, c)| c.upload_ns.len()),
            copier_check: copier.map(|(_, c)| c.check.clone()),
            copier_up_gb_s: copier.and_then(|(_, c)| gb_s(c, &c.upload_ns)),
            copier_down_gb_s: copier.and_then(|(_, c)| gb_s(c, &c.download_ns)),
        }
    }

    /// Whether the goal holds: through gpumuxd beside a copier, the ratio
    /// at most [`GOAL`]; `None` for the native and alone rows.
    pub fn met(&self) -> Option<bool> {
        (self.setting != "native").then_some(())?;
        self.vs_alone.map(|r| r <= GOAL)
    }
}

impl CopyBesideReport {
    /// The table, what each check that did not pass said, and one summary
    /// line per daemon run beside a copier (`copy-beside: ...`, what
    /// scripts/device-session.sh prints).
    pub fn render(&self) -> String {
        let reps = self.rows.iter().map(|r| r.reps).max().unwrap_or(0);
        let mut out = format!(
            "\nCopy beside short launches: the chain (511 dependent launches, one sync) alone, then beside a client \
             copying {} up and down round after round, in {} round(s); ms, median of {reps} (min, max); goal: \
             beside / alone <= {:.2} through gpumuxd\n",
            size(self.bytes),
            self.rounds,
            self.goal
        );
        let cell = |c: &Option<Check>| c.as_ref().map_or("-", Check::cell).to_owned();
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    format!("chain: {}", r.setting),
                    r.copier.as_ref().map_or("alone".into(), |h| format!("beside a {h} copier")),
                    r.check.cell().into(),
                    format!("{:.3}", r.median_ms),
                    format!("{:.3}", r.min_ms),
                    format!("{:.3}", r.max_ms),
                    r.vs_alone.map_or("-".into(), |x| format!("{x:.2}x")),
                    r.min_vs_alone.map_or("-".into(), |x| format!("{x:.2}x")),
                    r.met().map_or("-".into(), |m| if m { "yes" } else { "NO" }.into()),
                    r.copier_rounds.map_or("-".into(), |n| n.to_string()),
                    cell(&r.copier_check),
                    r.copier_up_gb_s.map_or("-".into(), |x| format!("{x:.1}")),
                    r.copier_down_gb_s.map_or("-".into(), |x| format!("{x:.1}")),
                ]
            })
            .collect();
        out += &table(
            &[
                "chain: setting",
                "run",
                "check",
                "median",
                "min",
                "max",
                "vs alone",
                "min vs alone",
                "goal met",
                "copier rounds",
                "copier check",
                "up GB/s",
                "down GB/s",
            ],
            &rows,
        );
        for r in &self.rows {
            let run = r.copier.as_ref().map_or("alone".into(), |h| format!("beside a {h} copier"));
            for (who, check) in [("chain", Some(&r.check)), ("copier", r.copier_check.as_ref())] {
                match check {
                    Some(Check::Failed(why)) => out += &format!("  {}, {run}: {who} check FAILED: {why}\n", r.setting),
                    Some(Check::Skipped(why)) => {
                        out += &format!("  {}, {run}: {who} check skipped: {why}\n", r.setting)
                    }
                    _ => {}
                }
            }
        }
        for r in &self.rows {
            let (Some(host), Some(ratio), Some(met)) = (&r.copier, r.vs_alone, r.met()) else { continue };
            let min = r.min_vs_alone.map_or(String::new(), |m| format!(", min {m:.2}x"));
            let native = self
                .rows
                .iter()
                .find(|n| n.setting == "native" && n.copier.as_deref() == Some(host.as_str()))
                .and_then(|n| n.vs_alone)
                .map_or(String::new(), |n| format!(" (natively {n:.2}x)"));
            // Checks of both clients: a failure above all, then a skip (a simulated device).
            let checks = [Some(&r.check), r.copier_check.as_ref()];
            let word = if checks.iter().any(|c| matches!(c, Some(Check::Failed(_)))) {
                "FAILED"
            } else if checks.iter().any(|c| matches!(c, Some(Check::Skipped(_)))) {
                "skipped"
            } else {
                "ok"
            };
            out += &format!(
                "copy-beside: {host} copier, {}: chain {ratio:.2}x alone{min}{native}, goal <= {:.2}x: {}; checks {word}\n",
                r.setting,
                self.goal,
                if met { "met" } else { "NOT met" }
            );
        }
        out
    }
}

impl Bench {
    /// `--copy-beside-rounds` rounds of the chain alone, then beside each
    /// copier, in `mode` (`label`: the setting's name in the table); each
    /// run's results joined over the rounds.
    pub(super) fn copy_beside(&self, label: &str, mode: Mode, env: &Env) -> Result<Vec<CopyBesideRow>> {
        let reps = self.args.copy_beside_reps;
        let chain = Job::Program { program: Program::Chain { tiles: programs::CHAIN_TILES }, reps };
        let plan = |jobs| ProcPlan { mode, jobs, vars: Vec::new() };
        let rounds = self.args.copy_beside_rounds.max(1);
        let mut alone: Option<ProgramResult> = None;
        let mut beside: Vec<Option<(ProgramResult, CopierResult)>> = vec![None; COPIER_HOST_MEMORY.len()];
        for round in 1..=rounds {
            let of = format!("through {label}, round {round} of {rounds}");
            let r =
                self.setting(&format!("copy-beside: the chain alone {of}"), &[plan(vec![chain.clone()])], env, None)?;
            join_chain(&mut alone, program_of(r.first().and_then(|p| p.first()))?, round);
            for (host, joined) in COPIER_HOST_MEMORY.iter().zip(beside.iter_mut()) {
                let copier = Job::Copier { host: *host, bytes: self.args.program_copy_mib << 20 };
                let what = format!("copy-beside: the chain beside a {} copier {of}", host.name());
                let r = self.setting(&what, &[plan(vec![chain.clone()]), plan(vec![copier])], env, None)?;
                let chain = program_of(r.first().and_then(|p| p.first()))?;
                let copied = match r.get(1).and_then(|p| p.first()) {
                    Some(JobResult::Copier(c)) => c.clone(),
                    other => bail!("expected a copier result, got {other:?}"),
                };
                let (mut c, mut k) = joined.take().map_or((None, None), |(c, k)| (Some(c), Some(k)));
                join_chain(&mut c, chain, round);
                join_copier(&mut k, copied, round);
                *joined = c.zip(k);
            }
        }
        let Some(alone) = alone else { bail!("copy-beside ran no round") };
        let alone_row = CopyBesideRow::of(label, &alone, None, None);
        let mut rows = Vec::new();
        for (host, joined) in COPIER_HOST_MEMORY.iter().zip(&beside) {
            let Some((chain, copied)) = joined else {
                bail!("copy-beside ran no round beside a {} copier", host.name())
            };
            rows.push(CopyBesideRow::of(label, chain, Some((*host, copied)), Some(&alone_row)));
        }
        rows.insert(0, alone_row);
        Ok(rows)
    }
}

/// Adds round `round`'s repetitions of the chain to `all`; the first
/// failed check stands, named by its round, then a skip.
fn join_chain(all: &mut Option<ProgramResult>, r: ProgramResult, round: u32) {
    let Some(a) = all else {
        *all = Some(ProgramResult { check: in_round(r.check.clone(), round), ..r });
        return;
    };
    a.total_ns.extend(r.total_ns);
    a.check = join_check(std::mem::replace(&mut a.check, Check::Ok), r.check, round);
}

/// [`join_chain`] for a copier's rounds.
fn join_copier(all: &mut Option<CopierResult>, r: CopierResult, round: u32) {
    let Some(a) = all else {
        *all = Some(CopierResult { check: in_round(r.check.clone(), round), ..r });
        return;
    };
    a.upload_ns.extend(r.upload_ns);
    a.download_ns.extend(r.download_ns);
    a.check = join_check(std::mem::replace(&mut a.check, Check::Ok), r.check, round);
}

/// A failure's text prefixed with the experiment's round.
fn in_round(c: Check, round: u32) -> Check {
    match c {
        Check::Failed(why) => Check::Failed(format!("round {round} of the experiment: {why}")),
        c => c,
    }
}

/// The checks of two rounds as one: a failure first, then a skip.
fn join_check(so_far: Check, next: Check, round: u32) -> Check {
    match (so_far, in_round(next, round)) {
        (f @ Check::Failed(_), _) | (_, f @ Check::Failed(_)) => f,
        (s @ Check::Skipped(_), _) | (_, s @ Check::Skipped(_)) => s,
        _ => Check::Ok,
    }
}

fn program_of(r: Option<&JobResult>) -> Result<ProgramResult> {
    match r {
        Some(JobResult::Program(p)) => Ok(p.clone()),
        other => bail!("expected a program result, got {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(ms: &[u64]) -> ProgramResult {
        ProgramResult {
            total_ns: ms.iter().map(|m| m * 1_000_000).collect(),
            upload_ns: vec![],
            download_ns: vec![],
            bytes: 0,
            check: Check::Ok,
        }
    }

    #[test]
    fn the_ratio_is_the_median_beside_over_the_median_alone_of_the_same_setting_and_only_gpumuxd_has_the_goal() {
        let copier = CopierResult {
            bytes: 1 << 30,
            upload_ns: vec![100_000_000, 20_000_000, 30_000_000],
            download_ns: vec![50_000_000; 3],
            check: Check::Ok,
        };
        let (alone, beside) = (chain(&[10, 12, 11]), chain(&[13, 12, 11]));
        let a = CopyBesideRow::of("gpumux x", &alone, None, None);
        let b = CopyBesideRow::of("gpumux x", &beside, Some((HostMemory::Pinned, &copier)), Some(&a));
        assert_eq!((a.median_ms, a.vs_alone, a.met()), (11.0, None, None));
        assert!((b.vs_alone.unwrap() - 12.0 / 11.0).abs() < 1e-12 && b.met() == Some(true), "{b:?}");
        assert!((b.min_vs_alone.unwrap() - 1.1).abs() < 1e-12 && a.min_vs_alone.is_none(), "{b:?}");
        assert_eq!((b.copier_rounds, b.copier.as_deref()), (Some(3), Some("pinned")));
        // Median upload 30 ms, download 50 ms of 2^30 bytes.
        assert!((b.copier_up_gb_s.unwrap() - (1u64 << 30) as f64 / 30e6).abs() < 1e-9, "{b:?}");
        assert!((b.copier_down_gb_s.unwrap() - (1u64 << 30) as f64 / 50e6).abs() < 1e-9, "{b:?}");
        let slow = CopyBesideRow::of("gpumux x", &chain(&[13, 13]), Some((HostMemory::Pageable, &copier)), Some(&a));
        assert_eq!(slow.met(), Some(false));
        let native_alone = CopyBesideRow::of("native", &chain(&[10]), None, None);
        let native =
            CopyBesideRow::of("native", &chain(&[20]), Some((HostMemory::Pageable, &copier)), Some(&native_alone));
        assert_eq!((native.vs_alone, native.met()), (Some(2.0), None));
        let mut failed = copier.clone();
        failed.check = Check::Failed("round 2: word 0: not downloaded, expected 7".into());
        let bad = CopyBesideRow::of("gpumux x", &beside, Some((HostMemory::Pinned, &failed)), Some(&a));
        let report =
            CopyBesideReport { bytes: 1 << 30, rounds: 3, goal: GOAL, rows: vec![native_alone, native, a, slow, bad] };
        let text = report.render();
        assert!(text.contains("copying 1 GiB up and down round after round, in 3 round(s)"), "{text}");
        assert!(text.contains("gpumux x, beside a pinned copier: copier check FAILED: round 2: word 0"), "{text}");
        assert!(
            text.contains("copy-beside: pageable copier, gpumux x: chain 1.18x alone, min 1.30x (natively 2.00x), goal <= 1.10x: NOT met; checks ok"),
            "{text}"
        );
        assert!(
            text.contains(
                "copy-beside: pinned copier, gpumux x: chain 1.09x alone, min 1.10x, goal <= 1.10x: met; checks FAILED"
            ),
            "{text}"
        );
        assert!(!text.contains("copy-beside: pageable copier, native"), "native rows have no goal line: {text}");
    }

    #[test]
    fn rounds_join_their_repetitions_and_the_first_failure_stands_named_by_its_round() {
        let mut all = None;
        join_chain(&mut all, chain(&[5, 6]), 1);
        let mut failed = chain(&[7]);
        failed.check = Check::Failed("repetition 1: 3 of 9 values differ".into());
        join_chain(&mut all, failed, 2);
        let mut skipped = chain(&[8]);
        skipped.check = Check::Skipped("the simulated device computes nothing".into());
        join_chain(&mut all, skipped.clone(), 3);
        let all = all.unwrap();
        assert_eq!(all.total_ns, [5, 6, 7, 8].map(|m| m * 1_000_000));
        assert_eq!(all.check, Check::Failed("round 2 of the experiment: repetition 1: 3 of 9 values differ".into()));
        let mut some = None;
        join_chain(&mut some, chain(&[1]), 1);
        join_chain(&mut some, skipped, 2);
        assert!(matches!(some.unwrap().check, Check::Skipped(_)));
        let copier =
            |ns: u64, check: Check| CopierResult { bytes: 8, upload_ns: vec![ns], download_ns: vec![ns], check };
        let mut k = None;
        join_copier(&mut k, copier(1, Check::Failed("round 3: word 0: not downloaded, expected 7".into())), 1);
        join_copier(&mut k, copier(2, Check::Ok), 2);
        let k = k.unwrap();
        assert_eq!((k.upload_ns, k.download_ns), (vec![1, 2], vec![1, 2]));
        assert_eq!(
            k.check,
            Check::Failed("round 1 of the experiment: round 3: word 0: not downloaded, expected 7".into())
        );
    }
}

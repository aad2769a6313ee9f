//! The bench's figures (percentiles, STP, fairness) and its tables.

use super::programs::Check;
use serde::Serialize;

/// Nearest-rank percentile `p` (0-100) of `xs` (any order); 0 for none.
pub fn percentile(xs: &[u64], p: f64) -> u64 {
    if xs.is_empty() {
        return 0;
    }
    let mut v = xs.to_vec();
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

/// System throughput and fairness of a co-run from each job's normalised
/// turnaround time (time shared / time alone): STP = Σ 1/NTT; fairness =
/// the lower NTT over the higher (Eyerman & Eeckhout's metrics, as in the issue).
pub fn stp_fairness(ntt: &[f64]) -> (f64, f64) {
    let stp = ntt.iter().map(|n| 1.0 / n).sum();
    let lo = ntt.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = ntt.iter().cloned().fold(0.0, f64::max);
    (stp, if hi > 0.0 { lo / hi } else { 0.0 })
}

/// One row of the priority table.
#[derive(Clone, Debug, Serialize)]
pub struct PriorityRow {
    pub block_us: u64,
    pub setting: String,
    /// High-priority turnaround, µs.
    pub hp_p50_us: f64,
    pub hp_p99_us: f64,
    pub hp_max_us: f64,
    /// Low-priority blocks per second, and as a share of its rate alone (native).
    pub lp_blocks_per_s: Option<f64>,
    pub lp_share_of_alone: Option<f64>,
    /// Its rate over the rate with the same urgent kernels interleaved natively (one process, two streams).
    pub lp_vs_streams: Option<f64>,
    /// Through a daemon: the low-priority client's rate with no urgent
    /// client, as a share of its native rate alone (what the daemon costs it
    /// by itself; the rest of `lp_share_of_alone`'s loss is the urgent's).
    pub lp_alone_share: Option<f64>,
    /// Every block of both clients ran exactly once (`None` on a simulated
    /// device, which runs no kernel code, so nothing counts the blocks).
    pub no_work_lost: Option<bool>,
}

/// One row of the co-run table.
#[derive(Clone, Debug, Serialize)]
pub struct CorunRow {
    pub pair: String,
    pub setting: String,
    /// Time of each kernel's loop, shared / alone.
    pub ntt: Vec<f64>,
    pub stp: f64,
    pub fairness: f64,
    /// Each output equals the native run alone's, bitwise.
    pub outputs_equal: bool,
}

/// One kernel's loop alone through a daemon configuration, against the
/// same loop alone natively: what gpumux costs a kernel with nobody to
/// share with (the floor under its co-run NTTs).
#[derive(Clone, Debug, Serialize)]
pub struct SoloRow {
    pub kernel: String,
    pub setting: String,
    /// Time alone through the daemon / time alone natively.
    pub slowdown: f64,
    /// Its output equals the native run's, bitwise.
    pub output_equal: bool,
}

/// The request-overhead figures.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OverheadReport {
    /// Native figures: `None` on a simulated device (no native baseline).
    pub native_p50_us: Option<f64>,
    pub native_p99_us: Option<f64>,
    pub daemon_p50_us: f64,
    pub daemon_p99_us: f64,
    pub added_p50_us: Option<f64>,
    pub added_p99_us: Option<f64>,
    /// One native process's asynchronous launches per second.
    pub native_launches_per_s: Option<f64>,
    /// (clients, aggregate launches per second through the daemon).
    pub daemon_launches_per_s: Vec<(u32, f64)>,
    /// Where the added latency goes: the same daemon with its device
    /// in-process, and serving the simulator (no GPU, no device process).
    pub breakdown: Vec<LatencyRow>,
    /// (setting, clients, launches per second) through those, with the
    /// most clients the launch-rate figures ask for (`--rate-clients`).
    pub breakdown_rates: Vec<(String, u32, f64)>,
    /// Launch + sync after the path's threads went to sleep: native, then the daemon.
    pub idle: Vec<LatencyRow>,
}

/// Launch + sync latency through one daemon configuration.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyRow {
    pub setting: String,
    pub p50_us: f64,
    pub p99_us: f64,
}

impl LatencyRow {
    /// The row of `setting` from its samples, ns.
    pub fn of(setting: String, ns: &[u64]) -> LatencyRow {
        LatencyRow { setting, p50_us: percentile(ns, 50.0) as f64 / 1e3, p99_us: percentile(ns, 99.0) as f64 / 1e3 }
    }
}

/// One program in one setting (the programs experiment): its repetitions'
/// times, each from the first launch or copy to the final sync.
#[derive(Clone, Debug, Serialize)]
pub struct ProgramRow {
    /// `chain`, `stencil`, `copy, pageable`, ...
    pub program: String,
    /// `native` or the daemon configuration.
    pub setting: String,
    /// Its output against the CPU reference (every repetition).
    pub check: Check,
    pub reps: usize,
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    /// Copies: bytes each way, and GB/s (10^9 bytes/s) of the median upload
    /// and download (each with its sync).
    pub bytes: Option<u64>,
    pub upload_gb_s: Option<f64>,
    pub download_gb_s: Option<f64>,
    /// This median over the native median of the same program (and kind of
    /// host memory): `None` for the native rows and without a native row.
    pub vs_native: Option<f64>,
}

impl ProgramRow {
    /// The row of `program` in `setting` from its repetitions (ns).
    pub fn of(program: String, setting: String, r: &super::programs::ProgramResult) -> ProgramRow {
        let ms = |p: f64| percentile(&r.total_ns, p) as f64 / 1e6;
        let copies = r.bytes > 0 && !r.upload_ns.is_empty();
        let gb_s = |ns: &[u64]| {
            let t = percentile(ns, 50.0);
            (copies && t > 0).then(|| r.bytes as f64 / t as f64)
        };
        ProgramRow {
            program,
            setting,
            check: r.check.clone(),
            reps: r.total_ns.len(),
            median_ms: ms(50.0),
            min_ms: r.total_ns.iter().min().map_or(0.0, |&t| t as f64 / 1e6),
            max_ms: ms(100.0),
            bytes: copies.then_some(r.bytes),
            upload_gb_s: gb_s(&r.upload_ns),
            download_gb_s: gb_s(&r.download_ns),
            vs_native: None,
        }
    }
}

/// Everything one run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub device: String,
    pub default_policy: String,
    pub priority: Vec<PriorityRow>,
    pub corun: Vec<CorunRow>,
    pub solo: Vec<SoloRow>,
    pub overhead: Option<OverheadReport>,
    pub programs: Vec<ProgramRow>,
    /// What each program does (the programs table's legend).
    pub program_legend: Vec<String>,
    /// The chain alone and beside a copying client (`--only copy-beside`).
    pub copy_beside: Option<super::experiments::copy_beside::CopyBesideReport>,
    /// Four clients on every GPU against the same on one (`--only multi-gpu`).
    pub multi_gpu: Option<super::experiments::multi_gpu::MultiGpuReport>,
    /// What could not be measured, and why.
    pub notes: Vec<String>,
}

/// Left-aligned first column, right-aligned others.
pub(super) fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i == 0 {
                s += &format!("{c:<w$}", w = w[0]);
            } else {
                s += &format!("  {c:>w$}", w = w[i]);
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(head.to_vec());
    for r in rows {
        out += &line(r.iter().map(String::as_str).collect());
    }
    out
}

/// A check's cell: "yes", or a loud "NO".
fn yes_no(ok: bool) -> String {
    if ok { "yes" } else { "NO" }.into()
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

impl Report {
    /// The three tables, as printed.
    pub fn render(&self) -> String {
        let mut out =
            format!("gpumux bench daemon on {} (daemon default policy {})\n", self.device, self.default_policy);
        if !self.priority.is_empty() {
            out +=
                "\nCross-process priority: high-priority turnaround (µs) while a low-priority client fills the GPU\n";
            let rows: Vec<Vec<String>> = self
                .priority
                .iter()
                .map(|r| {
                    vec![
                        format!("{} µs blocks: {}", r.block_us, r.setting),
                        format!("{:.0}", r.hp_p50_us),
                        format!("{:.0}", r.hp_p99_us),
                        format!("{:.0}", r.hp_max_us),
                        opt(r.lp_share_of_alone, 3),
                        opt(r.lp_vs_streams, 3),
                        opt(r.lp_alone_share, 3),
                        r.no_work_lost.map_or("-".into(), yes_no),
                    ]
                })
                .collect();
            out += &table(&["setting", "p50", "p99", "max", "LP share", "LP/streams", "LP alone", "no loss"], &rows);
        }
        if !self.corun.is_empty() {
            out += "\nCo-run throughput: two kernels started together (NTT = time shared / time alone, native)\n";
            let rows: Vec<Vec<String>> = self
                .corun
                .iter()
                .map(|r| {
                    vec![
                        format!("{}: {}", r.pair, r.setting),
                        r.ntt.iter().map(|n| format!("{n:.2}")).collect::<Vec<_>>().join(" / "),
                        format!("{:.3}", r.stp),
                        format!("{:.3}", r.fairness),
                        yes_no(r.outputs_equal),
                    ]
                })
                .collect();
            out += &table(&["pair: setting", "NTT", "STP", "fairness", "outputs equal"], &rows);
        }
        if !self.solo.is_empty() {
            out += "\nEach co-run kernel alone through the daemon (time / native time alone)\n";
            let rows: Vec<Vec<String>> = self
                .solo
                .iter()
                .map(|r| {
                    vec![format!("{}: {}", r.kernel, r.setting), format!("{:.3}", r.slowdown), yes_no(r.output_equal)]
                })
                .collect();
            out += &table(&["kernel: setting", "slowdown", "output equal"], &rows);
        }
        if let Some(o) = &self.overhead {
            out += "\nRequest overhead: empty kernel launch + sync (µs)\n";
            let us = |v: Option<f64>| opt(v, 1);
            let rows = vec![
                vec!["native".into(), us(o.native_p50_us), us(o.native_p99_us)],
                vec!["gpumuxd".into(), us(Some(o.daemon_p50_us)), us(Some(o.daemon_p99_us))],
                vec!["added".into(), us(o.added_p50_us), us(o.added_p99_us)],
            ];
            let mut rows = rows;
            for b in o.breakdown.iter().chain(&o.idle) {
                rows.push(vec![b.setting.clone(), format!("{:.1}", b.p50_us), format!("{:.1}", b.p99_us)]);
            }
            out += &table(&["", "p50", "p99"], &rows);
            out += "\nAggregate asynchronous launches per second\n";
            let mut rows = vec![vec!["native, 1 process".into(), opt(o.native_launches_per_s, 0), "1.00".into()]];
            for &(k, r) in &o.daemon_launches_per_s {
                let ratio = o.native_launches_per_s.filter(|&n| n > 0.0).map(|n| r / n);
                rows.push(vec![format!("gpumuxd, {k} clients"), format!("{r:.0}"), opt(ratio, 2)]);
            }
            for (setting, k, r) in &o.breakdown_rates {
                let ratio = o.native_launches_per_s.filter(|&n| n > 0.0).map(|n| r / n);
                rows.push(vec![format!("{setting}, {k} clients"), format!("{r:.0}"), opt(ratio, 2)]);
            }
            out += &table(&["", "launches/s", "vs native"], &rows);
        }
        if !self.programs.is_empty() {
            out += &self.render_programs();
        }
        if let Some(c) = &self.copy_beside {
            out += &c.render();
        }
        if let Some(m) = &self.multi_gpu {
            out += &m.render();
        }
        for n in &self.notes {
            out += &format!("\nnote: {n}");
        }
        if !self.notes.is_empty() {
            out += "\n";
        }
        out
    }
}

impl Report {
    /// The programs table, its legend, and what each check that did not
    /// pass said.
    fn render_programs(&self) -> String {
        let reps = self.programs.iter().map(|r| r.reps).max().unwrap_or(0);
        let mut out = format!(
            "\nPrograms: ms from the first launch or copy to the final sync, median of {reps} (min, max); \
             check: the full output against a CPU reference\n"
        );
        let rows: Vec<Vec<String>> = self
            .programs
            .iter()
            .map(|r| {
                vec![
                    format!("{}: {}", r.program, r.setting),
                    r.check.cell().into(),
                    format!("{:.3}", r.median_ms),
                    format!("{:.3}", r.min_ms),
                    format!("{:.3}", r.max_ms),
                    opt(r.upload_gb_s, 1),
                    opt(r.download_gb_s, 1),
                    r.vs_native.map_or("-".into(), |x| format!("{x:.2}x")),
                ]
            })
            .collect();
        out +=
            &table(&["program: setting", "check", "median", "min", "max", "up GB/s", "down GB/s", "vs native"], &rows);
        for l in &self.program_legend {
            out += &format!("  {l}\n");
        }
        for r in &self.programs {
            match &r.check {
                Check::Failed(why) => out += &format!("  {}: {}: check FAILED: {why}\n", r.program, r.setting),
                Check::Skipped(why) => out += &format!("  {}: {}: check skipped: {why}\n", r.program, r.setting),
                Check::Ok => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let xs: Vec<u64> = (1..=100).rev().collect();
        assert_eq!(percentile(&xs, 50.0), 50);
        assert_eq!(percentile(&xs, 99.0), 99);
        assert_eq!(percentile(&xs, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn the_breakdown_rows_name_the_clients_they_ran() {
        let overhead = OverheadReport {
            daemon_launches_per_s: vec![(1, 50_000.0), (4, 80_000.0)],
            breakdown_rates: vec![("gpumux ppq-even-drain+in-process".into(), 4, 90_000.0)],
            ..OverheadReport::default()
        };
        let text = Report { overhead: Some(overhead), ..Report::default() }.render();
        assert!(text.contains("gpumux ppq-even-drain+in-process, 4 clients  "), "{text}");
        assert!(!text.contains("8 clients"), "{text}");
    }

    #[test]
    fn the_programs_table_says_what_failed_and_gives_gb_s_and_ratios() {
        use super::super::programs::ProgramResult;
        let result = |ms: u64, check: Check, bytes: u64| ProgramResult {
            total_ns: vec![ms * 1_000_000, (ms + 1) * 1_000_000, (ms + 2) * 1_000_000],
            upload_ns: if bytes > 0 { vec![500_000_000; 3] } else { vec![] },
            download_ns: if bytes > 0 { vec![250_000_000; 3] } else { vec![] },
            bytes,
            check,
        };
        let mut daemon =
            ProgramRow::of("chain".into(), "gpumux p".into(), &result(9, Check::Failed("3 differ".into()), 0));
        daemon.vs_native = Some(3.0);
        let report = Report {
            programs: vec![
                ProgramRow::of("chain".into(), "native".into(), &result(3, Check::Ok, 0)),
                daemon,
                ProgramRow::of("copy, pinned".into(), "native".into(), &result(800, Check::Ok, 1 << 30)),
            ],
            program_legend: vec!["chain: what it does".into()],
            ..Report::default()
        };
        let text = report.render();
        assert!(text.contains("median of 3 (min, max)"), "{text}");
        let line = |start: &str| text.lines().find(|l| l.starts_with(start)).unwrap_or_default().to_owned();
        let cells = |start: &str| line(start).split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(cells("chain: native")[2..], ["ok", "4.000", "3.000", "5.000", "-", "-", "-"], "{text}");
        assert_eq!(cells("chain: gpumux p")[3..], ["FAILED", "10.000", "9.000", "11.000", "-", "-", "3.00x"], "{text}");
        // 1 GiB in 0.5 s up, 0.25 s down.
        assert_eq!(cells("copy, pinned: native")[7..9], ["2.1", "4.3"], "{text}");
        assert!(text.contains("  chain: what it does\n"), "{text}");
        assert!(text.contains("  chain: gpumux p: check FAILED: 3 differ\n"), "{text}");
    }

    #[test]
    fn stp_and_fairness_match_the_issues_mps_figures() {
        // MPS in issue 14: NTT 1.74 / 1.04 gives STP 1.54, fairness 0.60.
        let (stp, fair) = stp_fairness(&[1.74, 1.04]);
        assert!((stp - 1.536).abs() < 0.001, "{stp}");
        assert!((fair - 0.598).abs() < 0.001, "{fair}");
    }
}

//! The comparison table `gpumux run` prints: one row per policy, the best
//! value of each column marked, and a legend (the JSON has the numbers only).

use crate::run::RunReport;
use gpumux_engine::metrics::PolicyMetrics;
use std::fmt::Write;

fn us(ns: f64) -> String {
    if ns.is_nan() {
        "-".into()
    } else {
        format!("{:.1}", ns / 1000.0)
    }
}

/// Which way a column improves.
#[derive(Clone, Copy)]
enum Better {
    Lower,
    Higher,
}

/// One marked column: its printed values per policy and which way is better.
struct Column {
    cells: Vec<String>,
    better: Better,
}

impl Column {
    fn new(r: &RunReport, better: Better, f: impl Fn(&PolicyMetrics) -> Option<f64>, decimals: usize) -> Self {
        let cells = r.policies.iter().map(|m| f(m).map_or("-".to_string(), |v| format!("{v:.decimals$}"))).collect();
        Column { cells, better }
    }

    /// The best printed value, compared as printed (so rows that look equal
    /// are marked alike); none when the column has fewer than two distinct
    /// values, where a mark would say nothing.
    fn best(&self) -> Option<&str> {
        let values: Vec<(f64, &str)> =
            self.cells.iter().filter_map(|c| c.parse::<f64>().ok().map(|v| (v, c.as_str()))).collect();
        let first = values.first()?;
        if values.iter().all(|(_, c)| *c == first.1) {
            return None;
        }
        let pick = |a: &(f64, &str), b: &(f64, &str)| a.0.total_cmp(&b.0);
        let best = match self.better {
            Better::Lower => values.iter().min_by(|a, b| pick(a, b)),
            Better::Higher => values.iter().max_by(|a, b| pick(a, b)),
        };
        best.map(|b| b.1)
    }

    /// Cell `i`, right-aligned in `width` characters, then `*` if best.
    fn cell(&self, i: usize, width: usize) -> String {
        let c = self.cells.get(i).map_or("-", String::as_str);
        let mark = if Some(c) == self.best() { '*' } else { ' ' };
        format!("{c:>width$}{mark}")
    }
}

pub fn render(r: &RunReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "workload {} on {} (seed {})", r.workload, r.device, r.seed);
    let _ = writeln!(
        s,
        "{:<18} {:>7}  {:>7}  {:>8}  {:>12}  {:>10} {:>10} {:>10} {:>6}  {:>12}",
        "policy", "ANTT", "STP", "fairness", "hp turn. ms", "preempt", "p50 us", "p99 us", "SM %", "makespan ms"
    );
    let antt = Column::new(r, Better::Lower, |m| Some(m.antt), 3);
    let stp = Column::new(r, Better::Higher, |m| Some(m.stp), 3);
    let fairness = Column::new(r, Better::Higher, |m| Some(m.fairness), 3);
    let hp = Column::new(r, Better::Lower, |m| m.high_priority_turnaround_ns.map(|v| v / 1e6), 3);
    let makespan = Column::new(r, Better::Lower, |m| Some(m.makespan_ns as f64 / 1e6), 3);
    for (i, m) in r.policies.iter().enumerate() {
        let pl = &m.preemption_latency;
        let _ = writeln!(
            s,
            "{:<18} {} {} {} {} {:>10} {:>10} {:>10} {:>6.1}  {}",
            m.policy,
            antt.cell(i, 7),
            stp.cell(i, 7),
            fairness.cell(i, 8),
            hp.cell(i, 12),
            pl.count,
            if pl.count > 0 { us(pl.p50_ns as f64) } else { "-".into() },
            if pl.count > 0 { us(pl.p99_ns as f64) } else { "-".into() },
            m.sm_utilisation * 100.0,
            makespan.cell(i, 12)
        );
    }
    // Per-process NTT, one column per policy: where each policy's slowdowns land.
    let _ = writeln!(s);
    let _ = write!(s, "{:<18} {:>5}", "NTT per process", "prio");
    for m in &r.policies {
        let _ = write!(s, " {:>14}", truncate(&m.policy, 14));
    }
    let _ = writeln!(s);
    if let Some(first) = r.policies.first() {
        for (i, p) in first.processes.iter().enumerate() {
            let _ = write!(s, "{:<18} {:>5}", truncate(&p.name, 18), p.priority);
            for m in &r.policies {
                let _ = write!(s, " {:>14.3}", m.processes.get(i).map_or(f64::NAN, |q| q.ntt));
            }
            let _ = writeln!(s);
        }
    }
    legend(&mut s, r);
    s
}

/// What the columns mean and which way is better (the definitions are those
/// of gpumux_engine::metrics), and why `hp turn.` may be empty.
fn legend(s: &mut String, r: &RunReport) {
    let _ = writeln!(s);
    let _ = writeln!(s, "* best in its column.  NTT = turnaround shared / alone, per process (1 = as fast as alone).");
    let _ = writeln!(s, "ANTT: mean NTT, lower is better.  STP: system throughput, sum of alone / shared, higher is");
    let _ = writeln!(s, "better (N processes that lose nothing give N).  fairness: slowest / fastest progress, higher");
    let _ = writeln!(s, "is better (1 = even).  hp turn.: mean turnaround of the highest-priority processes, lower is");
    let _ = writeln!(s, "better.  preempt: preemptions, p50/p99: their latency.  SM %: SM time with a block resident.");
    let priorities: Vec<i32> =
        r.policies.first().map(|m| m.processes.iter().map(|p| p.priority).collect()).unwrap_or_default();
    if let Some(p) = priorities.first() {
        if priorities.iter().all(|q| q == p) {
            let _ = writeln!(
                s,
                "hp turn. is `-`: every process has priority {p}, so priority policies (npq, ppq-*) have nothing \
                 to order and can match fcfs row for row."
            );
        }
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

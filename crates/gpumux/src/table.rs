//! The comparison table `gpumux run` prints: one row per policy.

use crate::run::RunReport;
use std::fmt::Write;

fn us(ns: f64) -> String {
    if ns.is_nan() {
        "-".into()
    } else {
        format!("{:.1}", ns / 1000.0)
    }
}

pub fn render(r: &RunReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "workload {} on {} (seed {})", r.workload, r.device, r.seed);
    let _ = writeln!(
        s,
        "{:<18} {:>7} {:>7} {:>8} {:>12} {:>10} {:>10} {:>10} {:>6} {:>12}",
        "policy", "ANTT", "STP", "fairness", "hp turn. ms", "preempt", "p50 us", "p99 us", "SM %", "makespan ms"
    );
    for m in &r.policies {
        let hp = m.high_priority_turnaround_ns.map_or("-".to_string(), |v| format!("{:.3}", v / 1e6));
        let pl = &m.preemption_latency;
        let _ = writeln!(
            s,
            "{:<18} {:>7.3} {:>7.3} {:>8.3} {:>12} {:>10} {:>10} {:>10} {:>6.1} {:>12.3}",
            m.policy,
            m.antt,
            m.stp,
            m.fairness,
            hp,
            pl.count,
            if pl.count > 0 { us(pl.p50_ns as f64) } else { "-".into() },
            if pl.count > 0 { us(pl.p99_ns as f64) } else { "-".into() },
            m.sm_utilisation * 100.0,
            m.makespan_ns as f64 / 1e6
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
    s
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

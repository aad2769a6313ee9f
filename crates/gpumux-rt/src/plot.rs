//! SVG line charts of the experiment results (Fig. 7 and 8), drawn with
//! `gpumux-svg`'s line chart in its figure style.

use std::path::Path;

use gpumux_svg::lines::{self, LineChart, LineStyle, Series};

use crate::experiment::{Fig7Result, Fig8Result};

/// Fig. 7: schedulability normalised to GLOBAL vs. `U_G` (bins where GLOBAL schedules at
/// least 10 sets, to keep noise off the chart).
pub fn fig7_svg(r: &Fig7Result, path: &Path) -> anyhow::Result<()> {
    let mut series = Vec::new();
    let mut lo: f64 = 1.0;
    for (k, name) in r.methods.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r
            .bins
            .iter()
            .filter(|b| b.schedulable[crate::experiment::GLOBAL] >= 10)
            .filter_map(|b| b.normalised[k].map(|y| ((b.ug_lo + b.ug_hi) / 2.0, y)))
            .collect();
        for &(_, y) in &pts {
            lo = lo.min(y);
        }
        series.push(Series { name: name.clone(), points: pts });
    }
    let xmax = r.bins.last().map(|b| b.ug_hi).unwrap_or(4.0);
    let chart = LineChart {
        title: &format!("Fig. 7: schedulability normalised to GLOBAL (P_D = 0, {} sets)", r.sets),
        x_desc: "total GPU utilisation U_G",
        y_desc: "schedulable / schedulable(GLOBAL)",
        x_range: 0.0..xmax,
        y_range: (lo - 0.05).clamp(0.0, 0.9)..1.02,
    };
    Ok(lines::draw(path, &chart, &LineStyle::figure(), &series)?)
}

/// Fig. 8: schedulable sets vs. `P_D` at `U_G = 1.2`.
pub fn fig8_svg(r: &Fig8Result, path: &Path) -> anyhow::Result<()> {
    let mut series = Vec::new();
    let mut hi: f64 = 1.0;
    for (k, name) in r.methods.iter().enumerate() {
        let pts: Vec<(f64, f64)> = r.points.iter().map(|p| (p.p_dep, p.schedulable[k] as f64)).collect();
        for &(_, y) in &pts {
            hi = hi.max(y);
        }
        series.push(Series { name: name.clone(), points: pts });
    }
    let chart = LineChart {
        title: &format!("Fig. 8: schedulable sets at U_G = {} ({} sets per point)", r.ug, r.sets_per_point),
        x_desc: "probability of inter-kernel data dependency P_D",
        y_desc: "schedulable task sets",
        x_range: 0.0..1.0,
        y_range: 0.0..hi * 1.05,
    };
    Ok(lines::draw(path, &chart, &LineStyle::figure(), &series)?)
}

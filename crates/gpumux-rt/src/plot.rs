//! SVG line charts of the experiment results (plotters, SVG backend only: no fonts or
//! system libraries needed beyond what plotters' SVG backend emits as text).

use std::path::Path;

use plotters::prelude::*;

use crate::experiment::{Fig7Result, Fig8Result};

/// One named series of `(x, y)` points.
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(128, 128, 128),
    RGBColor(230, 97, 1),
    RGBColor(33, 102, 172),
    RGBColor(27, 158, 119),
    RGBColor(0, 0, 0),
    RGBColor(152, 78, 163),
];

/// Draws a line chart with markers into an SVG file.
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    x_range: (f64, f64),
    y_range: (f64, f64),
    series: &[Series],
) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (800, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x_range.0..x_range.1, y_range.0..y_range.1)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    for (i, s) in series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(s.points.iter().map(|&(x, y)| Circle::new((x, y), 3, color.filled())))
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerLeft)
        .draw()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    root.present().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(())
}

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
    line_chart(
        path,
        &format!("Fig. 7: schedulability normalised to GLOBAL (P_D = 0, {} sets)", r.sets),
        "total GPU utilisation U_G",
        "schedulable / schedulable(GLOBAL)",
        (0.0, xmax),
        ((lo - 0.05).clamp(0.0, 0.9), 1.02),
        &series,
    )
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
    line_chart(
        path,
        &format!("Fig. 8: schedulable sets at U_G = {} ({} sets per point)", r.ug, r.sets_per_point),
        "probability of inter-kernel data dependency P_D",
        "schedulable task sets",
        (0.0, 1.0),
        (0.0, hi * 1.05),
        &series,
    )
}

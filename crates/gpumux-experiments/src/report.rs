//! Text tables and SVG charts for the experiments.

use anyhow::{Context, Result};
use gpumux_svg::lines::{self, LineChart, LineStyle, Series};
use gpumux_svg::palette;
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;

/// A plain-text table: first column left-aligned, the rest right-aligned.
#[derive(Default)]
pub struct Table {
    /// Column titles.
    pub header: Vec<String>,
    /// Cells, row by row (cells beyond the header's columns are not shown).
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with these column titles.
    pub fn new(header: &[&str]) -> Self {
        Table { header: header.iter().map(|s| s.to_string()).collect(), rows: Vec::new() }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, columns padded to their widest cell.
    pub fn render(&self) -> String {
        let cols = self.header.len();
        let mut w = vec![0usize; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(cols) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in r.iter().enumerate().take(cols) {
                if i == 0 {
                    let _ = write!(out, "{c:<width$}", width = w[0]);
                } else {
                    let _ = write!(out, "  {c:>width$}", width = w[i]);
                }
            }
            out.push('\n');
        }
        out
    }
}

/// `x` with 2 decimals, or `-` for a missing value.
pub fn f2(x: Option<f64>) -> String {
    x.filter(|v| v.is_finite()).map_or("-".into(), |v| format!("{v:.2}"))
}

/// Arithmetic mean, `None` for no values.
pub fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Geometric mean (of speedups and ratios), `None` for no values or any value <= 0.
pub fn geomean(v: &[f64]) -> Option<f64> {
    (!v.is_empty() && v.iter().all(|x| *x > 0.0))
        .then(|| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

/// Largest value, `None` for no values.
pub fn max(v: &[f64]) -> Option<f64> {
    v.iter().cloned().reduce(f64::max)
}

/// Smallest value, `None` for no values.
pub fn min(v: &[f64]) -> Option<f64> {
    v.iter().cloned().reduce(f64::min)
}

/// Grouped bars: `values[group][series]` (NaN: no bar).
pub fn bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[String],
    values: &[Vec<f64>],
) -> Result<()> {
    let top = values.iter().flatten().cloned().filter(|v| v.is_finite()).fold(0.0, f64::max).max(1e-9) * 1.15;
    let root = SVGBackend::new(path, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let n = groups.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).y_desc(y_desc).label_style(("sans-serif", 13)).draw()?;
    let k = series.len().max(1) as f64;
    let width = 0.8 / k;
    for (j, name) in series.iter().enumerate() {
        let colour = palette::cycle(&palette::TAB10[..8], j);
        let rects = values.iter().enumerate().filter_map(move |(i, row)| {
            let v = *row.get(j)?;
            v.is_finite().then(|| {
                let x0 = i as f64 + 0.1 + j as f64 * width;
                Rectangle::new([(x0, 0.0), (x0 + width, v)], colour.filled())
            })
        });
        chart
            .draw_series(rects)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
    }
    let style = ("sans-serif", 13).into_font().color(&BLACK).pos(plotters::style::text_anchor::Pos::new(
        plotters::style::text_anchor::HPos::Center,
        plotters::style::text_anchor::VPos::Top,
    ));
    chart.draw_series(
        groups.iter().enumerate().map(|(i, g)| Text::new(g.clone(), (i as f64 + 0.5, 0.0), style.clone())),
    )?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Lines with points, on axes that fit them (`gpumux-svg`'s report style).
pub fn lines(path: &Path, title: &str, x_desc: &str, y_desc: &str, series: &[Series]) -> Result<()> {
    let (x_range, y_range) = lines::fit_ranges(series);
    let chart = LineChart { title, x_desc, y_desc, x_range, y_range };
    lines::draw(path, &chart, &LineStyle::report(), series)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_and_stats_are_right() {
        let mut t = Table::new(&["a", "bb"]);
        t.row(vec!["x".into(), "1.00".into()]);
        assert_eq!(t.render(), "a    bb\nx  1.00\n");
        assert_eq!(geomean(&[1.0, 4.0]), Some(2.0));
        assert_eq!(mean(&[]), None);
        assert_eq!(f2(Some(f64::NAN)), "-");
    }
}

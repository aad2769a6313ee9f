//! Line charts with a marker at every point and a legend: the experiments'
//! sweeps (`gpumux experiment`) and the real-time figures (`gpumux rt
//! experiment`). The two differ only in [`LineStyle`].

use crate::palette;
use crate::SvgError;
use plotters::prelude::*;
use std::ops::Range;
use std::path::Path;

/// One named line of `(x, y)` points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// Points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// What a line chart shows: title, axis names and the ranges the axes span.
#[derive(Clone, Debug)]
pub struct LineChart<'a> {
    /// Caption above the plot.
    pub title: &'a str,
    /// Name of the x axis.
    pub x_desc: &'a str,
    /// Name of the y axis.
    pub y_desc: &'a str,
    /// Values the x axis spans.
    pub x_range: Range<f64>,
    /// Values the y axis spans.
    pub y_range: Range<f64>,
}

/// How a line chart looks.
#[derive(Clone, Debug)]
pub struct LineStyle {
    /// Width and height, pixels.
    pub size: (u32, u32),
    /// Font size of the title.
    pub title_font: i32,
    /// Height of the area under the plot for the x ticks and name.
    pub x_label_area: u32,
    /// Font size of tick labels (`None`: plotters' default).
    pub tick_font: Option<i32>,
    /// Series colours, repeated when there are more series.
    pub palette: &'static [RGBColor],
    /// Where the legend sits.
    pub legend_at: SeriesLabelPosition,
    /// Opacity of the legend's white background (the lines show through a little).
    pub legend_opacity: f64,
    /// Length of the line sample next to each legend entry, pixels.
    pub legend_sample: i32,
}

impl LineStyle {
    /// The experiments' report charts: the first eight Tableau colours
    /// (repeating), legend upper left.
    pub fn report() -> Self {
        LineStyle {
            size: (900, 480),
            title_font: 18,
            x_label_area: 40,
            tick_font: Some(13),
            palette: &palette::TAB10[..8],
            legend_at: SeriesLabelPosition::UpperLeft,
            legend_opacity: 0.85,
            legend_sample: 14,
        }
    }

    /// The real-time figures (Fig. 7 and 8 of GPU-SPARC): their own colours,
    /// legend lower left where schedulability curves leave room.
    pub fn figure() -> Self {
        LineStyle {
            size: (800, 520),
            title_font: 22,
            x_label_area: 45,
            tick_font: None,
            palette: &palette::FIGURES,
            legend_at: SeriesLabelPosition::LowerLeft,
            legend_opacity: 0.8,
            legend_sample: 20,
        }
    }
}

/// Draws `series` as lines with round markers into the SVG file `path`.
pub fn draw(path: &Path, chart: &LineChart<'_>, style: &LineStyle, series: &[Series]) -> Result<(), SvgError> {
    let failed = |source| SvgError { path: path.to_path_buf(), source };
    let root = SVGBackend::new(path, style.size).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let mut plot = ChartBuilder::on(&root)
        .caption(chart.title, ("sans-serif", style.title_font))
        .margin(12)
        .x_label_area_size(style.x_label_area)
        .y_label_area_size(60)
        .build_cartesian_2d(chart.x_range.clone(), chart.y_range.clone())
        .map_err(failed)?;
    let mut mesh = plot.configure_mesh();
    mesh.x_desc(chart.x_desc).y_desc(chart.y_desc);
    if let Some(size) = style.tick_font {
        mesh.label_style(("sans-serif", size));
    }
    mesh.draw().map_err(failed)?;
    let sample = style.legend_sample;
    for (i, s) in series.iter().enumerate() {
        let colour = palette::cycle(style.palette, i);
        plot.draw_series(LineSeries::new(s.points.iter().copied(), colour.stroke_width(2)))
            .map_err(failed)?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + sample, y)], colour.stroke_width(2)));
        plot.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, colour.filled()))).map_err(failed)?;
    }
    plot.configure_series_labels()
        .position(style.legend_at.clone())
        .background_style(WHITE.mix(style.legend_opacity))
        .border_style(BLACK)
        .draw()
        .map_err(failed)?;
    root.present().map_err(failed)?;
    Ok(())
}

/// Axis ranges that hold every finite point of `series`: x as the points
/// span it, y from 0 (or the lowest point, if below) to 10% above the
/// highest. Without finite points, 0..1 on both axes.
pub fn fit_ranges(series: &[Series]) -> (Range<f64>, Range<f64>) {
    let pts = || series.iter().flat_map(|s| s.points.iter()).filter(|p| p.0.is_finite() && p.1.is_finite());
    let (x0, x1) = pts().fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.0), a.1.max(p.0)));
    let (y0, y1) = pts().fold((f64::MAX, f64::MIN), |a, p| (a.0.min(p.1), a.1.max(p.1)));
    // A single x or y value still gets an axis of non-zero length.
    let x = if x0 <= x1 { x0..x1.max(x0 + 1e-9) } else { 0.0..1.0 };
    let y = if y0 <= y1 { y0.min(0.0)..y1.max(y0 + 1e-9) * 1.1 } else { 0.0..1.0 };
    (x, y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(points: &[(f64, f64)]) -> Series {
        Series { name: "s".into(), points: points.to_vec() }
    }

    #[test]
    fn ranges_hold_the_finite_points_with_headroom() {
        let (x, y) = fit_ranges(&[series(&[(1.0, 2.0), (3.0, f64::NAN)]), series(&[(2.0, 5.0)])]);
        assert_eq!(x, 1.0..2.0, "the NaN point's x is left out with it");
        assert_eq!(y.start, 0.0);
        assert!((y.end - 5.5).abs() < 1e-12, "{y:?}");
        let (x, y) = fit_ranges(&[series(&[(4.0, -1.0)])]);
        assert!(x.start == 4.0 && x.end > 4.0, "one point still spans an axis: {x:?}");
        assert_eq!(y.start, -1.0);
        assert_eq!(fit_ranges(&[]), (0.0..1.0, 0.0..1.0));
    }

    #[test]
    fn draws_every_series_with_its_legend() {
        let dir = tempfile::Builder::new().prefix("gpumux-svg-lines-").tempdir().expect("a temporary directory");
        let path = dir.path().join("lines.svg");
        let chart = LineChart { title: "t", x_desc: "x", y_desc: "y", x_range: 0.0..2.0, y_range: 0.0..2.0 };
        let lines = [
            Series { name: "alpha".into(), points: vec![(0.0, 1.0), (2.0, 2.0)] },
            Series { name: "beta".into(), points: vec![(0.0, 0.5)] },
        ];
        draw(&path, &chart, &LineStyle::figure(), &lines).expect("drawn");
        let svg = std::fs::read_to_string(&path).expect("written");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("alpha") && svg.contains("beta"), "legend names both series");
        assert_eq!(svg.matches("<circle").count(), 3, "one marker per point");
    }

    #[test]
    fn an_unwritable_path_is_an_error_naming_it() {
        let path = Path::new("/nonexistent-gpumux-dir/chart.svg");
        let chart = LineChart { title: "t", x_desc: "x", y_desc: "y", x_range: 0.0..1.0, y_range: 0.0..1.0 };
        let err = draw(path, &chart, &LineStyle::report(), &[]).expect_err("no such folder");
        assert!(err.to_string().contains("/nonexistent-gpumux-dir/chart.svg"), "{err}");
    }
}

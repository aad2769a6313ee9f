//! SVG charts of a comparison run: summary metrics, per-process NTT,
//! preemption latency and one Gantt timeline per traced policy.
//!
//! Only plotters' SVG backend is used: it writes text as `<text>` elements,
//! so no font files are needed on the machine that makes the plots.

use anyhow::{bail, Context, Result};
use gpumux_engine::device::TraceSpan;
use gpumux_engine::metrics::PolicyMetrics;
use gpumux_svg::axis::{short_number, LabelledAxis};
use gpumux_svg::palette;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Most rectangles drawn in one timeline; beyond this an SVG gets too large
/// for a browser to render comfortably (each rectangle is ~100 bytes).
const MAX_RECTS: usize = 200_000;

/// Preemption spans are drawn over kernels, so they need a colour no
/// process gets.
const PREEMPT_COLOUR: RGBColor = RGBColor(0, 0, 0);
/// Spans without a process (e.g. device-internal work).
const NO_PROCESS_COLOUR: RGBColor = RGBColor(190, 190, 190);

/// Stable colour per process id, so a process looks the same in every
/// policy's timeline.
fn process_colour(process: Option<u32>) -> RGBColor {
    match process {
        Some(p) => palette::series(p as usize),
        None => NO_PROCESS_COLOUR,
    }
}

/// Writes the SVGs into `dir` (created if needed) and returns their paths.
pub fn write_plots(
    dir: &Path,
    metrics: &[PolicyMetrics],
    timelines: &[(String, u16, Vec<TraceSpan>)],
) -> Result<Vec<PathBuf>> {
    if metrics.is_empty() {
        bail!("nothing to plot: no policy metrics");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating plot directory {}", dir.display()))?;
    let mut written = Vec::new();

    let path = dir.join("summary.svg");
    write_summary(&path, metrics).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);

    let path = dir.join("ntt.svg");
    write_ntt(&path, metrics).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);

    let path = dir.join("preemption.svg");
    write_preemption(&path, metrics).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);

    // Two policy names can sanitise to the same file name; number the
    // later ones rather than overwrite.
    let mut used = BTreeSet::new();
    for (policy, num_sms, spans) in timelines {
        let base = format!("timeline-{}", sanitise(policy));
        let mut name = base.clone();
        let mut n = 2;
        while !used.insert(name.clone()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        let path = dir.join(format!("{name}.svg"));
        write_timeline(&path, policy, *num_sms, spans).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

/// Keeps file names portable: ASCII letters, digits, `-`, `_`, `.`.
fn sanitise(name: &str) -> String {
    let s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' }).collect();
    // A leading dot would hide the file; an empty name would give "timeline-.svg".
    let s = s.trim_start_matches('.').to_string();
    if s.is_empty() {
        "policy".to_string()
    } else {
        s
    }
}

/// A grouped bar chart: `values[group][series]`; non-finite values (and, on
/// a log axis, non-positive ones) are left out rather than drawn as garbage.
struct Bars<'a> {
    title: String,
    y_desc: &'a str,
    groups: Vec<String>,
    series: Vec<(String, RGBColor)>,
    values: Vec<Vec<f64>>,
    log_y: bool,
    legend: bool,
    /// Print each bar's value above it (only readable for few bars).
    value_labels: bool,
}

impl Bars<'_> {
    fn drawable(&self, v: f64) -> bool {
        v.is_finite() && (!self.log_y || v > 0.0)
    }

    fn y_range(&self) -> (f64, f64) {
        let vals = self.values.iter().flatten().copied().filter(|&v| self.drawable(v));
        let (lo, hi) = vals.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if self.log_y {
            if lo.is_finite() && hi.is_finite() {
                // Headroom of a factor 2 each way keeps bars off the frame.
                (lo / 2.0, hi * 2.0)
            } else {
                (1.0, 10.0)
            }
        } else {
            let lo = if lo.is_finite() { lo.min(0.0) } else { 0.0 };
            let hi = if hi.is_finite() && hi > 0.0 { hi * 1.15 } else { 1.0 };
            (lo * 1.15, hi)
        }
    }
}

fn draw_bars(area: &DrawingArea<SVGBackend<'_>, Shift>, bars: &Bars<'_>) -> Result<()> {
    let (lo, hi) = bars.y_range();
    if bars.log_y {
        draw_bars_on(area, bars, (lo..hi).log_scale(), lo)
    } else {
        draw_bars_on(area, bars, lo..hi, 0.0)
    }
}

/// Shared by the linear and log variants, whose coordinate types differ.
fn draw_bars_on<Y>(area: &DrawingArea<SVGBackend<'_>, Shift>, bars: &Bars<'_>, y_spec: Y, base: f64) -> Result<()>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let n = bars.groups.len();
    // Groups sit on [i, i+1); labelling the centres i + 0.5 puts each policy
    // name under its bars.
    let x_spec = LabelledAxis { range: 0.0..n.max(1) as f64, ticks: (0..n).map(|i| i as f64 + 0.5).collect() };
    let mut chart = ChartBuilder::on(area)
        .caption(&bars.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_spec, y_spec)?;
    let groups = &bars.groups;
    let x_fmt = |x: &f64| {
        let i = x.floor();
        if i >= 0.0 {
            groups.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let y_fmt = |y: &f64| short_number(*y);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .y_desc(bars.y_desc)
        .x_desc("policy")
        .label_style(("sans-serif", 14))
        .draw()?;

    let k = bars.series.len().max(1) as f64;
    let width = 0.8 / k;
    for (j, (name, colour)) in bars.series.iter().enumerate() {
        let colour = *colour;
        let rects = bars.values.iter().enumerate().filter_map(|(i, row)| {
            let v = *row.get(j)?;
            bars.drawable(v).then(|| {
                let x0 = i as f64 + 0.1 + j as f64 * width;
                Rectangle::new([(x0, base), (x0 + width, v)], colour.filled())
            })
        });
        let anno = chart.draw_series(rects)?;
        if bars.legend {
            anno.label(name.as_str())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        }
        if bars.value_labels {
            let labels = bars.values.iter().enumerate().filter_map(|(i, row)| {
                let v = *row.get(j)?;
                bars.drawable(v).then(|| {
                    let x = i as f64 + 0.1 + (j as f64 + 0.5) * width;
                    let style = ("sans-serif", 13).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
                    Text::new(short_number(v), (x, v), style)
                })
            });
            chart.draw_series(labels)?;
        }
    }
    if bars.legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }
    Ok(())
}

fn policy_names(metrics: &[PolicyMetrics]) -> Vec<String> {
    metrics.iter().map(|m| m.policy.clone()).collect()
}

/// Picks one metric out of a policy's results.
type MetricOf = fn(&PolicyMetrics) -> f64;

/// Chart width growing with the number of bars, within sane bounds.
fn width_for(bars: usize, per_bar: u32, min: u32, max: u32) -> u32 {
    u32::try_from(bars).unwrap_or(u32::MAX).saturating_mul(per_bar).saturating_add(300).clamp(min, max)
}

fn write_summary(path: &Path, metrics: &[PolicyMetrics]) -> Result<()> {
    let width = width_for(metrics.len(), 160, 1200, 3600);
    let root = SVGBackend::new(path, (width, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 3));
    let specs: [(&str, &str, MetricOf, usize); 3] = [
        ("ANTT (lower is better)", "ANTT", |m| m.antt, 0),
        ("STP (higher is better)", "STP", |m| m.stp, 1),
        ("Fairness (1 = fair)", "fairness", |m| m.fairness, 2),
    ];
    for (panel, (title, y_desc, get, colour)) in panels.iter().zip(specs) {
        let bars = Bars {
            title: title.to_string(),
            y_desc,
            groups: policy_names(metrics),
            series: vec![(y_desc.to_string(), palette::series(colour))],
            values: metrics.iter().map(|m| vec![get(m)]).collect(),
            log_y: false,
            legend: false,
            value_labels: metrics.len() <= 16,
        };
        draw_bars(panel, &bars)?;
    }
    root.present()?;
    Ok(())
}

fn write_ntt(path: &Path, metrics: &[PolicyMetrics]) -> Result<()> {
    // Processes are matched across policies by name, in first-seen order,
    // so each keeps one colour even if a policy lists them differently.
    let mut names: Vec<&str> = Vec::new();
    for p in metrics.iter().flat_map(|m| &m.processes) {
        if !names.contains(&p.name.as_str()) {
            names.push(&p.name);
        }
    }
    let values = metrics
        .iter()
        .map(|m| names.iter().map(|n| m.processes.iter().find(|p| p.name == *n).map_or(f64::NAN, |p| p.ntt)).collect())
        .collect();
    let bars = Bars {
        title: "Normalised turnaround time per process (1 = as fast as alone)".to_string(),
        y_desc: "NTT",
        groups: policy_names(metrics),
        series: names.iter().enumerate().map(|(i, n)| (n.to_string(), palette::series(i))).collect(),
        values,
        log_y: false,
        legend: true,
        value_labels: false,
    };
    let width = width_for(names.len().max(1).saturating_mul(metrics.len()), 60, 1000, 4000);
    let root = SVGBackend::new(path, (width, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    draw_bars(&root, &bars)?;
    root.present()?;
    Ok(())
}

fn write_preemption(path: &Path, metrics: &[PolicyMetrics]) -> Result<()> {
    let with: Vec<&PolicyMetrics> = metrics.iter().filter(|m| m.preemption_latency.count > 0).collect();
    let root = SVGBackend::new(path, (1100, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    if with.is_empty() {
        let (w, h) = root.dim_in_pixel();
        let centre = Pos::new(HPos::Center, VPos::Center);
        root.draw(&Text::new(
            "Preemption latency".to_string(),
            (w as i32 / 2, 40),
            ("sans-serif", 22).into_font().color(&BLACK).pos(centre),
        ))?;
        root.draw(&Text::new(
            format!("no preemptions ({})", policy_names(metrics).join(", ")),
            (w as i32 / 2, h as i32 / 2),
            ("sans-serif", 18).into_font().color(&BLACK).pos(centre),
        ))?;
        root.present()?;
        return Ok(());
    }
    let us = |ns: u64| ns as f64 / 1_000.0;
    let values: Vec<Vec<f64>> = with
        .iter()
        .map(|m| {
            let l = &m.preemption_latency;
            vec![us(l.p50_ns), us(l.p99_ns), us(l.max_ns)]
        })
        .collect();
    // A log axis only when a linear one would flatten the small bars.
    let positive = values.iter().flatten().copied().filter(|v| *v > 0.0);
    let (lo, hi) = positive.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let log_y = lo.is_finite() && hi / lo > 100.0;
    let skipped = metrics.len() - with.len();
    let mut title = format!("Preemption latency{}", if log_y { " (log scale)" } else { "" });
    if skipped > 0 {
        let noun = if skipped == 1 { "policy" } else { "policies" };
        title.push_str(&format!("; {skipped} {noun} without preemptions omitted"));
    }
    let bars = Bars {
        title,
        y_desc: "latency (µs)",
        groups: with.iter().map(|m| m.policy.clone()).collect(),
        series: vec![
            ("p50".to_string(), palette::series(0)),
            ("p99".to_string(), palette::series(1)),
            ("max".to_string(), palette::series(3)),
        ],
        values,
        log_y,
        legend: true,
        value_labels: false,
    };
    draw_bars(&root, &bars)?;
    root.present()?;
    Ok(())
}

/// One rectangle of a timeline, in nanoseconds on a lane.
#[derive(Clone, Copy)]
struct Rect {
    lane: u32,
    start: u64,
    end: u64,
    preempt: bool,
    process: Option<u32>,
}

impl Rect {
    fn same_look(&self, other: &Rect) -> bool {
        self.lane == other.lane && self.preempt == other.preempt && self.process == other.process
    }
}

/// Cuts `rects` down to at most `MAX_RECTS`, coarsening only as far as
/// needed; returns a note for the title saying what was done, if anything.
fn reduce(mut rects: Vec<Rect>, ns_per_px: f64) -> (Vec<Rect>, Option<String>) {
    let original = rects.len();
    if original <= MAX_RECTS {
        return (rects, None);
    }
    // 1. Merge same-looking neighbours on a lane separated by under a pixel:
    //    invisible at this resolution.
    rects.sort_by_key(|r| (r.lane, r.preempt, r.process, r.start));
    let gap = ns_per_px.max(0.0) as u64;
    let mut merged: Vec<Rect> = Vec::with_capacity(rects.len() / 2);
    for r in rects {
        match merged.last_mut() {
            Some(last) if last.same_look(&r) && r.start <= last.end.saturating_add(gap) => {
                last.end = last.end.max(r.end);
            }
            _ => merged.push(r),
        }
    }
    let mut note = format!("{original} spans merged to {} at pixel resolution", merged.len());
    // 2. Drop what is still narrower than a pixel.
    if merged.len() > MAX_RECTS {
        let before = merged.len();
        merged.retain(|r| (r.end - r.start) as f64 >= ns_per_px);
        note.push_str(&format!(", {} sub-pixel spans skipped", before - merged.len()));
    }
    // 3. Last resort: keep the widest.
    if merged.len() > MAX_RECTS {
        let before = merged.len();
        merged.select_nth_unstable_by_key(MAX_RECTS, |r| std::cmp::Reverse(r.end - r.start));
        merged.truncate(MAX_RECTS);
        note.push_str(&format!(", only the {MAX_RECTS} widest of {before} drawn"));
    }
    (merged, Some(note))
}

fn write_timeline(path: &Path, policy: &str, num_sms: u16, spans: &[TraceSpan]) -> Result<()> {
    use crate::trace::lane_name;

    let sms = u32::from(num_sms);
    // Every SM and both copy engines get a row even when idle, plus any
    // stray lane the spans name.
    let rows = spans.iter().map(|s| s.lane.saturating_add(1)).max().unwrap_or(0).max(sms + 2);
    let end_ns = spans.iter().map(|s| s.end_ns).max().unwrap_or(0).max(1);
    let end_ms = end_ns as f64 / 1e6;

    let (width, height) = (1600u32, rows.saturating_mul(14).saturating_add(140).clamp(420, 2400));
    let (margin, y_label_area) = (12u32, 90u32);
    let plot_px = f64::from(width.saturating_sub(2 * margin + y_label_area).max(1));
    let ns_per_px = end_ns as f64 / plot_px;

    let rects: Vec<Rect> = spans
        .iter()
        .map(|s| Rect {
            lane: s.lane,
            start: s.start_ns,
            end: s.end_ns.max(s.start_ns),
            preempt: s.category == "preempt",
            process: s.process.map(|p| p.0),
        })
        .collect();
    let (rects, note) = reduce(rects, ns_per_px);

    let mut title = format!("Timeline: {policy}");
    if spans.is_empty() {
        title.push_str(" (no spans)");
    }
    if let Some(note) = &note {
        title.push_str(&format!(" ({note})"));
    }

    let root = SVGBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE)?;
    // Row r is drawn at y = rows-1-r so SM 0 is at the top, as in a trace
    // viewer. Label every k-th SM so the axis stays readable on big GPUs;
    // copy engines are always labelled.
    let step = (rows / 40).max(1);
    let key_points: Vec<f64> = (0..rows)
        .filter(|&lane| lane >= sms || lane % step == 0)
        .map(|lane| f64::from(rows - 1 - lane) + 0.5)
        .collect();
    let y_spec = LabelledAxis { range: 0.0..f64::from(rows), ticks: key_points };
    let mut chart = ChartBuilder::on(&root)
        .caption(&title, ("sans-serif", 18))
        .margin(margin)
        .x_label_area_size(40)
        .y_label_area_size(y_label_area)
        .build_cartesian_2d(0.0..end_ms, y_spec)?;
    let y_fmt = |y: &f64| {
        let row = y.floor();
        if row < 0.0 || row >= f64::from(rows) {
            return String::new();
        }
        lane_name(rows - 1 - row as u32, num_sms)
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("time (ms)")
        .y_label_formatter(&y_fmt)
        .label_style(("sans-serif", 12))
        .draw()?;

    // A rectangle must be at least a pixel wide or the SVG rounds it away.
    let min_ms = ns_per_px / 1e6;
    let to_rect = |r: &Rect, colour: RGBColor| {
        let y = f64::from(rows - 1 - r.lane);
        // Preemption spans are thin bars in the middle of the row, drawn
        // over the kernels so both stay visible.
        let (y0, y1) = if r.preempt { (y + 0.35, y + 0.65) } else { (y + 0.1, y + 0.9) };
        let x0 = r.start as f64 / 1e6;
        let x1 = (r.end as f64 / 1e6).max(x0 + min_ms);
        Rectangle::new([(x0, y0), (x1, y1)], colour.filled())
    };
    // One series per process so the legend names each colour; BTreeMap for
    // a deterministic order.
    let mut by_process: BTreeMap<Option<u32>, Vec<&Rect>> = BTreeMap::new();
    let mut preempts = Vec::new();
    for r in &rects {
        if r.preempt {
            preempts.push(r);
        } else {
            by_process.entry(r.process).or_default().push(r);
        }
    }
    // The legend would swamp the chart with dozens of processes.
    const MAX_LEGEND: usize = 16;
    for (i, (process, group)) in by_process.iter().enumerate() {
        let colour = process_colour(*process);
        let anno = chart.draw_series(group.iter().map(|r| to_rect(r, colour)))?;
        if i < MAX_LEGEND {
            let label = match process {
                Some(p) => format!("process {p}"),
                None => "no process".to_string(),
            };
            anno.label(label).legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled()));
        }
    }
    if !preempts.is_empty() {
        chart
            .draw_series(preempts.iter().map(|r| to_rect(r, PREEMPT_COLOUR)))?
            .label("preemption")
            .legend(|(x, y)| Rectangle::new([(x, y - 2), (x + 12, y + 2)], PREEMPT_COLOUR.filled()));
    }
    if !rects.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumux_engine::ids::ProcessId;
    use gpumux_engine::metrics::{LatencySummary, ProcessMetrics};

    /// A folder for the charts that does not exist yet (`write_plots` makes
    /// it), inside a new temporary directory: the test holds that, and
    /// dropping it removes both, pass or fail.
    fn temp_dir(tag: &str) -> (tempfile::TempDir, PathBuf) {
        let parent = tempfile::Builder::new().prefix("gpumux-plot-").tempdir().expect("a temporary directory");
        let dir = parent.path().join(tag);
        (parent, dir)
    }

    fn process(name: &str, ntt: f64) -> ProcessMetrics {
        ProcessMetrics {
            name: name.to_string(),
            priority: 0,
            ntt,
            turnaround_ns: 1_000_000,
            runs: 3,
            mean_run_ns: 1e6,
            alone_run_ns: 5e5,
        }
    }

    fn policy(name: &str, preemptions: usize, ntts: &[f64]) -> PolicyMetrics {
        PolicyMetrics {
            policy: name.to_string(),
            antt: ntts.iter().sum::<f64>() / ntts.len() as f64,
            stp: ntts.iter().map(|n| 1.0 / n).sum(),
            fairness: 0.8,
            makespan_ns: 5_000_000,
            high_priority_turnaround_ns: None,
            preemption_latency: if preemptions == 0 {
                LatencySummary::default()
            } else {
                LatencySummary { count: preemptions, p50_ns: 2_000, p99_ns: 40_000, max_ns: 900_000 }
            },
            sm_utilisation: 0.7,
            processes: ntts.iter().enumerate().map(|(i, n)| process(&format!("proc{i}"), *n)).collect(),
        }
    }

    fn span(lane: u32, cat: &str, start_ns: u64, end_ns: u64, process: Option<u32>) -> TraceSpan {
        TraceSpan {
            lane,
            name: "k".to_string(),
            category: cat.to_string(),
            start_ns,
            end_ns,
            process: process.map(ProcessId),
        }
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
    }

    #[test]
    fn writes_all_charts() {
        let (_tmp, dir) = temp_dir("all");
        let metrics = vec![
            policy("fifo", 0, &[1.5, 2.0]),
            policy("time-slice", 4, &[1.2, f64::NAN]),
            policy("prio/preempt", 2, &[1.1, 3.0]),
        ];
        let timelines = vec![
            (
                "prio/preempt".to_string(),
                2,
                vec![
                    span(0, "kernel", 0, 1_000_000, Some(0)),
                    span(0, "preempt", 1_000_000, 1_050_000, None),
                    span(1, "kernel", 200_000, 3_000_000, Some(1)),
                    span(2, "copy", 0, 100_000, Some(0)),
                ],
            ),
            ("fifo".to_string(), 2, Vec::new()),
        ];
        let paths = write_plots(&dir, &metrics, &timelines).expect("plots");
        let names: Vec<String> =
            paths.iter().filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
        assert_eq!(
            names,
            ["summary.svg", "ntt.svg", "preemption.svg", "timeline-prio_preempt.svg", "timeline-fifo.svg"]
        );
        for p in &paths {
            let svg = read(p);
            assert!(svg.starts_with("<svg"), "{} does not start with <svg", p.display());
            assert!(svg.trim_end().ends_with("</svg>"), "{} is truncated", p.display());
        }
        for svg in [read(&paths[0]), read(&paths[1])] {
            for name in ["fifo", "time-slice", "prio/preempt"] {
                assert!(svg.contains(name), "missing {name}");
            }
        }
        let ntt = read(&paths[1]);
        assert!(ntt.contains("proc0") && ntt.contains("proc1"), "legend names processes");
        let pre = read(&paths[2]);
        assert!(pre.contains("time-slice") && pre.contains("prio/preempt"));
        assert!(pre.contains("log scale"), "latencies span 450x, so log axis");
        assert!(read(&paths[3]).contains("prio/preempt"));
        assert!(read(&paths[3]).contains("SM 0") && read(&paths[3]).contains("copy D2H"));
        assert!(read(&paths[4]).contains("no spans"));
    }

    #[test]
    fn no_preemptions_still_writes_chart() {
        let (_tmp, dir) = temp_dir("nopre");
        let paths = write_plots(&dir, &[policy("fifo", 0, &[1.0])], &[]).expect("plots");
        assert_eq!(paths.len(), 3);
        let svg = read(&dir.join("preemption.svg"));
        assert!(svg.starts_with("<svg") && svg.contains("no preemptions") && svg.contains("fifo"));
    }

    #[test]
    fn all_nan_metrics_do_not_panic() {
        let (_tmp, dir) = temp_dir("nan");
        let mut m = policy("weird", 0, &[f64::NAN]);
        m.stp = f64::INFINITY;
        m.fairness = f64::NAN;
        let paths = write_plots(&dir, &[m], &[]).expect("plots");
        assert!(read(&paths[0]).contains("weird"));
    }

    #[test]
    fn empty_input_is_an_error() {
        let (_tmp, dir) = temp_dir("empty");
        let err = write_plots(&dir, &[], &[]).expect_err("no policies");
        assert!(err.to_string().contains("nothing to plot"));
        assert!(!dir.exists(), "no directory for nothing");
    }

    #[test]
    fn big_timeline_is_capped() {
        let (_tmp, dir) = temp_dir("big");
        // 300k back-to-back 10 ns spans on 4 SMs: merged per pixel.
        let spans: Vec<TraceSpan> = (0..300_000u64)
            .map(|i| span((i % 4) as u32, "kernel", (i / 4) * 10, (i / 4) * 10 + 10, Some((i % 3) as u32)))
            .collect();
        let paths = write_plots(&dir, &[policy("fifo", 0, &[1.0])], &[("fifo".to_string(), 4, spans)]).expect("plots");
        let svg = read(&paths[3]);
        assert!(svg.contains("merged"), "title says the spans were merged");
        assert!(svg.matches("<rect").count() < MAX_RECTS);
    }

    #[test]
    fn sanitises_file_names() {
        assert_eq!(sanitise("prio/preempt"), "prio_preempt");
        assert_eq!(sanitise("..x y"), "x_y");
        assert_eq!(sanitise(""), "policy");
        assert_eq!(sanitise("ok-1.2_x"), "ok-1.2_x");
    }
}

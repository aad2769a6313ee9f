//! Axes: one whose ticks sit exactly at chosen points (category centres, lane
//! rows) for a formatter to name, and short numbers for tick and bar labels.

use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use std::ops::Range;

/// A linear f64 axis whose ticks sit exactly at `ticks`, which a label
/// formatter then names. plotters' `with_key_points` would do, but it loses
/// the f64 value formatter that `configure_mesh` requires.
pub struct LabelledAxis {
    /// The values at the two ends of the axis.
    pub range: Range<f64>,
    /// Where the ticks (and their labels) go.
    pub ticks: Vec<f64>,
}

impl Ranged for LabelledAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        if span == 0.0 {
            return limit.0;
        }
        let frac = (value - self.range.start) / span;
        limit.0 + (frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        // Ticks are bold points only; light mesh lines would add nothing.
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

impl ValueFormatter<f64> for LabelledAxis {
    fn format(value: &f64) -> String {
        short_number(*value)
    }
}

/// A number in at most four significant characters or so, for axis ticks and
/// bar labels: `0`, `0.25`, `12.5`, `340`, `1.2e6`.
pub fn short_number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".to_string()
    } else if !(1e-3..1e6).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::coord::ranged1d::BoldPoints;

    #[test]
    fn short_numbers_keep_a_few_digits() {
        let shown: Vec<String> = [0.0, 0.25, 12.54, 340.4, 1.2e6, 2e-4, -3.0].into_iter().map(short_number).collect();
        assert_eq!(shown, ["0", "0.25", "12.5", "340", "1.2e6", "2.0e-4", "-3.00"]);
    }

    #[test]
    fn the_axis_maps_linearly_and_ticks_only_where_asked() {
        let axis = LabelledAxis { range: 0.0..4.0, ticks: vec![0.5, 1.5] };
        assert_eq!(axis.map(&0.0, (100, 500)), 100);
        assert_eq!(axis.map(&1.0, (100, 500)), 200);
        assert_eq!(axis.map(&4.0, (100, 500)), 500);
        assert_eq!(axis.key_points(BoldPoints(10)), vec![0.5, 1.5]);
        assert!(axis.key_points(10usize).is_empty(), "no light mesh lines");
        let flat = LabelledAxis { range: 2.0..2.0, ticks: Vec::new() };
        assert_eq!(flat.map(&7.0, (10, 90)), 10, "an empty range maps to its start, not NaN");
    }
}

//! Series colours. Every chart that shows processes or policies side by side
//! takes its colours from here, so the same index looks the same everywhere.

use plotters::style::{Color, Palette, Palette99, RGBColor};

/// Tableau 10: ten colours that stay distinct and readable next to each other.
pub const TAB10: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The real-time figures' colours (`gpumux rt experiment`), one per method in
/// the order the figures list them: grey for the single-GPU baseline, orange,
/// blue and green for LOCAL, GEMA and GEMA-LS, black for GLOBAL (the exact
/// reference); purple for a sixth.
pub const FIGURES: [RGBColor; 6] = [
    RGBColor(128, 128, 128),
    RGBColor(230, 97, 1),
    RGBColor(33, 102, 172),
    RGBColor(27, 158, 119),
    RGBColor(0, 0, 0),
    RGBColor(152, 78, 163),
];

/// The colour of series `index`: [`TAB10`], then plotters' 99-colour palette,
/// so a chart with many processes still gives each its own.
pub fn series(index: usize) -> RGBColor {
    match TAB10.get(index) {
        Some(c) => *c,
        None => {
            let c = Palette99::pick(index).to_rgba();
            RGBColor(c.0, c.1, c.2)
        }
    }
}

/// The colour of series `index` in a fixed palette, repeating it from the
/// start when there are more series than colours.
pub fn cycle(palette: &[RGBColor], index: usize) -> RGBColor {
    palette.get(index % palette.len().max(1)).copied().unwrap_or(RGBColor(0, 0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_colours_are_tableau_then_others() {
        assert_eq!(series(3), TAB10[3]);
        assert_eq!(series(9), TAB10[9]);
        assert!(!TAB10.contains(&series(10)), "the eleventh series repeats a Tableau colour");
        assert_ne!(series(10), series(11));
    }

    #[test]
    fn a_fixed_palette_repeats() {
        assert_eq!(cycle(&FIGURES, 1), FIGURES[1]);
        assert_eq!(cycle(&FIGURES, 7), FIGURES[1]);
        assert_eq!(cycle(&[], 3), RGBColor(0, 0, 0));
    }
}

//! The parts gpumux's SVG charts share, so the three places that draw them
//! (`gpumux run --plot`, `gpumux experiment`, `gpumux rt experiment`) pick
//! colours, label axes and draw line charts one way:
//!
//! * [`palette`]: the series colours;
//! * [`axis`]: an axis with ticks at chosen points, and short tick numbers;
//! * [`lines`]: a line chart with point markers and a legend, in two styles
//!   (the experiments' reports and the real-time figures).
//!
//! Only plotters' SVG backend is used: it writes text as `<text>` elements,
//! so no font files are needed on the machine that draws. Charts that only
//! one command draws (bars, timelines) stay with that command and use
//! plotters directly.

#![warn(missing_docs)]

pub mod axis;
pub mod lines;
pub mod palette;

use std::path::PathBuf;

/// A chart that could not be drawn or written, with the file it was for.
#[derive(Debug, thiserror::Error)]
#[error("drawing {}", path.display())]
pub struct SvgError {
    /// The SVG file being written.
    pub path: PathBuf,
    /// What plotters reported (a write error, or a layout it could not draw).
    #[source]
    pub source: plotters::drawing::DrawingAreaErrorKind<std::io::Error>,
}

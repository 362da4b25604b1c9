//! The charts of `fedge eval --plot PATH.png`, drawn with the plotters crate into an RGB buffer
//! that the `image` crate saves as PNG. Their text is set in DejaVu Sans, compiled into the
//! binary (the `dejavu` crate), so a chart looks the same on a headless gateway, in CI or on a
//! laptop, and no system font is ever looked up.
//!
//! - [`render_curves`] (`PATH.png`): held-out (target) accuracy after every round, one line per
//!   algorithm for the mean over seeds, with a shaded band from the lowest to the highest seed.
//! - [`render`] (`PATH-bars.png`): each algorithm's held-out accuracy, the mean over seeds with a
//!   ±1 std whisker and a tick per held-out domain. The accuracy axis is fitted to the values:
//!   when it can start at 0 the means are bars; when every value sits well above 0 the axis is
//!   zoomed onto them, the means become dots (a bar cut off at the left would exaggerate the
//!   differences) and the axis title says that the axis does not start at 0.
//! - [`render_tradeoff`] (`PATH-privacy.png`): with `--dp-noise`, held-out accuracy against the
//!   ε spent on a logarithmic axis, one line per algorithm with ±1 std whiskers, its run without
//!   DP as a dashed level.
//!
//! Legends and keys sit outside the plotting area, so they never hide data. Algorithms keep the
//! same colour, in order of appearance, in every chart.
//!
//! plotters draws the shapes; the text goes through [`Canvas`](canvas::Canvas), a thin wrapper of
//! plotters' bitmap backend that lays each line out with ab_glyph (advance widths, kerning and
//! each glyph's own side bearing, at sub-pixel positions) and blends ab_glyph's anti-aliased
//! coverage into the picture. plotters' built-in ab_glyph text drops the side bearings, which
//! leaves visible gaps after letters such as `r` and `l`.
//!
//! - this file: the public functions; `data`: the public types and the error.
//! - `canvas`: the bundled font, text layout and [`Canvas`](canvas::Canvas).
//! - `parts`: sizes and colours, the frame of a chart's data, titles, key marks and keys.
//! - `axis`: accuracy axes fitted to their values.
//! - `curves`, `bars`, `tradeoff`: one chart each.
//! - `tests`: the charts' unit tests, which read pixels back.

mod axis;
mod bars;
mod canvas;
mod curves;
mod data;
mod parts;
#[cfg(test)]
mod tests;
mod tradeoff;

use std::path::Path;

use image::RgbImage;

pub use data::{Bar, Curve, PlotError, Tradeoff};

use bars::draw_bars;
use curves::draw_curves;
use tradeoff::draw_tradeoff;

/// Renders the per-algorithm chart (bars, or dots on a zoomed axis).
pub fn render(title: &str, bars: &[Bar]) -> Result<RgbImage, PlotError> {
    draw_bars(title, bars).map(|(img, _)| img)
}

/// Writes [`render`] as PNG.
pub fn write(path: &Path, title: &str, bars: &[Bar]) -> Result<(), PlotError> {
    save(render(title, bars)?, path)
}

/// Renders one line per curve against the round, each with its band over seeds.
pub fn render_curves(title: &str, curves: &[Curve]) -> Result<RgbImage, PlotError> {
    draw_curves(title, curves).map(|(img, _)| img)
}

/// Writes [`render_curves`] as PNG.
pub fn write_curves(path: &Path, title: &str, curves: &[Curve]) -> Result<(), PlotError> {
    save(render_curves(title, curves)?, path)
}

/// Renders accuracy against ε (log scale) with ±1 std whiskers, each line's accuracy without DP
/// dashed.
pub fn render_tradeoff(title: &str, lines: &[Tradeoff]) -> Result<RgbImage, PlotError> {
    draw_tradeoff(title, lines).map(|(img, _)| img)
}

/// Writes [`render_tradeoff`] as PNG.
pub fn write_tradeoff(path: &Path, title: &str, lines: &[Tradeoff]) -> Result<(), PlotError> {
    save(render_tradeoff(title, lines)?, path)
}

fn save(img: RgbImage, path: &Path) -> Result<(), PlotError> {
    img.save(path).map_err(|source| PlotError::Write {
        path: path.to_owned(),
        source,
    })
}

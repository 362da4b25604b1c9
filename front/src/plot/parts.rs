//! What every chart shares: sizes and colours, [`Frame`], the title, key marks and keys.

use plotters::prelude::*;

use super::canvas::{Area, Canvas, left_middle, measure, text};
use super::data::PlotError;

pub(super) const WIDTH: u32 = 1100;
pub(super) const CHART_H: u32 = 640;
pub(super) const PAD: i32 = 24;
/// Text sizes: a line's height in pixels, ascent to descent (DejaVu's em is 0.86 of it).
const TITLE_PX: f64 = 25.0;
pub(super) const DESC_PX: f64 = 20.0;
pub(super) const LABEL_PX: f64 = 18.0;
pub(super) const LEGEND_PX: f64 = 19.0;
pub(super) const NOTE_PX: f64 = 17.0;
pub(super) const INK: RGBColor = RGBColor(33, 33, 33);
pub(super) const MUTED: RGBColor = RGBColor(100, 100, 100);
pub(super) const GRID: RGBColor = RGBColor(228, 228, 228);
pub(super) const AXIS: RGBColor = RGBColor(120, 120, 120);
/// Opacity of a curve's band over seeds.
pub(super) const BAND_ALPHA: f64 = 0.18;
/// How much of an algorithm's colour a bar's fill keeps (the rest is white), so that the
/// whisker and the domain ticks stay visible on it.
pub(super) const BAR_TINT: f64 = 0.45;
/// Colours of the algorithms, in order of appearance.
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Where the data sit in the image: the axes' ranges and the plotting area's pixels.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(test), allow(dead_code))]
pub(super) struct Frame {
    pub(super) x: (f64, f64),
    pub(super) y: (f64, f64),
    pub(super) log_x: bool,
    pub(super) px_x: (i32, i32),
    pub(super) px_y: (i32, i32),
}

impl Frame {
    pub(super) fn of<X: Ranged, Y: Ranged>(
        chart: &ChartContext<'_, Canvas<'_>, Cartesian2d<X, Y>>,
        x: (f64, f64),
        y: (f64, f64),
        log_x: bool,
    ) -> Self {
        let (px_x, px_y) = chart.plotting_area().get_pixel_range();
        Self {
            x,
            y,
            log_x,
            px_x: (px_x.start, px_x.end),
            px_y: (px_y.start, px_y.end),
        }
    }

    /// The pixel of a data point.
    #[cfg(test)]
    pub(super) fn at(&self, x: f64, y: f64) -> (u32, u32) {
        let (x, (x0, x1)) = match self.log_x {
            true => (x.log10(), (self.x.0.log10(), self.x.1.log10())),
            false => (x, self.x),
        };
        let fx = (x - x0) / (x1 - x0);
        let fy = (y - self.y.0) / (self.y.1 - self.y.0);
        let px = self.px_x.0 as f64 + fx * (self.px_x.1 - self.px_x.0) as f64;
        let py = self.px_y.1 as f64 - fy * (self.px_y.1 - self.px_y.0) as f64;
        (px.round() as u32, py.round() as u32)
    }
}

pub(super) fn colour(k: usize) -> RGBColor {
    PALETTE[k % PALETTE.len()]
}

/// `c` at opacity `a` over white, as a solid colour.
pub(super) fn tint(c: RGBColor, a: f64) -> RGBColor {
    let mix = |v: u8| (255.0 - (255.0 - v as f64) * a).round() as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

/// The title wrapped at spaces to the canvas width, at most three lines.
pub(super) fn wrap(title: &str) -> Result<Vec<String>, PlotError> {
    let max = WIDTH as i32 - 2 * PAD;
    let mut lines: Vec<String> = Vec::new();
    for word in title.split_whitespace() {
        match lines.last_mut() {
            Some(line) if measure(&format!("{line} {word}"), TITLE_PX)? <= max => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_owned()),
        }
    }
    lines.truncate(3);
    Ok(lines)
}

const TITLE_LINE: i32 = (TITLE_PX * 1.4) as i32;

/// The height the title's lines take.
pub(super) fn title_height(lines: &[String]) -> i32 {
    PAD / 2 + lines.len().max(1) as i32 * TITLE_LINE + 8
}

/// Draws the title's lines and returns the area below them.
pub(super) fn titled<'a>(root: &Area<'a>, lines: &[String]) -> Result<Area<'a>, PlotError> {
    let style = left_middle(text(TITLE_PX, &INK));
    for (i, line) in lines.iter().enumerate() {
        let y = PAD / 2 + TITLE_LINE / 2 + i as i32 * TITLE_LINE;
        root.draw_text(line, &style, (PAD, y))?;
    }
    Ok(root.split_vertically(title_height(lines)).1)
}

/// A key entry's sample mark.
#[derive(Debug, Clone, Copy)]
pub(super) enum Mark {
    /// A line with a shaded band behind it.
    Band(RGBColor),
    /// A line with a dot on it.
    Line(RGBColor),
    /// A dashed line.
    Dashed(RGBColor),
    /// A tinted bar with its colour's outline.
    Bar(RGBColor),
    /// A filled dot.
    Dot(RGBColor),
    /// A ±1 std whisker.
    Whisker,
    /// A held-out domain's tick.
    Tick,
}

pub(super) const MARK_W: i32 = 30;

/// Draws `mark` in the `MARK_W`-wide box whose left end is at `x`, centred on `y`.
pub(super) fn draw_mark(area: &Area<'_>, mark: Mark, x: i32, y: i32) -> Result<(), PlotError> {
    let (x1, mid) = (x + MARK_W, x + MARK_W / 2);
    match mark {
        Mark::Band(c) => {
            area.draw(&Rectangle::new(
                [(x, y - 8), (x1, y + 8)],
                c.mix(BAND_ALPHA).filled(),
            ))?;
            area.draw(&PathElement::new(vec![(x, y), (x1, y)], c.stroke_width(3)))?;
        }
        Mark::Line(c) => {
            area.draw(&PathElement::new(vec![(x, y), (x1, y)], c.stroke_width(3)))?;
            area.draw(&Circle::new((mid, y), 4, c.filled()))?;
        }
        Mark::Dashed(c) => {
            for dash in 0..3 {
                let at = x + dash * 12;
                area.draw(&PathElement::new(
                    vec![(at, y), (at + 7, y)],
                    c.stroke_width(2),
                ))?;
            }
        }
        Mark::Bar(c) => {
            let rect = [(x, y - 8), (x1, y + 8)];
            area.draw(&Rectangle::new(rect, tint(c, BAR_TINT).filled()))?;
            area.draw(&Rectangle::new(rect, c.stroke_width(1)))?;
        }
        Mark::Dot(c) => area.draw(&Circle::new((mid, y), 6, c.filled()))?,
        Mark::Whisker => {
            area.draw(&PathElement::new(
                vec![(x + 2, y), (x1 - 2, y)],
                INK.stroke_width(2),
            ))?;
            for end in [x + 2, x1 - 2] {
                let cap = vec![(end, y - 6), (end, y + 6)];
                area.draw(&PathElement::new(cap, INK.stroke_width(2)))?;
            }
        }
        Mark::Tick => {
            let tick = vec![(mid, y - 9), (mid, y + 9)];
            area.draw(&PathElement::new(tick, MUTED.stroke_width(2)))?;
        }
    }
    Ok(())
}

/// The width a key of these entries needs (marks, gaps and the longest text).
pub(super) fn key_width(entries: &[(Option<Mark>, String, bool)]) -> Result<i32, PlotError> {
    let mut widest = 0;
    for (_, label, note) in entries {
        widest = widest.max(measure(label, if *note { NOTE_PX } else { LEGEND_PX })?);
    }
    Ok(MARK_W + 10 + widest + PAD)
}

/// Draws a vertical key: one line per entry (a mark, or none, then its text; notes smaller and
/// grey), from `top`.
pub(super) fn draw_key(
    area: &Area<'_>,
    entries: &[(Option<Mark>, String, bool)],
    top: i32,
) -> Result<(), PlotError> {
    let mut y = top;
    for (mark, label, note) in entries {
        let (px, ink) = match note {
            true => (NOTE_PX, MUTED),
            false => (LEGEND_PX, INK),
        };
        let line_h = (px * 1.8) as i32;
        y += line_h / 2;
        if let Some(mark) = mark {
            draw_mark(area, *mark, 0, y)?;
        }
        area.draw_text(label, &left_middle(text(px, &ink)), (MARK_W + 10, y))?;
        y += line_h - line_h / 2;
    }
    Ok(())
}

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
//! plotters draws the shapes; the text goes through [`Canvas`], a thin wrapper of plotters'
//! bitmap backend that lays each line out with ab_glyph (advance widths, kerning and each
//! glyph's own side bearing, at sub-pixel positions) and blends ab_glyph's anti-aliased
//! coverage into the picture. plotters' built-in ab_glyph text drops the side bearings, which
//! leaves visible gaps after letters such as `r` and `l`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ab_glyph::{Font, FontRef, Glyph, PxScale, ScaleFont, point};
use image::RgbImage;
use plotters::backend::BitMapBackend;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
// The backend's style traits are named by path only: in scope, their methods would clash with
// plotters' own `stroke_width` and `color`.
use plotters_backend::{BackendColor, BackendCoord, DrawingErrorKind};

/// One row of [`render`]: a label, the mean and std of the average, and per-domain means (all
/// in %).
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// Algorithm name.
    pub label: String,
    /// Mean over seeds of the average target accuracy.
    pub mean: f32,
    /// Its standard deviation.
    pub std: f32,
    /// Mean target accuracy per held-out domain.
    pub domains: Vec<f32>,
}

/// One line of [`render_curves`]: values (%) per round, rounds from 1.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Algorithm name.
    pub label: String,
    /// Mean over seeds after round `i + 1`; NaN where no seed has a value for that round (the
    /// line is broken there).
    pub points: Vec<f32>,
    /// The lowest and the highest seed after round `i + 1`, drawn as a shaded band; empty, or
    /// equal to the mean, when there is nothing to shade.
    pub spread: Vec<(f32, f32)>,
    /// Seeds the values are taken over.
    pub seeds: usize,
}

/// One algorithm's privacy–utility line: `(ε, mean, std)` per noise level (accuracy in %),
/// and its accuracy without DP, if it was run.
#[derive(Debug, Clone, PartialEq)]
pub struct Tradeoff {
    /// Algorithm name.
    pub label: String,
    /// `(ε, mean, std)`, in any order.
    pub points: Vec<(f64, f32, f32)>,
    /// The accuracy without differential privacy.
    pub without_dp: Option<f32>,
}

/// A chart that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Drawing failed (the bundled font did not load, or plotters refused an element).
    #[error("cannot draw the chart: {0}")]
    Draw(String),
    /// The PNG could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// Where the chart was to go.
        path: PathBuf,
        /// Why it did not.
        #[source]
        source: image::ImageError,
    },
}

impl<E: std::error::Error + Send + Sync> From<plotters::drawing::DrawingAreaErrorKind<E>>
    for PlotError
{
    fn from(e: plotters::drawing::DrawingAreaErrorKind<E>) -> Self {
        Self::Draw(e.to_string())
    }
}

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

/// The family plotters' text styles name. Only their size, colour, anchor and turn are read:
/// [`Canvas`] sets every text in the bundled font, whatever the family.
const FAMILY: &str = "sans-serif";
const WIDTH: u32 = 1100;
const CHART_H: u32 = 640;
const PAD: i32 = 24;
/// Text sizes: a line's height in pixels, ascent to descent (DejaVu's em is 0.86 of it).
const TITLE_PX: f64 = 25.0;
const DESC_PX: f64 = 20.0;
const LABEL_PX: f64 = 18.0;
const LEGEND_PX: f64 = 19.0;
const NOTE_PX: f64 = 17.0;
const INK: RGBColor = RGBColor(33, 33, 33);
const MUTED: RGBColor = RGBColor(100, 100, 100);
const GRID: RGBColor = RGBColor(228, 228, 228);
const AXIS: RGBColor = RGBColor(120, 120, 120);
/// Opacity of a curve's band over seeds.
const BAND_ALPHA: f64 = 0.18;
/// How much of an algorithm's colour a bar's fill keeps (the rest is white), so that the
/// whisker and the domain ticks stay visible on it.
const BAR_TINT: f64 = 0.45;
/// A bar chart whose fitted axis would start at or above this accuracy (%) is zoomed instead
/// of starting at 0.
const ZOOM_FROM: f64 = 20.0;
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

type Area<'a> = DrawingArea<Canvas<'a>, Shift>;

/// Where the data sit in the image: the axes' ranges and the plotting area's pixels.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(test), allow(dead_code))]
struct Frame {
    x: (f64, f64),
    y: (f64, f64),
    log_x: bool,
    px_x: (i32, i32),
    px_y: (i32, i32),
}

impl Frame {
    fn of<X: Ranged, Y: Ranged>(
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
    fn at(&self, x: f64, y: f64) -> (u32, u32) {
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

/// The bundled font, parsed once per process.
fn font() -> Result<&'static FontRef<'static>, PlotError> {
    static FONT: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    let font = FONT.get_or_init(|| FontRef::try_from_slice(dejavu::sans::regular()).ok());
    font.as_ref()
        .ok_or_else(|| PlotError::Draw("the bundled font did not load".into()))
}

/// `text` set on one line `size` px high (ascent to descent): its glyphs, positioned with the
/// top of the line at y = 0, and the line's width and height.
fn layout(font: &FontRef<'static>, size: f64, text: &str) -> (Vec<Glyph>, f32, f32) {
    let scaled = font.as_scaled(PxScale::from(size as f32));
    let (mut caret, mut previous) = (0.0, None);
    let mut glyphs = Vec::with_capacity(text.len());
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(previous) = previous {
            caret += scaled.kern(previous, id);
        }
        glyphs.push(id.with_scale_and_position(scaled.scale(), point(caret, scaled.ascent())));
        caret += scaled.h_advance(id);
        previous = Some(id);
    }
    (glyphs, caret, scaled.ascent() - scaled.descent())
}

/// plotters' bitmap backend with its text set by [`layout`] in the bundled font; every other
/// drawing call goes to the bitmap backend unchanged.
struct Canvas<'a> {
    bitmap: BitMapBackend<'a>,
    font: &'static FontRef<'static>,
}

type Failure<'a> = DrawingErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>;

impl<'a> DrawingBackend for Canvas<'a> {
    type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.bitmap.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), Failure<'a>> {
        self.bitmap.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), Failure<'a>> {
        self.bitmap.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), Failure<'a>> {
        self.bitmap.draw_pixel(point, color)
    }

    fn draw_line<S: plotters_backend::BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.draw_line(from, to, style)
    }

    fn draw_rect<S: plotters_backend::BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: plotters_backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.draw_path(path, style)
    }

    fn draw_circle<S: plotters_backend::BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: plotters_backend::BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), Failure<'a>> {
        self.bitmap.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), Failure<'a>> {
        self.bitmap.blit_bitmap(pos, size, src)
    }

    fn draw_text<S: plotters_backend::BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), Failure<'a>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let font = self.font;
        let (glyphs, width, height) = layout(font, style.size(), text);
        // The anchor's offset, before the text is turned about it.
        let dx = match style.anchor().h_pos {
            HPos::Left => 0.0,
            HPos::Center => -width / 2.0,
            HPos::Right => -width,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0.0,
            VPos::Center => -height / 2.0,
            VPos::Bottom => -height,
        };
        let turn = style.transform();
        let (w, h) = self.get_size();
        let mut result = Ok(());
        for mut glyph in glyphs {
            glyph.position.x += dx;
            glyph.position.y += dy;
            let Some(outline) = font.outline_glyph(glyph) else {
                continue;
            };
            let min = outline.px_bounds().min;
            outline.draw(|x, y, coverage| {
                if result.is_err() || coverage <= 0.0 {
                    return;
                }
                let (x, y) = turn.transform(min.x as i32 + x as i32, min.y as i32 + y as i32);
                let (x, y) = (pos.0 + x, pos.1 + y);
                if x >= 0 && y >= 0 && (x as u32) < w && (y as u32) < h {
                    let alpha = color.alpha * coverage.min(1.0) as f64;
                    let ink = BackendColor {
                        alpha,
                        rgb: color.rgb,
                    };
                    result = self.bitmap.draw_pixel((x, y), ink);
                }
            });
            if result.is_err() {
                break;
            }
        }
        result
    }

    fn estimate_text_size<S: plotters_backend::BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), Failure<'a>> {
        let (_, width, height) = layout(self.font, style.size(), text);
        Ok((width.ceil() as u32, height.ceil() as u32))
    }
}

/// A white `width`×`height` canvas handed to `draw`, returned as an image with what `draw`
/// returns.
fn canvas<T>(
    width: u32,
    height: u32,
    draw: impl FnOnce(&Area<'_>) -> Result<T, PlotError>,
) -> Result<(RgbImage, T), PlotError> {
    let font = font()?;
    let mut buf = vec![255u8; width as usize * height as usize * 3];
    let out = {
        let bitmap = BitMapBackend::with_buffer(&mut buf, (width, height));
        let root = Canvas { bitmap, font }.into_drawing_area();
        let out = draw(&root)?;
        root.present()?;
        out
    };
    let img = RgbImage::from_raw(width, height, buf)
        .ok_or_else(|| PlotError::Draw("the canvas has the wrong size".into()))?;
    Ok((img, out))
}

fn text(px: f64, colour: &RGBColor) -> TextStyle<'static> {
    (FAMILY, px).into_font().color(colour)
}

/// `style` anchored at the left end of the text, vertically centred.
fn left_middle(style: TextStyle<'static>) -> TextStyle<'static> {
    style.pos(Pos::new(HPos::Left, VPos::Center))
}

/// The width in pixels of `s` set `px` high.
fn measure(s: &str, px: f64) -> Result<i32, PlotError> {
    Ok(layout(font()?, px, s).1.ceil() as i32)
}

fn colour(k: usize) -> RGBColor {
    PALETTE[k % PALETTE.len()]
}

/// `c` at opacity `a` over white, as a solid colour.
fn tint(c: RGBColor, a: f64) -> RGBColor {
    let mix = |v: u8| (255.0 - (255.0 - v as f64) * a).round() as u8;
    RGBColor(mix(c.0), mix(c.1), mix(c.2))
}

/// The title wrapped at spaces to the canvas width, at most three lines.
fn wrap(title: &str) -> Result<Vec<String>, PlotError> {
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
fn title_height(lines: &[String]) -> i32 {
    PAD / 2 + lines.len().max(1) as i32 * TITLE_LINE + 8
}

/// Draws the title's lines and returns the area below them.
fn titled<'a>(root: &Area<'a>, lines: &[String]) -> Result<Area<'a>, PlotError> {
    let style = left_middle(text(TITLE_PX, &INK));
    for (i, line) in lines.iter().enumerate() {
        let y = PAD / 2 + TITLE_LINE / 2 + i as i32 * TITLE_LINE;
        root.draw_text(line, &style, (PAD, y))?;
    }
    Ok(root.split_vertically(title_height(lines)).1)
}

/// A key entry's sample mark.
#[derive(Debug, Clone, Copy)]
enum Mark {
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

const MARK_W: i32 = 30;

/// Draws `mark` in the `MARK_W`-wide box whose left end is at `x`, centred on `y`.
fn draw_mark(area: &Area<'_>, mark: Mark, x: i32, y: i32) -> Result<(), PlotError> {
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
fn key_width(entries: &[(Option<Mark>, String, bool)]) -> Result<i32, PlotError> {
    let mut widest = 0;
    for (_, label, note) in entries {
        widest = widest.max(measure(label, if *note { NOTE_PX } else { LEGEND_PX })?);
    }
    Ok(MARK_W + 10 + widest + PAD)
}

/// Draws a vertical key: one line per entry (a mark, or none, then its text; notes smaller and
/// grey), from `top`.
fn draw_key(
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

/// A step of 1, 2 or 5 times a power of ten giving at most `max` intervals over `span`.
fn nice_step(span: f64, max: usize) -> f64 {
    let raw = (span / max.max(1) as f64).max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * magnitude)
}

/// A linear axis in percent: its ends are whole steps and its ticks every step.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
}

impl Axis {
    /// The axis over the finite `values` with a margin, rounded out to whole steps, kept within
    /// 0–100 (0–100 itself when there is no value).
    fn fit(values: impl IntoIterator<Item = f32>, max_ticks: usize) -> Self {
        let (lo, hi) = (values.into_iter())
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(v as f64), hi.max(v as f64))
            });
        if !lo.is_finite() {
            return Self::span(0.0, 100.0, max_ticks);
        }
        let margin = (hi - lo).max(2.0) * 0.08;
        Self::span(lo - margin, hi + margin, max_ticks)
    }

    /// `lo`–`hi` rounded out to whole steps within 0–100.
    fn span(lo: f64, hi: f64, max_ticks: usize) -> Self {
        let step = nice_step(hi - lo, max_ticks);
        let lo = ((lo / step).floor() * step).clamp(0.0, 100.0 - step);
        let hi = ((hi / step).ceil() * step).clamp(lo + step, 100.0);
        Self { lo, hi, step }
    }

    fn ticks(&self) -> Vec<f64> {
        let n = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=n).map(|i| self.lo + i as f64 * self.step).collect()
    }

    /// The plotters coordinate of this axis.
    fn coord(&self) -> Ticked {
        Ticked {
            lo: self.lo,
            hi: self.hi,
            ticks: self.ticks(),
        }
    }

    fn label(&self, v: f64) -> String {
        match self.step.fract() == 0.0 {
            true => format!("{v:.0}"),
            false => format!("{v:.1}"),
        }
    }
}

/// A linear axis with the given ticks (plotters' own f64 axis chooses its ticks itself, and
/// its tick-binding wrapper loses the label formatter).
struct Ticked {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let f = (value - self.lo) / (self.hi - self.lo);
        limit.0 + ((limit.1 - limit.0) as f64 * f).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        // Grid lines at the ticks only, none in between.
        match hint.weight().allow_light_points() {
            true => Vec::new(),
            false => self.ticks.clone(),
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

/// The runs of consecutive items that `keep` accepts, with their indices.
fn runs<T: Copy>(items: &[T], keep: impl Fn(&T) -> bool) -> Vec<Vec<(usize, T)>> {
    let mut out: Vec<Vec<(usize, T)>> = Vec::new();
    let mut open = false;
    for (i, item) in items.iter().enumerate() {
        match (keep(item), open) {
            (true, true) => out.last_mut().expect("an open run").push((i, *item)),
            (true, false) => out.push(vec![(i, *item)]),
            (false, _) => {}
        }
        open = keep(item);
    }
    out
}

/// Round ticks: every round, or multiples of a step of 1, 2 or 5 times a power of ten (with
/// round 1 when the step is 5 or more).
fn round_ticks(rounds: usize) -> Vec<f64> {
    let step = nice_step(rounds as f64, 10).max(1.0).round() as usize;
    let mut ticks: Vec<f64> = (1..=rounds)
        .filter(|r| step == 1 || r % step == 0)
        .map(|r| r as f64)
        .collect();
    if step >= 5 {
        ticks.insert(0, 1.0);
    }
    ticks
}

fn draw_curves(title: &str, curves: &[Curve]) -> Result<(RgbImage, Frame), PlotError> {
    let rounds = curves
        .iter()
        .map(|c| c.points.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let values = (curves.iter()).flat_map(|c| {
        let spread = c.spread.iter().flat_map(|&(lo, hi)| [lo, hi]);
        c.points.iter().copied().chain(spread)
    });
    let y = Axis::fit(values, 8);
    let banded = curves
        .iter()
        .any(|c| c.spread.iter().any(|(lo, hi)| hi > lo));
    let seeds = curves.iter().map(|c| c.seeds).max().unwrap_or(0);
    let title = wrap(title)?;
    canvas(WIDTH, CHART_H, |root| {
        let body = titled(root, &title)?;
        let mut key: Vec<(Option<Mark>, String, bool)> = (curves.iter().enumerate())
            .map(|(k, c)| {
                let mark = match banded {
                    true => Mark::Band(colour(k)),
                    false => Mark::Line(colour(k)),
                };
                (Some(mark), c.label.clone(), false)
            })
            .collect();
        key.push((None, String::new(), true));
        let seeds_text = match seeds {
            1 => "line: one seed".to_owned(),
            n => format!("line: mean over {n} seeds"),
        };
        key.push((None, seeds_text, true));
        if banded {
            key.push((None, "shaded: lowest to highest seed".into(), true));
        }
        let key_w = key_width(&key)?;
        let (plot, side) = body.split_horizontally(WIDTH as i32 - key_w);
        let pad = (rounds as f64 * 0.02).max(0.25);
        let x = (1.0 - pad, rounds as f64 + pad);
        let mut chart = ChartBuilder::on(&plot)
            .margin(14)
            .margin_left(PAD)
            .x_label_area_size(58)
            .y_label_area_size(76)
            .build_cartesian_2d(
                Ticked {
                    lo: x.0,
                    hi: x.1,
                    ticks: round_ticks(rounds),
                },
                y.coord(),
            )?;
        chart
            .configure_mesh()
            .x_desc("round")
            .y_desc("target accuracy (%)")
            .axis_desc_style(text(DESC_PX, &INK))
            .label_style(text(LABEL_PX, &INK))
            .bold_line_style(GRID)
            .axis_style(AXIS)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| y.label(*v))
            .draw()?;
        let at = |i: usize, v: f32| ((i + 1) as f64, v as f64);
        for (k, curve) in curves.iter().enumerate() {
            let spread = &curve.spread;
            for run in runs(spread, |(lo, hi)| lo.is_finite() && hi.is_finite()) {
                if run.iter().all(|(_, (lo, hi))| hi <= lo) {
                    continue;
                }
                let upper = run.iter().map(|&(i, (_, hi))| at(i, hi));
                let lower = run.iter().rev().map(|&(i, (lo, _))| at(i, lo));
                let outline: Vec<(f64, f64)> = upper.chain(lower).collect();
                chart.draw_series(std::iter::once(Polygon::new(
                    outline,
                    colour(k).mix(BAND_ALPHA).filled(),
                )))?;
            }
        }
        for (k, curve) in curves.iter().enumerate() {
            for run in runs(&curve.points, |v| v.is_finite()) {
                let points: Vec<(f64, f64)> = run.iter().map(|&(i, v)| at(i, v)).collect();
                let line = LineSeries::new(points.clone(), colour(k).stroke_width(3));
                chart.draw_series(line)?;
                if rounds <= 30 {
                    let dots = points
                        .into_iter()
                        .map(|p| Circle::new(p, 4, colour(k).filled()));
                    chart.draw_series(dots)?;
                }
            }
        }
        let frame = Frame::of(&chart, x, (y.lo, y.hi), false);
        let key_top = frame.px_y.0 - side.get_pixel_range().1.start;
        draw_key(&side, &key, key_top)?;
        Ok(frame)
    })
}

/// The accuracy axis of the per-algorithm chart and whether it is zoomed (does not start at
/// 0).
fn bar_axis(bars: &[Bar]) -> (Axis, bool) {
    let values = bars.iter().flat_map(|b| {
        let spread = [b.mean - b.std, b.mean + b.std];
        spread.into_iter().chain(b.domains.iter().copied())
    });
    let values: Vec<f32> = values.collect();
    let fitted = Axis::fit(values.iter().copied(), 10);
    match fitted.lo >= ZOOM_FROM {
        true => (fitted, true),
        false => (Axis::span(0.0, fitted.hi, 10), false),
    }
}

const ROW_H: u32 = 56;

fn draw_bars(title: &str, bars: &[Bar]) -> Result<(RgbImage, Frame), PlotError> {
    let n = bars.len().max(1);
    let (axis, zoomed) = bar_axis(bars);
    let title = wrap(title)?;
    let mut label_w = 0;
    for bar in bars {
        label_w = label_w.max(measure(&bar.label, LEGEND_PX)?);
    }
    let value_text = |bar: &Bar| match bar.std > 0.0 {
        true => format!("{:.1} ± {:.1}", bar.mean, bar.std),
        false => format!("{:.1}", bar.mean),
    };
    let mut value_w = measure("mean ± std", NOTE_PX)?;
    for bar in bars {
        value_w = value_w.max(measure(&value_text(bar), LEGEND_PX)?);
    }
    // The key under the axis title, flowing onto more lines if it must, from the plot's left
    // edge (the chart's left margin and row labels).
    // In grey: each row has its algorithm's colour.
    let mean_mark = match zoomed {
        true => Mark::Dot(AXIS),
        false => Mark::Bar(AXIS),
    };
    let entries = [
        (mean_mark, "average over held-out domains, mean over seeds"),
        (Mark::Whisker, "±1 std over seeds"),
        (Mark::Tick, "one held-out domain"),
    ];
    let key_left = PAD + label_w + 18;
    let key_right = WIDTH as i32 - value_w - 3 * PAD;
    let (mut x, mut line) = (key_left, 0);
    let mut key = Vec::new();
    for (mark, label) in entries {
        let w = MARK_W + 8 + measure(label, NOTE_PX)?;
        if x > key_left && x + w > key_right {
            (x, line) = (key_left, line + 1);
        }
        key.push((mark, label, x, line));
        x += w + 28;
    }
    const KEY_LINE: i32 = 30;
    let foot_h = 12 + (line + 1) * KEY_LINE;
    let height = title_height(&title) + n as i32 * ROW_H as i32 + 100 + foot_h;
    canvas(WIDTH, height as u32, |root| {
        let body = titled(root, &title)?;
        let body_h = body.dim_in_pixel().1 as i32;
        let (body, foot) = body.split_vertically(body_h - foot_h);
        let value_style = text(LEGEND_PX, &INK);
        let (plot, values) = body.split_horizontally(WIDTH as i32 - value_w - 2 * PAD);
        let label_style = text(LEGEND_PX, &INK);
        let rows: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let y = (-0.6, n as f64 - 0.4);
        let desc = match zoomed {
            true => format!(
                "target accuracy (%); axis zoomed to {}–{}, it does not start at 0",
                axis.label(axis.lo),
                axis.label(axis.hi)
            ),
            false => "target accuracy (%)".to_owned(),
        };
        // Row `i` (top first) sits at y = n - 1 - i.
        let row_y = |i: usize| (n - 1 - i) as f64;
        let row_label = |v: &f64| {
            let k = v.round();
            let at = (n as f64 - 1.0 - k) as usize;
            match (v - k).abs() < 1e-6 && (0.0..n as f64).contains(&k) {
                true => bars.get(at).map_or(String::new(), |b| b.label.clone()),
                false => String::new(),
            }
        };
        let mut chart = ChartBuilder::on(&plot)
            .margin(14)
            .margin_left(PAD)
            .x_label_area_size(58)
            .y_label_area_size(label_w + 18)
            .build_cartesian_2d(
                axis.coord(),
                Ticked {
                    lo: y.0,
                    hi: y.1,
                    ticks: rows,
                },
            )?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(desc)
            .axis_desc_style(text(DESC_PX, &INK))
            .x_label_style(text(LABEL_PX, &INK))
            .y_label_style(label_style.clone())
            .bold_line_style(GRID)
            .axis_style(AXIS)
            .x_label_formatter(&|v| axis.label(*v))
            .y_label_formatter(&row_label)
            .draw()?;
        for (i, bar) in bars.iter().enumerate() {
            let (c, y, mean) = (colour(i), row_y(i), bar.mean as f64);
            if !zoomed {
                let rect = [(axis.lo, y - 0.3), (mean, y + 0.3)];
                chart.draw_series(std::iter::once(Rectangle::new(
                    rect,
                    tint(c, BAR_TINT).filled(),
                )))?;
                chart.draw_series(std::iter::once(Rectangle::new(rect, c.stroke_width(1))))?;
            }
            for d in &bar.domains {
                let tick = vec![(*d as f64, y - 0.36), (*d as f64, y + 0.36)];
                chart.draw_series(std::iter::once(PathElement::new(
                    tick,
                    MUTED.stroke_width(2),
                )))?;
            }
            if bar.std > 0.0 {
                let (lo, hi) = (mean - bar.std as f64, mean + bar.std as f64);
                let whisker = [
                    vec![(lo, y), (hi, y)],
                    vec![(lo, y - 0.15), (lo, y + 0.15)],
                    vec![(hi, y - 0.15), (hi, y + 0.15)],
                ];
                let style = INK.stroke_width(2);
                chart.draw_series(whisker.into_iter().map(|p| PathElement::new(p, style)))?;
            }
            if zoomed {
                chart.draw_series(std::iter::once(Circle::new((mean, y), 7, c.filled())))?;
            }
        }
        let frame = Frame::of(&chart, (axis.lo, axis.hi), y, false);
        // The values, right of the plot, level with their rows.
        let top = values.get_pixel_range().1.start;
        let head_y = frame.px_y.0 - top - 4;
        let head = text(NOTE_PX, &MUTED).pos(Pos::new(HPos::Left, VPos::Bottom));
        values.draw_text("mean ± std", &head, (PAD, head_y))?;
        for (i, bar) in bars.iter().enumerate() {
            let (_, py) = chart.backend_coord(&(axis.lo, row_y(i)));
            values.draw_text(
                &value_text(bar),
                &left_middle(value_style.clone()),
                (PAD, py - top),
            )?;
        }
        let style = left_middle(text(NOTE_PX, &MUTED));
        for (mark, label, x, line) in key {
            let y = 6 + KEY_LINE / 2 + line * KEY_LINE;
            draw_mark(&foot, mark, x, y)?;
            foot.draw_text(label, &style, (x + MARK_W + 8, y))?;
        }
        Ok(frame)
    })
}

/// The ε axis: whole decades around the positive ε values, and its ticks (1, 2 and 5 per
/// decade over at most two decades, decades alone beyond).
fn epsilon_axis(lines: &[Tradeoff]) -> ((f64, f64), Vec<f64>) {
    let eps = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let eps: Vec<f64> = eps.filter(|e| e.is_finite() && *e > 0.0).collect();
    let lo = eps.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = eps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = match lo.is_finite() {
        true => {
            let lo = lo.log10().floor();
            (lo, hi.log10().ceil().max(lo + 1.0))
        }
        false => (0.0, 1.0),
    };
    let (lo, hi) = (lo as i32, hi as i32);
    let mantissas: &[f64] = if hi - lo <= 2 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let mut ticks: Vec<f64> = (lo..hi)
        .flat_map(|d| mantissas.iter().map(move |m| m * 10f64.powi(d)))
        .collect();
    ticks.push(10f64.powi(hi));
    ((10f64.powi(lo), 10f64.powi(hi)), ticks)
}

/// An ε tick's label: as many decimals as its size needs.
fn epsilon_label(v: f64) -> String {
    let decimals = (-v.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

fn draw_tradeoff(title: &str, lines: &[Tradeoff]) -> Result<(RgbImage, Frame), PlotError> {
    let (x, x_ticks) = epsilon_axis(lines);
    let values = lines.iter().flat_map(|l| {
        let points = l.points.iter().flat_map(|p| [p.1 - p.2, p.1 + p.2]);
        points.chain(l.without_dp)
    });
    let y = Axis::fit(values, 8);
    let title = wrap(title)?;
    canvas(WIDTH, CHART_H, |root| {
        let body = titled(root, &title)?;
        let mut key: Vec<(Option<Mark>, String, bool)> = (lines.iter().enumerate())
            .map(|(k, l)| (Some(Mark::Line(colour(k))), l.label.clone(), false))
            .collect();
        key.push((None, String::new(), true));
        if lines.iter().any(|l| l.without_dp.is_some()) {
            key.push((Some(Mark::Dashed(MUTED)), "without DP".into(), true));
        }
        key.push((Some(Mark::Whisker), "±1 std over seeds".into(), true));
        let key_w = key_width(&key)?;
        let (plot, side) = body.split_horizontally(WIDTH as i32 - key_w);
        let mut chart = ChartBuilder::on(&plot)
            .margin(14)
            .margin_left(PAD)
            .margin_right(24)
            .x_label_area_size(58)
            .y_label_area_size(76)
            .build_cartesian_2d((x.0..x.1).log_scale().with_key_points(x_ticks), y.coord())?;
        chart
            .configure_mesh()
            .x_desc("ε spent (log scale)")
            .y_desc("target accuracy after the last round (%)")
            .axis_desc_style(text(DESC_PX, &INK))
            .label_style(text(LABEL_PX, &INK))
            .bold_line_style(GRID)
            .axis_style(AXIS)
            .x_label_formatter(&|v| epsilon_label(*v))
            .y_label_formatter(&|v| y.label(*v))
            .draw()?;
        for (k, l) in lines.iter().enumerate() {
            let c = colour(k);
            if let Some(level) = l.without_dp {
                let level = vec![(x.0, level as f64), (x.1, level as f64)];
                chart.draw_series(DashedLineSeries::new(level, 8, 6, c.stroke_width(2)))?;
            }
            let mut points: Vec<(f64, f32, f32)> = (l.points.iter().copied())
                .filter(|p| p.0.is_finite() && p.0 > 0.0)
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let line: Vec<(f64, f64)> = points.iter().map(|p| (p.0, p.1 as f64)).collect();
            chart.draw_series(LineSeries::new(line, c.stroke_width(3)))?;
            for &(e, mean, std) in &points {
                if std > 0.0 {
                    let (lo, hi) = ((mean - std) as f64, (mean + std) as f64);
                    let (left, right) = (e / 1.03, e * 1.03);
                    let whisker = [
                        vec![(e, lo), (e, hi)],
                        vec![(left, lo), (right, lo)],
                        vec![(left, hi), (right, hi)],
                    ];
                    let style = c.stroke_width(2);
                    chart.draw_series(whisker.into_iter().map(|p| PathElement::new(p, style)))?;
                }
                let dot = Circle::new((e, mean as f64), 5, c.filled());
                chart.draw_series(std::iter::once(dot))?;
            }
        }
        let frame = Frame::of(&chart, x, (y.lo, y.hi), true);
        let key_top = frame.px_y.0 - side.get_pixel_range().1.start;
        draw_key(&side, &key, key_top)?;
        Ok(frame)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHITE_PX: image::Rgb<u8> = image::Rgb([255, 255, 255]);

    fn rgb(c: RGBColor) -> image::Rgb<u8> {
        image::Rgb([c.0, c.1, c.2])
    }

    /// Dark pixels (text) and anti-aliased grey ones in the rectangle.
    fn ink_in(img: &RgbImage, x: std::ops::Range<u32>, y: std::ops::Range<u32>) -> (usize, usize) {
        let (mut dark, mut grey) = (0, 0);
        for yy in y {
            for xx in x.clone() {
                let p = img.get_pixel(xx, yy);
                let v = p.0.iter().map(|c| *c as u32).sum::<u32>() / 3;
                dark += usize::from(v < 90);
                grey += usize::from((90..230).contains(&v));
            }
        }
        (dark, grey)
    }

    fn close(a: image::Rgb<u8>, b: image::Rgb<u8>, tolerance: i32) -> bool {
        (a.0.iter().zip(b.0)).all(|(x, y)| (*x as i32 - y as i32).abs() <= tolerance)
    }

    #[test]
    fn bars_end_at_their_values_and_labels_are_drawn() {
        let bars = vec![
            Bar {
                label: "fedavg".into(),
                mean: 50.0,
                std: 2.0,
                domains: vec![10.0, 70.0],
            },
            Bar {
                label: "feddim+fedomg".into(),
                mean: 80.0,
                std: 0.0,
                domains: vec![],
            },
        ];
        let (axis, zoomed) = bar_axis(&bars);
        assert!(!zoomed && axis.lo == 0.0, "{axis:?}");
        let (img, frame) = draw_bars("digits", &bars).unwrap();
        let fill = |i: usize| rgb(tint(colour(i), BAR_TINT));
        // Row 0 is at the top (y = 1), row 1 below it (y = 0); probe a little off the centre
        // line, clear of the whisker.
        for (i, y, end) in [(0, 1.0, 50.0), (1, 0.0, 80.0)] {
            let (x_end, py) = frame.at(end, y + 0.15);
            let (x_mid, _) = frame.at(end / 2.0, y);
            assert_eq!(*img.get_pixel(x_mid, py), fill(i), "row {i} inside");
            assert_eq!(
                *img.get_pixel(x_end - 4, py),
                fill(i),
                "row {i} before its end"
            );
            assert_eq!(
                *img.get_pixel(x_end + 4, py),
                WHITE_PX,
                "row {i} past its end"
            );
        }
        // Row 0's domain at 70 % is a grey tick past the end of its bar, at its own x.
        let (x70, py) = frame.at(70.0, 1.0 + 0.2);
        assert!((x70 - 1..=x70 + 1).any(|x| *img.get_pixel(x, py) == rgb(MUTED)));
        // Row labels left of the plot: dark, anti-aliased text level with each row.
        for y in [0.0, 1.0] {
            let (_, py) = frame.at(0.0, y);
            let (dark, grey) = ink_in(&img, 0..frame.px_x.0 as u32 - 4, py - 10..py + 10);
            assert!(
                dark > 20 && grey > 10,
                "row at {y}: {dark} dark, {grey} grey pixels"
            );
        }
        // The axis title under the tick labels.
        let below = frame.px_y.1 as u32 + 30..frame.px_y.1 as u32 + 56;
        let (dark, _) = ink_in(&img, frame.px_x.0 as u32..frame.px_x.1 as u32, below);
        assert!(dark > 50, "no axis title");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plot.png");
        write(&path, "digits", &bars).unwrap();
        assert_eq!(image::open(&path).unwrap().width(), WIDTH);
    }

    #[test]
    fn close_values_zoom_the_axis_and_are_dots() {
        let bars = vec![
            Bar {
                label: "fedavg".into(),
                mean: 71.0,
                std: 0.5,
                domains: vec![70.0, 72.0],
            },
            Bar {
                label: "fedprox".into(),
                mean: 72.5,
                std: 0.5,
                domains: vec![71.0, 74.0],
            },
        ];
        let (axis, zoomed) = bar_axis(&bars);
        assert!(zoomed && axis.lo >= 60.0 && axis.hi <= 80.0, "{axis:?}");
        let (img, frame) = draw_bars("t", &bars).unwrap();
        assert_eq!((frame.x.0, frame.x.1), (axis.lo, axis.hi));
        // A dot at each mean, nothing between the axis start and the dot (no bar).
        for (i, y, mean) in [(0, 1.0, 71.0), (1, 0.0, 72.5)] {
            let (x, py) = frame.at(mean, y);
            assert_eq!(*img.get_pixel(x, py + 4), rgb(colour(i)), "row {i} dot");
            let (x_start, _) = frame.at(axis.lo, y);
            assert_eq!(
                *img.get_pixel(x_start + 6, py + 4),
                WHITE_PX,
                "row {i} has a bar"
            );
        }
    }

    #[test]
    fn curves_go_through_their_points_in_their_colour_over_their_band() {
        let curves = vec![
            Curve {
                label: "fedavg".into(),
                points: vec![20.0, 40.0, 60.0],
                spread: vec![(20.0, 20.0), (35.0, 45.0), (60.0, 60.0)],
                seeds: 3,
            },
            Curve {
                label: "fedomg".into(),
                points: vec![30.0, 30.0, 30.0],
                spread: vec![],
                seeds: 3,
            },
        ];
        let (img, frame) = draw_curves("t", &curves).unwrap();
        assert!(frame.y.0 <= 20.0 && frame.y.1 >= 60.0 && frame.y.1 <= 70.0);
        // fedavg passes through each of its points in its colour.
        for (round, v) in [(1.0, 20.0), (2.0, 40.0), (3.0, 60.0)] {
            let (x, y) = frame.at(round, v);
            assert_eq!(*img.get_pixel(x, y), rgb(colour(0)), "round {round}");
        }
        // fedomg is flat at 30 %, and only there.
        let (x, y30) = frame.at(1.5, 30.0);
        assert_eq!(*img.get_pixel(x, y30), rgb(colour(1)));
        assert_ne!(*img.get_pixel(x, y30 - 12), rgb(colour(1)));
        // Round 2's band: shaded between 35 and 45 % around the line, white outside it.
        let band = rgb(tint(colour(0), BAND_ALPHA));
        let (x2, _) = frame.at(2.0, 0.0);
        let (x2, probe) = (x2 + 12, |v: f64| frame.at(2.0, v).1);
        let got = *img.get_pixel(x2, probe(37.0));
        assert!(close(got, band, 2), "{got:?} against {band:?}");
        assert!(close(*img.get_pixel(x2, probe(44.0)), band, 2));
        assert_eq!(*img.get_pixel(x2, probe(48.0)), WHITE_PX);
        assert_eq!(*img.get_pixel(x2, probe(32.0)), WHITE_PX);
        // The axis titles: "round" under the plot, the accuracy one left of the tick labels.
        let below = frame.px_y.1 as u32 + 30..frame.px_y.1 as u32 + 56;
        assert!(ink_in(&img, frame.px_x.0 as u32..frame.px_x.1 as u32, below).0 > 20);
        let left = 0..frame.px_x.0 as u32 - 40;
        let span = frame.px_y.0 as u32..frame.px_y.1 as u32;
        assert!(ink_in(&img, left, span).0 > 50);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curves.png");
        write_curves(&path, "t", &curves).unwrap();
        assert_eq!(image::open(&path).unwrap().width(), WIDTH);
    }

    #[test]
    fn tradeoff_points_sit_on_a_log_axis() {
        let lines = vec![Tradeoff {
            label: "fedavg".into(),
            points: vec![(20.0, 60.0, 3.0), (2.0, 30.0, 0.0)],
            without_dp: Some(70.0),
        }];
        let (x, ticks) = epsilon_axis(&lines);
        assert_eq!(x, (1.0, 100.0));
        assert_eq!(ticks, vec![1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]);
        assert_eq!(epsilon_label(0.5), "0.5");
        let (img, frame) = draw_tradeoff("t", &lines).unwrap();
        let c = rgb(colour(0));
        for (e, v) in [(2.0, 30.0), (20.0, 60.0)] {
            let (px, py) = frame.at(e, v);
            assert_eq!(*img.get_pixel(px, py), c, "ε {e}");
        }
        // ε = 20 sits twice as far along the axis as ε = 2 does past 1 (log10 2 ≈ 0.3).
        let (x2, _) = frame.at(2.0, 0.0);
        let (x20, _) = frame.at(20.0, 0.0);
        assert!(x20 - x2 > (frame.px_x.1 - frame.px_x.0) as u32 * 45 / 100);
        // The whisker reaches 63 % above ε = 20; the level without DP is dashed at 70 %.
        let (px, py) = frame.at(20.0, 62.5);
        assert_eq!(*img.get_pixel(px, py), c);
        let y70 = frame.at(1.0, 70.0).1;
        let row: Vec<bool> = (frame.px_x.0 as u32..frame.px_x.1 as u32)
            .map(|x| *img.get_pixel(x, y70) == c)
            .collect();
        let on = row.iter().filter(|b| **b).count();
        assert!(
            on > row.len() / 3 && on < row.len() * 3 / 4,
            "{on} of {}",
            row.len()
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("privacy.png");
        write_tradeoff(&path, "t", &lines).unwrap();
        assert_eq!(image::open(&path).unwrap().width(), WIDTH);
    }

    #[test]
    fn axes_fit_their_values() {
        let axis = Axis::fit([71.0, 74.0], 8);
        assert!(axis.lo <= 71.0 && axis.lo > 65.0 && axis.hi >= 74.0 && axis.hi < 80.0);
        assert_eq!(Axis::fit([0f32; 0], 10), Axis::span(0.0, 100.0, 10));
        assert!(Axis::fit([99.0, 100.0], 8).hi == 100.0);
        assert_eq!(round_ticks(3), vec![1.0, 2.0, 3.0]);
        let twenty: Vec<f64> = (1..=10).map(|k| 2.0 * k as f64).collect();
        assert_eq!(round_ticks(20), twenty);
        let hundred: Vec<f64> = [1.0]
            .into_iter()
            .chain((1..=10).map(|k| 10.0 * k as f64))
            .collect();
        assert_eq!(round_ticks(100), hundred);
    }
}

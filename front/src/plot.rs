//! The charts of `fedge eval --plot PATH.png`, drawn with the `image` crate and an embedded
//! 8×8 bitmap font (no system fonts needed, so they work on a headless gateway or in CI):
//!
//! - [`render_curves`]: target accuracy after every round, one line per algorithm (`PATH.png`);
//! - [`render`]: the average target accuracy of each algorithm as a horizontal bar with a ±1 std
//!   whisker over seeds and one tick per held-out domain (`PATH-bars.png`);
//! - [`render_tradeoff`]: with `--dp-noise`, the held-out accuracy against the ε spent, one line
//!   per algorithm on a logarithmic ε axis, its run without DP as a dashed level
//!   (`PATH-privacy.png`).

use std::path::Path;

use font8x8::{BASIC_FONTS, UnicodeFonts};
use image::{Rgb, RgbImage};

/// One bar: a label, the mean and std of the average, and per-domain means (all in %).
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

const SCALE: u32 = 2;
const CHAR: u32 = 8 * SCALE;
const ROW: u32 = 44;
const LEFT: u32 = 250;
const WIDTH: u32 = 1040;
const PLOT_W: u32 = WIDTH - LEFT - 60;
const INK: Rgb<u8> = Rgb([30, 30, 30]);
const GRID: Rgb<u8> = Rgb([225, 225, 225]);
const BAR: Rgb<u8> = Rgb([70, 130, 180]);
const TICK: Rgb<u8> = Rgb([230, 120, 30]);

/// Renders the chart.
pub fn render(title: &str, bars: &[Bar]) -> RgbImage {
    let top = 70;
    let height = top + ROW * bars.len() as u32 + 60;
    let mut img = RgbImage::from_pixel(WIDTH, height, Rgb([255, 255, 255]));
    heading(&mut img, title);
    let x_of = |pct: f32| LEFT + ((pct.clamp(0.0, 100.0) / 100.0) * PLOT_W as f32) as u32;
    let bottom = top + ROW * bars.len() as u32;
    for pct in (0..=100).step_by(10) {
        let x = x_of(pct as f32);
        fill(&mut img, x, top - 6, 1, bottom - top + 6, GRID);
        let label = pct.to_string();
        text(
            &mut img,
            x.saturating_sub(CHAR * label.len() as u32 / 2),
            bottom + 8,
            &label,
            INK,
        );
    }
    text(
        &mut img,
        LEFT,
        bottom + 32,
        "accuracy % (whisker: 1 std; ticks: domains)",
        INK,
    );
    for (i, bar) in bars.iter().enumerate() {
        let y = top + ROW * i as u32;
        text(&mut img, 16, y + 10, &bar.label, INK);
        let value = format!("{:.1}", bar.mean);
        let end = x_of(bar.mean);
        fill(&mut img, LEFT, y + 6, end - LEFT, ROW - 16, BAR);
        let (lo, hi) = (x_of(bar.mean - bar.std), x_of(bar.mean + bar.std));
        fill(&mut img, lo, y + ROW / 2 - 1, hi - lo + 1, 3, INK);
        fill(&mut img, lo, y + 10, 2, ROW - 24, INK);
        fill(&mut img, hi, y + 10, 2, ROW - 24, INK);
        for d in &bar.domains {
            fill(&mut img, x_of(*d), y + 2, 3, ROW - 8, TICK);
        }
        let after = hi.max(bar.domains.iter().map(|d| x_of(*d) + 3).max().unwrap_or(0));
        let x = (after + 8).min(WIDTH - CHAR * value.len() as u32);
        text(&mut img, x, y + 10, &value, INK);
    }
    img
}

/// One line of [`render_curves`]: a label and a value (%) per round, rounds from 1.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Algorithm name.
    pub label: String,
    /// Value after round `i + 1`.
    pub points: Vec<f32>,
}

const PALETTE: [Rgb<u8>; 8] = [
    Rgb([31, 119, 180]),
    Rgb([255, 127, 14]),
    Rgb([44, 160, 44]),
    Rgb([214, 39, 40]),
    Rgb([148, 103, 189]),
    Rgb([140, 86, 75]),
    Rgb([227, 119, 194]),
    Rgb([127, 127, 127]),
];
const CURVE_LEFT: u32 = 80;
const CURVE_TOP: u32 = 60;
const CURVE_W: u32 = 600;
const CURVE_H: u32 = 420;

/// Renders one line per curve against the round, with a legend; the y axis spans the values
/// rounded out to tens.
pub fn render_curves(title: &str, curves: &[Curve]) -> RgbImage {
    let mut img = RgbImage::from_pixel(WIDTH, CURVE_TOP + CURVE_H + 70, Rgb([255, 255, 255]));
    heading(&mut img, title);
    let values = curves.iter().flat_map(|c| c.points.iter().copied());
    let (lo, hi) = values.fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo, hi) = if lo.is_finite() {
        (
            (lo / 10.0).floor() * 10.0,
            ((hi / 10.0).ceil() * 10.0).max(lo + 10.0),
        )
    } else {
        (0.0, 100.0)
    };
    let rounds = curves
        .iter()
        .map(|c| c.points.len())
        .max()
        .unwrap_or(1)
        .max(2);
    let x_of = |i: usize| CURVE_LEFT + (i as u32 * CURVE_W) / (rounds as u32 - 1);
    let y_of = |v: f32| {
        let f = ((v - lo) / (hi - lo)).clamp(0.0, 1.0);
        CURVE_TOP + CURVE_H - (f * CURVE_H as f32) as u32
    };
    let bottom = CURVE_TOP + CURVE_H;
    let mut v = lo;
    while v <= hi + 0.01 {
        let y = y_of(v);
        fill(&mut img, CURVE_LEFT, y, CURVE_W + 1, 1, GRID);
        let label = format!("{v:.0}");
        text(
            &mut img,
            CURVE_LEFT - 8 - CHAR * label.len() as u32,
            y - CHAR / 2,
            &label,
            INK,
        );
        v += if hi - lo > 40.0 { 10.0 } else { 5.0 };
    }
    let step = rounds.div_ceil(10);
    for i in (0..rounds).step_by(step) {
        let label = (i + 1).to_string();
        let x = x_of(i);
        fill(&mut img, x, bottom, 1, 6, INK);
        text(
            &mut img,
            x.saturating_sub(CHAR * label.len() as u32 / 2),
            bottom + 10,
            &label,
            INK,
        );
    }
    fill(&mut img, CURVE_LEFT, CURVE_TOP, 1, CURVE_H + 1, INK);
    fill(&mut img, CURVE_LEFT, bottom, CURVE_W + 1, 1, INK);
    text(
        &mut img,
        CURVE_LEFT,
        bottom + 34,
        "round (y: held-out accuracy %)",
        INK,
    );
    for (k, curve) in curves.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let points: Vec<(u32, u32)> = curve
            .points
            .iter()
            .enumerate()
            .map(|(i, v)| (x_of(i), y_of(*v)))
            .collect();
        for pair in points.windows(2) {
            line(&mut img, pair[0], pair[1], color);
        }
        for &(x, y) in &points {
            fill(
                &mut img,
                x.saturating_sub(2),
                y.saturating_sub(2),
                5,
                5,
                color,
            );
        }
        let ly = CURVE_TOP + 10 + k as u32 * (CHAR + 12);
        let lx = CURVE_LEFT + CURVE_W + 30;
        fill(&mut img, lx, ly + CHAR / 2 - 2, 24, 5, color);
        text(&mut img, lx + 32, ly, &curve.label, INK);
    }
    img
}

/// Writes [`render_curves`] as PNG.
pub fn write_curves(path: &Path, title: &str, curves: &[Curve]) -> Result<(), PlotError> {
    save(render_curves(title, curves), path)
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

/// Renders accuracy against ε (log scale, decades from the smallest to the largest ε), with
/// ±1 std whiskers and each line's accuracy without DP dashed.
pub fn render_tradeoff(title: &str, lines: &[Tradeoff]) -> RgbImage {
    let mut img = RgbImage::from_pixel(WIDTH, CURVE_TOP + CURVE_H + 70, Rgb([255, 255, 255]));
    heading(&mut img, title);
    let eps = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let eps: Vec<f64> = eps.filter(|e| e.is_finite() && *e > 0.0).collect();
    let lo = eps.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = eps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = match lo.is_finite() {
        true => (
            lo.log10().floor(),
            hi.log10().ceil().max(lo.log10().floor() + 1.0),
        ),
        false => (0.0, 1.0),
    };
    let x_of = |e: f64| {
        let f = ((e.log10() - lo) / (hi - lo)).clamp(0.0, 1.0);
        CURVE_LEFT + (f * CURVE_W as f64) as u32
    };
    let y_of =
        |v: f32| CURVE_TOP + CURVE_H - ((v.clamp(0.0, 100.0) / 100.0) * CURVE_H as f32) as u32;
    let bottom = CURVE_TOP + CURVE_H;
    for pct in (0..=100).step_by(10) {
        let y = y_of(pct as f32);
        fill(&mut img, CURVE_LEFT, y, CURVE_W + 1, 1, GRID);
        let label = pct.to_string();
        let x = CURVE_LEFT - 8 - CHAR * label.len() as u32;
        text(&mut img, x, y - CHAR / 2, &label, INK);
    }
    let mut decade = lo;
    while decade <= hi + 1e-9 {
        let x = x_of(10f64.powf(decade));
        fill(&mut img, x, CURVE_TOP, 1, CURVE_H, GRID);
        let label = format!("{}", 10f64.powf(decade));
        let at = x.saturating_sub(CHAR * label.len() as u32 / 2);
        text(&mut img, at, bottom + 10, &label, INK);
        decade += 1.0;
    }
    fill(&mut img, CURVE_LEFT, CURVE_TOP, 1, CURVE_H + 1, INK);
    fill(&mut img, CURVE_LEFT, bottom, CURVE_W + 1, 1, INK);
    let caption = "epsilon, log scale (y: accuracy %; dashed: no DP)";
    text(&mut img, CURVE_LEFT, bottom + 34, caption, INK);
    for (k, l) in lines.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let mut points: Vec<(f64, f32, f32)> = (l.points.iter().copied())
            .filter(|p| p.0.is_finite() && p.0 > 0.0)
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let at: Vec<(u32, u32)> = points.iter().map(|p| (x_of(p.0), y_of(p.1))).collect();
        for pair in at.windows(2) {
            line(&mut img, pair[0], pair[1], color);
        }
        for (&(x, y), p) in at.iter().zip(&points) {
            let (top, low) = (y_of(p.1 + p.2), y_of(p.1 - p.2));
            fill(&mut img, x, top, 1, low - top + 1, color);
            fill(
                &mut img,
                x.saturating_sub(3),
                y.saturating_sub(3),
                7,
                7,
                color,
            );
        }
        if let Some(level) = l.without_dp {
            let y = y_of(level);
            for x in (CURVE_LEFT..CURVE_LEFT + CURVE_W).step_by(12) {
                fill(&mut img, x, y, 6, 2, color);
            }
        }
        let ly = CURVE_TOP + 10 + k as u32 * (CHAR + 12);
        let lx = CURVE_LEFT + CURVE_W + 30;
        fill(&mut img, lx, ly + CHAR / 2 - 2, 24, 5, color);
        text(&mut img, lx + 32, ly, &l.label, INK);
    }
    img
}

/// Writes [`render_tradeoff`] as PNG.
pub fn write_tradeoff(path: &Path, title: &str, lines: &[Tradeoff]) -> Result<(), PlotError> {
    save(render_tradeoff(title, lines), path)
}

/// A 3-pixel-wide straight line from `a` to `b`.
fn line(img: &mut RgbImage, a: (u32, u32), b: (u32, u32), color: Rgb<u8>) {
    let (dx, dy) = (b.0 as f32 - a.0 as f32, b.1 as f32 - a.1 as f32);
    let steps = dx.abs().max(dy.abs()).max(1.0) as u32;
    for s in 0..=steps {
        let t = s as f32 / steps as f32;
        let x = (a.0 as f32 + dx * t).round() as u32;
        let y = (a.1 as f32 + dy * t).round() as u32;
        fill(img, x.saturating_sub(1), y.saturating_sub(1), 3, 3, color);
    }
}

/// Writes the chart as PNG.
pub fn write(path: &Path, title: &str, bars: &[Bar]) -> Result<(), PlotError> {
    save(render(title, bars), path)
}

/// A chart that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {}", path.display())]
pub struct PlotError {
    /// Where the chart was to go.
    pub path: std::path::PathBuf,
    /// Why it did not.
    #[source]
    pub source: image::ImageError,
}

fn save(img: RgbImage, path: &Path) -> Result<(), PlotError> {
    img.save(path).map_err(|source| PlotError {
        path: path.to_owned(),
        source,
    })
}

/// The title, wrapped at spaces onto at most two lines that fit the width.
fn heading(img: &mut RgbImage, title: &str) {
    let max = ((WIDTH - 32) / CHAR) as usize;
    let mut lines = vec![String::new()];
    for word in title.split(' ') {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > max {
            lines.push(word.to_owned());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    for (i, line) in lines.iter().take(2).enumerate() {
        text(img, 16, 8 + i as u32 * (CHAR + 4), line, INK);
    }
}

fn fill(img: &mut RgbImage, x: u32, y: u32, w: u32, h: u32, color: Rgb<u8>) {
    for yy in y..(y + h).min(img.height()) {
        for xx in x..(x + w).min(img.width()) {
            img.put_pixel(xx, yy, color);
        }
    }
}

fn text(img: &mut RgbImage, x: u32, y: u32, s: &str, color: Rgb<u8>) {
    for (i, c) in s.chars().enumerate() {
        let Some(glyph) = BASIC_FONTS.get(c).or_else(|| BASIC_FONTS.get('?')) else {
            continue;
        };
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) != 0 {
                    let px = x + (i as u32 * 8 + col) * SCALE;
                    let py = y + row as u32 * SCALE;
                    fill(img, px, py, SCALE, SCALE, color);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_as_long_as_their_values_and_text_is_drawn() {
        let bars = vec![
            Bar {
                label: "fedavg".into(),
                mean: 50.0,
                std: 2.0,
                domains: vec![40.0, 60.0],
            },
            Bar {
                label: "feddim+fedomg".into(),
                mean: 80.0,
                std: 0.0,
                domains: vec![],
            },
        ];
        let img = render("digits", &bars);
        let bar_row = |i: u32| 70 + ROW * i + 8;
        let is_bar = |x: u32, y: u32| *img.get_pixel(x, y) == BAR;
        // Bar 0 ends at 50 %, bar 1 at 80 %.
        let x50 = LEFT + PLOT_W / 2;
        assert!(is_bar(x50 - 3, bar_row(0)) && !is_bar(x50 + 3, bar_row(0)));
        let x80 = LEFT + PLOT_W * 8 / 10;
        assert!(is_bar(x80 - 3, bar_row(1)) && !is_bar(x80 + 3, bar_row(1)));
        // Some ink in the label area of each row.
        for i in 0..2 {
            let y0 = 70 + ROW * i;
            let ink = (16..200).any(|x| (y0..y0 + ROW).any(|y| *img.get_pixel(x, y) == INK));
            assert!(ink, "row {i} has no label");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plot.png");
        write(&path, "digits", &bars).unwrap();
        assert_eq!(image::open(&path).unwrap().width(), WIDTH);
    }

    #[test]
    fn curves_go_through_their_points_in_their_colour() {
        let curves = vec![
            Curve {
                label: "fedavg".into(),
                points: vec![20.0, 40.0, 60.0],
            },
            Curve {
                label: "fedomg".into(),
                points: vec![30.0, 30.0, 30.0],
            },
        ];
        let img = render_curves("t", &curves);
        // The axis spans 20..60: round 1 of fedavg sits at the bottom, round 3 at the top.
        let (x1, x3) = (CURVE_LEFT, CURVE_LEFT + CURVE_W);
        let (bottom, top) = (CURVE_TOP + CURVE_H, CURVE_TOP);
        assert_eq!(*img.get_pixel(x1, bottom), PALETTE[0]);
        assert_eq!(*img.get_pixel(x3, top), PALETTE[0]);
        // Round 2 of fedavg (40 %) is halfway up, in the middle.
        assert_eq!(
            *img.get_pixel(x1 + CURVE_W / 2, (top + bottom) / 2),
            PALETTE[0]
        );
        // fedomg is flat at 30 %, a quarter of the way up.
        let y30 = bottom - CURVE_H / 4;
        assert_eq!(*img.get_pixel(x1 + CURVE_W / 4, y30), PALETTE[1]);
        assert_ne!(*img.get_pixel(x1 + CURVE_W / 4, y30 - 20), PALETTE[1]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("curves.png");
        write_curves(&path, "t", &curves).unwrap();
        assert_eq!(image::open(&path).unwrap().width(), WIDTH);
    }
}

//! `fedge bench --plot PATH.png`: the average target accuracy of each algorithm as a horizontal
//! bar with a ±1 std whisker over seeds, and one tick per held-out domain, drawn with the
//! `image` crate and an embedded 8×8 bitmap font (no system fonts needed).

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
    text(&mut img, 16, 16, title, INK);
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

/// Writes the chart as PNG.
pub fn write(path: &Path, title: &str, bars: &[Bar]) -> Result<(), String> {
    render(title, bars)
        .save(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
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
}

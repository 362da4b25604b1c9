//! [`render_curves`](super::render_curves): accuracy per round, a band over seeds.

use image::RgbImage;
use plotters::prelude::*;

use super::axis::{Axis, Ticked, nice_step};
use super::canvas::{canvas, text};
use super::data::{Curve, PlotError};
use super::parts::{
    AXIS, BAND_ALPHA, CHART_H, DESC_PX, Frame, GRID, INK, LABEL_PX, Mark, PAD, WIDTH, colour,
    draw_key, key_width, titled, wrap,
};
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
pub(super) fn round_ticks(rounds: usize) -> Vec<f64> {
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

pub(super) fn draw_curves(title: &str, curves: &[Curve]) -> Result<(RgbImage, Frame), PlotError> {
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

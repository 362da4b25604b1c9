//! [`render_tradeoff`](super::render_tradeoff): accuracy against ε on a logarithmic axis.

use image::RgbImage;
use plotters::prelude::*;

use super::axis::Axis;
use super::canvas::{canvas, text};
use super::data::{PlotError, Tradeoff};
use super::parts::{
    AXIS, CHART_H, DESC_PX, Frame, GRID, INK, LABEL_PX, MUTED, Mark, PAD, WIDTH, colour, draw_key,
    key_width, titled, wrap,
};
/// The ε axis: whole decades around the positive ε values, and its ticks (1, 2 and 5 per
/// decade over at most two decades, decades alone beyond).
pub(super) fn epsilon_axis(lines: &[Tradeoff]) -> ((f64, f64), Vec<f64>) {
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
pub(super) fn epsilon_label(v: f64) -> String {
    let decimals = (-v.log10().floor()).max(0.0) as usize;
    format!("{v:.decimals$}")
}

pub(super) fn draw_tradeoff(
    title: &str,
    lines: &[Tradeoff],
) -> Result<(RgbImage, Frame), PlotError> {
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

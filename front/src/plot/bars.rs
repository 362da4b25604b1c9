//! [`render`](super::render): each algorithm's accuracy as a bar, or a dot on a zoomed axis.

use image::RgbImage;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::axis::{Axis, Ticked};
use super::canvas::{canvas, left_middle, measure, text};
use super::data::{Bar, PlotError};
use super::parts::{
    AXIS, BAR_TINT, DESC_PX, Frame, GRID, INK, LABEL_PX, LEGEND_PX, MARK_W, MUTED, Mark, NOTE_PX,
    PAD, WIDTH, colour, draw_mark, tint, title_height, titled, wrap,
};

/// A bar chart whose fitted axis would start at or above this accuracy (%) is zoomed instead
/// of starting at 0.
const ZOOM_FROM: f64 = 20.0;

/// The accuracy axis of the per-algorithm chart and whether it is zoomed (does not start at
/// 0).
pub(super) fn bar_axis(bars: &[Bar]) -> (Axis, bool) {
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

pub(super) fn draw_bars(title: &str, bars: &[Bar]) -> Result<(RgbImage, Frame), PlotError> {
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

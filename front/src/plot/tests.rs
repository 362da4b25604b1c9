use image::RgbImage;
use plotters::prelude::*;

use super::axis::Axis;
use super::bars::{bar_axis, draw_bars};
use super::curves::{draw_curves, round_ticks};
use super::parts::{BAND_ALPHA, BAR_TINT, MUTED, WIDTH, colour, tint};
use super::tradeoff::{draw_tradeoff, epsilon_axis, epsilon_label};
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

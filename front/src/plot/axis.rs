//! Accuracy axes fitted to their values, with round ticks.

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::prelude::*;
/// A step of 1, 2 or 5 times a power of ten giving at most `max` intervals over `span`.
pub(super) fn nice_step(span: f64, max: usize) -> f64 {
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
pub(super) struct Axis {
    pub(super) lo: f64,
    pub(super) hi: f64,
    step: f64,
}

impl Axis {
    /// The axis over the finite `values` with a margin, rounded out to whole steps, kept within
    /// 0–100 (0–100 itself when there is no value).
    pub(super) fn fit(values: impl IntoIterator<Item = f32>, max_ticks: usize) -> Self {
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
    pub(super) fn span(lo: f64, hi: f64, max_ticks: usize) -> Self {
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
    pub(super) fn coord(&self) -> Ticked {
        Ticked {
            lo: self.lo,
            hi: self.hi,
            ticks: self.ticks(),
        }
    }

    pub(super) fn label(&self, v: f64) -> String {
        match self.step.fract() == 0.0 {
            true => format!("{v:.0}"),
            false => format!("{v:.1}"),
        }
    }
}

/// A linear axis with the given ticks (plotters' own f64 axis chooses its ticks itself, and
/// its tick-binding wrapper loses the label formatter).
pub(super) struct Ticked {
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) ticks: Vec<f64>,
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

//! What the charts are drawn from, and the one error they return: the leaf every chart file
//! and the text canvas use.

use std::path::PathBuf;

/// One row of `render`: a label, the mean and std of the average, and per-domain means (all
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

/// One line of `render_curves`: values (%) per round, rounds from 1.
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

//! fedge differential privacy: the Gaussian mechanism on a model delta and the accountant
//! that turns its rounds into an (ε, δ) guarantee.
//!
//! Formulas and their sources are in `docs/algorithms.md §8`. The crate has three parts:
//! - [`rdp`]: the Rényi DP of one step of the subsampled Gaussian mechanism, for Poisson and
//!   fixed-size (without replacement) sampling of devices;
//! - [`Accountant`]: composition over rounds (RDP adds up), conversion to (ε, δ) by the
//!   standard or the improved rule, and how many more rounds fit under a target ε;
//! - [`gaussian`]: clipping a flat f32 delta to an L2 norm and adding seeded Gaussian noise,
//!   for central DP-FedAvg on the coordinator and local DP on a device.
//!
//! The accountant is checked against Google's dp-accounting and Meta's Opacus with vectors
//! recorded by `privacy/tools/reference.sh` (`privacy/tests/reference.json`).
//! It depends on no other fedge crate, so the coordinator and the edge can both use it.

#![forbid(unsafe_code)]

mod accountant;
pub mod gaussian;
pub mod rdp;

pub use accountant::{
    Accountant, Conversion, Guarantee, Neighbouring, Sampling, Steps, convert, default_orders,
};
pub use gaussian::{Clip, GaussianNoise, clip_l2, l2_norm, privatize};

/// A parameter outside its domain.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrivacyError {
    /// A Poisson sampling rate outside `[0, 1]`.
    #[error("sampling rate {0} is not in [0, 1]")]
    SamplingRate(f64),
    /// A fixed-size sample larger than its population, or an empty population.
    #[error("a sample of {sample} out of {population} devices")]
    FixedSize {
        /// Devices per round.
        sample: u64,
        /// Devices that could be chosen.
        population: u64,
    },
    /// A negative or non-finite noise multiplier.
    #[error("noise multiplier {0} is not a finite number ≥ 0")]
    NoiseMultiplier(f64),
    /// A δ outside `(0, 1)`.
    #[error("delta {0} is not in (0, 1)")]
    Delta(f64),
    /// An empty or invalid list of orders, or RDP values that do not match them.
    #[error("RDP orders: {0}")]
    Orders(String),
    /// Poisson and fixed-size steps in one accountant (their neighbouring relations differ).
    #[error(
        "Poisson and fixed-size sampling cannot be composed in one accountant: their bounds hold for different neighbouring relations"
    )]
    MixedSampling,
    /// A negative or non-finite clip norm or noise standard deviation.
    #[error("{what} {value} is not a finite number ≥ 0")]
    Scale {
        /// Which parameter.
        what: &'static str,
        /// Its value.
        value: f64,
    },
}

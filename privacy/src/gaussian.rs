//! The Gaussian mechanism on a flat f32 delta: L2 clipping and seeded Gaussian noise
//! (`docs/algorithms.md §8`).
//!
//! Central DP-FedAvg clips every device's delta with [`clip_l2`], sums them, adds noise of
//! standard deviation `noise_multiplier × clip_norm` once to the sum with
//! [`GaussianNoise::add`], and divides by the expected weight. Local DP does both on the
//! device with [`privatize`].
//!
//! **Choice**: normal draws come from the Box–Muller transform written here, on a ChaCha-based
//! [`StdRng`] (rand 0.9), because the lock file has no `rand_distr` built on rand 0.9. A seed
//! makes tests and simulations reproducible; a deployment should use
//! [`GaussianNoise::from_os_rng`]. Like every floating-point sampler, it does not defend against
//! attacks on the low-order bits of the noise (Mironov 2012 shows one for Laplace noise).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::PrivacyError;

/// What [`clip_l2`] did to a delta.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clip {
    /// The delta's L2 norm before clipping.
    pub norm: f64,
    /// Whether it was scaled down (its norm exceeded the clip norm).
    pub clipped: bool,
}

/// The L2 norm of `values`, summed in f64.
pub fn l2_norm(values: &[f32]) -> f64 {
    values
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt()
}

fn check_scale(what: &'static str, value: f64) -> Result<(), PrivacyError> {
    if value >= 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(PrivacyError::Scale { what, value })
    }
}

/// Scales `delta` in place so that its L2 norm is at most `clip_norm`:
/// `Δ ← Δ · min(1, C / ‖Δ‖₂)`.
///
/// After the f32 rounding of the scaled values the norm is still at most `clip_norm` (it is
/// scaled again, by one f32 step less, in the rare case rounding pushed it over), and within a
/// few f32 steps of it when the delta was clipped. A delta with a non-finite norm (NaN or
/// infinite values) is zeroed and reported as clipped.
pub fn clip_l2(delta: &mut [f32], clip_norm: f64) -> Result<Clip, PrivacyError> {
    check_scale("clip norm", clip_norm)?;
    let norm = l2_norm(delta);
    if norm <= clip_norm {
        return Ok(Clip {
            norm,
            clipped: false,
        });
    }
    if !norm.is_finite() || clip_norm == 0.0 {
        delta.fill(0.0);
        return Ok(Clip {
            norm,
            clipped: true,
        });
    }
    let mut current = norm;
    while current > clip_norm {
        let mut scale = (clip_norm / current) as f32;
        if current != norm {
            // A second pass only happens when rounding overshot: step the factor down.
            scale = f32::from_bits(scale.to_bits() - 1);
        }
        delta.iter_mut().for_each(|v| *v *= scale);
        current = l2_norm(delta);
    }
    Ok(Clip {
        norm,
        clipped: true,
    })
}

/// A source of independent standard normal draws from a seeded [`StdRng`].
#[derive(Clone, Debug)]
pub struct GaussianNoise {
    rng: StdRng,
    /// Box–Muller yields normals in pairs; the second waits here.
    spare: Option<f64>,
}

impl GaussianNoise {
    /// A reproducible source: the same seed gives the same draws.
    pub fn from_seed(seed: u64) -> Self {
        GaussianNoise::from_rng(StdRng::seed_from_u64(seed))
    }

    /// A source seeded from the operating system's entropy, for deployments.
    pub fn from_os_rng() -> Self {
        GaussianNoise::from_rng(StdRng::from_os_rng())
    }

    /// A source drawing from the given generator.
    pub fn from_rng(rng: StdRng) -> Self {
        GaussianNoise { rng, spare: None }
    }

    /// One draw from N(0, 1).
    ///
    /// Box–Muller: with `u₁ ∈ (0, 1]` and `u₂ ∈ [0, 1)` uniform, `√(−2 ln u₁) cos(2π u₂)` and
    /// `√(−2 ln u₁) sin(2π u₂)` are independent standard normals.
    pub fn sample(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        let u1 = 1.0 - self.rng.random::<f64>();
        let u2: f64 = self.rng.random();
        let radius = (-2.0 * u1.ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * u2).sin_cos();
        self.spare = Some(radius * sin);
        radius * cos
    }

    /// Adds independent N(0, `std`²) noise to every value of `delta`.
    pub fn add(&mut self, delta: &mut [f32], std: f64) -> Result<(), PrivacyError> {
        check_scale("noise standard deviation", std)?;
        if std == 0.0 {
            return Ok(());
        }
        for v in delta.iter_mut() {
            *v = (f64::from(*v) + std * self.sample()) as f32;
        }
        Ok(())
    }
}

/// Local DP on a device: clips `delta` to `clip_norm`, then adds N(0, (σ·C)²) noise to every
/// value, with `σ = noise_multiplier` and `C = clip_norm`. Returns what the clipping did.
pub fn privatize(
    delta: &mut [f32],
    clip_norm: f64,
    noise_multiplier: f64,
    noise: &mut GaussianNoise,
) -> Result<Clip, PrivacyError> {
    check_scale("noise multiplier", noise_multiplier)?;
    let clip = clip_l2(delta, clip_norm)?;
    noise.add(delta, noise_multiplier * clip_norm)?;
    Ok(clip)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic test vector with the given norm (a seeded, non-Gaussian direction).
    fn vector(len: usize, norm: f64, seed: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(seed);
        let raw: Vec<f64> = (0..len).map(|_| rng.random::<f64>() - 0.3).collect();
        let n = raw.iter().map(|v| v * v).sum::<f64>().sqrt();
        raw.iter().map(|v| (v * norm / n) as f32).collect()
    }

    #[test]
    fn clipping_bounds_the_norm_and_keeps_the_direction() {
        for (seed, len) in [(1u64, 10usize), (2, 1000), (3, 100_000)] {
            for clip_norm in [0.1, 1.0, 3.7] {
                let original = vector(len, 5.0, seed);
                let mut delta = original.clone();
                let clip = clip_l2(&mut delta, clip_norm).unwrap();
                assert!(clip.clipped);
                assert!((clip.norm - 5.0).abs() < 1e-5, "{}", clip.norm);
                let after = l2_norm(&delta);
                assert!(after <= clip_norm, "{after} > {clip_norm}");
                assert!(after >= clip_norm * (1.0 - 1e-6), "{after} ≪ {clip_norm}");
                // Same direction: every value scaled by the same factor.
                let factor = clip_norm / clip.norm;
                for (a, b) in original.iter().zip(&delta) {
                    assert!(
                        (f64::from(*a) * factor - f64::from(*b)).abs()
                            <= 1e-6 * f64::from(a.abs()).max(1e-30)
                    );
                }
            }
        }
    }

    #[test]
    fn a_short_delta_is_left_alone() {
        let original = vector(500, 0.75, 9);
        let mut delta = original.clone();
        let clip = clip_l2(&mut delta, 1.0).unwrap();
        assert!(!clip.clipped);
        assert!((clip.norm - 0.75).abs() < 1e-6);
        assert_eq!(delta, original);
    }

    #[test]
    fn degenerate_deltas_are_zeroed() {
        let mut delta = vec![1.0, f32::NAN, 2.0];
        assert!(clip_l2(&mut delta, 1.0).unwrap().clipped);
        assert_eq!(delta, vec![0.0; 3]);
        let mut delta = vec![1.0, -1.0];
        assert!(clip_l2(&mut delta, 0.0).unwrap().clipped);
        assert_eq!(delta, vec![0.0; 2]);
        assert!(clip_l2(&mut delta, -1.0).is_err());
    }

    /// Sample mean, standard deviation and fraction within one std of the noise added.
    fn noise_stats(seed: u64, n: usize, std: f64) -> (f64, f64, f64) {
        let base = vector(n, 3.0, seed ^ 0xabc);
        let mut noisy = base.clone();
        GaussianNoise::from_seed(seed).add(&mut noisy, std).unwrap();
        let noise: Vec<f64> = noisy
            .iter()
            .zip(&base)
            .map(|(a, b)| f64::from(*a) - f64::from(*b))
            .collect();
        let mean = noise.iter().sum::<f64>() / n as f64;
        let var = noise.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n as f64 - 1.0);
        let within = noise.iter().filter(|x| x.abs() <= std).count() as f64 / n as f64;
        (mean, var.sqrt(), within)
    }

    #[test]
    fn noise_has_the_requested_mean_and_scale() {
        const N: usize = 100_000;
        for (seed, std) in [(7u64, 0.5), (8, 2.0), (9, 0.01)] {
            let (mean, sd, within) = noise_stats(seed, N, std);
            // Five standard errors: of the mean σ/√n, of the sample std ≈ σ/√(2n), of a
            // proportion √(p(1−p)/n); P(|Z| ≤ 1) = 0.682689 for a normal.
            let n = N as f64;
            assert!(
                mean.abs() < 5.0 * std / n.sqrt(),
                "seed {seed}: mean {mean}"
            );
            assert!(
                (sd - std).abs() < 5.0 * std / (2.0 * n).sqrt(),
                "seed {seed}: std {sd}"
            );
            let p = 0.682_689_492;
            assert!(
                (within - p).abs() < 5.0 * (p * (1.0 - p) / n).sqrt(),
                "seed {seed}: {within}"
            );
        }
    }

    #[test]
    fn seeds_reproduce_and_differ() {
        let draw = |seed| {
            let mut g = GaussianNoise::from_seed(seed);
            (0..5).map(|_| g.sample()).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
    }

    #[test]
    fn privatize_clips_then_noises() {
        const N: usize = 100_000;
        let mut delta = vector(N, 10.0, 5);
        let mut reference = delta.clone();
        let clip = privatize(&mut delta, 2.0, 0.8, &mut GaussianNoise::from_seed(11)).unwrap();
        assert!(clip.clipped);
        clip_l2(&mut reference, 2.0).unwrap();
        let noise: Vec<f64> = delta
            .iter()
            .zip(&reference)
            .map(|(a, b)| f64::from(*a) - f64::from(*b))
            .collect();
        let var = noise.iter().map(|x| x * x).sum::<f64>() / N as f64;
        let want = 0.8 * 2.0;
        assert!(
            (var.sqrt() - want).abs() < 5.0 * want / (2.0 * N as f64).sqrt(),
            "{}",
            var.sqrt()
        );
        assert!(privatize(&mut delta, 1.0, f64::NAN, &mut GaussianNoise::from_seed(1)).is_err());
    }
}

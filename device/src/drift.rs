//! Noticing that what a device serves has changed, without labels (docs/algorithms.md §9).
//!
//! Every prediction yields one number, how far the image's features are from the nearest class
//! the federation trained on (`fedge_wire::Familiarity::distance`). While the site stays as it
//! was, these numbers follow the distribution they had in a reference sample taken from the
//! site (its own data, or the first requests it served); a new sensor, a dirty lens or a new
//! kind of object moves them. The detector turns each number into a normal score against the
//! reference (`z = Φ⁻¹(rank / (n + 1))`), so whatever the distances' distribution, a stable
//! stream gives scores close to standard normal, and runs a two-sided CUSUM on them (Page,
//! 1954): `U ← max(0, U + z − k)`, `L ← max(0, L − z − k)`, an alarm when either passes `h`.
//! `k = 0.5` is tuned to a shift of one standard deviation of the score; `h = 13` was chosen so
//! that a stable stream raises at most one alarm per 100,000 requests (`fedge bench drift`
//! measures both that and the detection delay; BENCHMARKS.md, "Drift alarm").
//!
//! Pure: it sees scores, not images, clocks or files.

/// Least reference scores the detector starts from.
pub const MIN_REFERENCE: usize = 100;
/// Reference scores kept at most (a larger sample is thinned evenly).
pub const MAX_REFERENCE: usize = 4096;
/// The CUSUM's allowance `k`, in standard deviations of the normal score.
pub const ALLOWANCE: f64 = 0.5;
/// The CUSUM's alarm threshold `h`.
pub const THRESHOLD: f64 = 13.0;

/// A two-sided CUSUM on normal scores against a reference sample.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftDetector {
    /// The reference scores, sorted.
    reference: Vec<f32>,
    upper: f64,
    lower: f64,
    /// Requests seen since the last alarm or reset.
    run: u64,
}

/// What one observation did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The normal score of the value against the reference.
    pub z: f64,
    /// `max(U, L) / h`: 1 at the alarm.
    pub level: f64,
    /// The statistic crossed `h` with this value: the stream has drifted. The sums start
    /// again from zero after an alarm.
    pub alarm: bool,
}

impl DriftDetector {
    /// A detector comparing the stream with `reference` (finite values only are kept);
    /// `None` with fewer than [`MIN_REFERENCE`] of them.
    pub fn new(reference: impl IntoIterator<Item = f32>) -> Option<Self> {
        let mut values: Vec<f32> = reference.into_iter().filter(|v| v.is_finite()).collect();
        if values.len() < MIN_REFERENCE {
            return None;
        }
        values.sort_by(f32::total_cmp);
        if values.len() > MAX_REFERENCE {
            let n = values.len();
            values = (0..MAX_REFERENCE)
                .map(|i| values[i * n / MAX_REFERENCE])
                .collect();
        }
        Some(Self {
            reference: values,
            upper: 0.0,
            lower: 0.0,
            run: 0,
        })
    }

    /// The reference's size.
    pub fn reference_len(&self) -> usize {
        self.reference.len()
    }

    /// Takes one value of the stream.
    pub fn observe(&mut self, value: f32) -> Observation {
        let z = self.normal_score(value);
        self.upper = (self.upper + z - ALLOWANCE).max(0.0);
        self.lower = (self.lower - z - ALLOWANCE).max(0.0);
        self.run += 1;
        let level = self.upper.max(self.lower) / THRESHOLD;
        let alarm = level >= 1.0;
        if alarm {
            self.reset();
        }
        Observation { z, level, alarm }
    }

    /// Starts the sums again (after an alarm, or once the site adapted).
    pub fn reset(&mut self) {
        self.upper = 0.0;
        self.lower = 0.0;
        self.run = 0;
    }

    /// `max(U, L) / h` now: 0 on a quiet stream, 1 at an alarm.
    pub fn level(&self) -> f64 {
        self.upper.max(self.lower) / THRESHOLD
    }

    /// `Φ⁻¹` of the value's mid-rank among the reference, `(rank + ½) / (n + 1)` so that no
    /// value maps to an infinite score. A value that is not finite counts as beyond the
    /// largest.
    fn normal_score(&self, value: f32) -> f64 {
        let n = self.reference.len();
        let (below, not_above) = if value.is_nan() {
            (n, n)
        } else {
            (
                self.reference.partition_point(|r| *r < value),
                self.reference.partition_point(|r| *r <= value),
            )
        };
        let rank = (below + not_above) as f64 / 2.0;
        probit((rank + 0.5) / (n as f64 + 1.0))
    }
}

/// The standard normal quantile `Φ⁻¹(p)` for `0 < p < 1`, by Acklam's rational approximation
/// (relative error below 1.15·10⁻⁹).
pub fn probit(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const LOW: f64 = 0.024_25;
    let p = p.clamp(f64::MIN_POSITIVE, 1.0 - f64::EPSILON);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - LOW {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn probit_matches_the_normal_quantiles() {
        // Python's statistics.NormalDist().inv_cdf at these points.
        for (p, want) in [
            (0.5, 0.0),
            (0.975, 1.959_963_984_540_053_6),
            (0.001, -3.090_232_306_167_813),
            (0.024_25, -1.972_961_051_311_884_5),
            (0.3, -0.524_400_512_708_040_7),
            (0.999_99, 4.264_890_793_923_84),
        ] {
            assert!((probit(p) - want).abs() < 1e-8, "{p}: {}", probit(p));
        }
    }

    fn exponential(rng: &mut rand::rngs::StdRng) -> f32 {
        -(1.0 - rng.random::<f32>()).ln()
    }

    #[test]
    fn a_stable_stream_stays_quiet_and_a_shifted_one_is_caught_soon() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let reference: Vec<f32> = (0..2000).map(|_| exponential(&mut rng)).collect();
        let mut detector = DriftDetector::new(reference).unwrap();
        let alarms = (0..100_000)
            .filter(|_| detector.observe(exponential(&mut rng)).alarm)
            .count();
        assert!(alarms <= 2, "{alarms} alarms on 100,000 stable values");
        // Values three times as large: caught within a few dozen.
        detector.reset();
        let delay = (1..=1000)
            .find(|_| detector.observe(3.0 * exponential(&mut rng)).alarm)
            .expect("caught");
        assert!(delay < 100, "{delay}");
        // Much smaller values (less spread, a washed-out sensor) are caught by the lower sum.
        let delay = (1..=1000)
            .find(|_| detector.observe(0.25 * exponential(&mut rng)).alarm)
            .expect("caught");
        assert!(delay < 100, "{delay}");
        assert!(detector.level() < 1.0);
    }

    #[test]
    fn the_reference_needs_enough_finite_values_and_is_thinned_when_large() {
        assert!(DriftDetector::new((0..MIN_REFERENCE - 1).map(|i| i as f32)).is_none());
        let with_nan = (0..MIN_REFERENCE).map(|i| if i == 0 { f32::NAN } else { i as f32 });
        assert!(DriftDetector::new(with_nan).is_none());
        let large = DriftDetector::new((0..10 * MAX_REFERENCE).map(|i| i as f32)).unwrap();
        assert_eq!(large.reference_len(), MAX_REFERENCE);
        // A value beyond the reference is an extreme score, not an infinite one.
        let mut detector = DriftDetector::new((0..MIN_REFERENCE).map(|i| i as f32)).unwrap();
        let seen = detector.observe(f32::NAN);
        assert!(seen.z.is_finite() && seen.z > 2.0, "{seen:?}");
    }
}

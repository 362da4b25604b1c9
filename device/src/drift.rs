//! Noticing that what a device serves has changed, without labels (docs/algorithms.md §9).
//!
//! Every prediction yields one number, how far the image's features are from the nearest class
//! the federation trained on (`fedge_wire::Familiarity::distance`). While the site stays as it
//! was, these numbers follow the distribution they had in a reference sample taken from the
//! site (its own data, or the first requests it served); a new sensor, a dirty lens or a new
//! kind of object moves them. The detector turns each number into a normal score against the
//! reference (`z = Φ⁻¹(rank / (n + 1))`), so whatever the distances' distribution, a stable
//! stream gives scores close to standard normal, and runs a two-sided CUSUM (Page, 1954) on the
//! means of [`BATCH`] consecutive scores, standardised by the stream's own scale:
//! `U ← min(h, max(0, U + b/σ − k))`, `L ← min(h, max(0, L − b/σ − k))`.
//!
//! Three things make its false-alarm rate hold on any deployment, not only on the ones a
//! threshold was tuned on:
//!
//! - **The reference's own error.** A reference of `n` values places the stream's mean score
//!   off zero by about `1/√n` (the mean of `Φ⁻¹` of an empirical CDF's error), the same for the
//!   whole deployment. The allowance absorbs it: `k = k₀ + c/(√n_eff · σ)`, with `c = 2.5`
//!   (the offset of 99 % of references, with room for the scale's own error: in the unit
//!   tests' synthetic harness, `c = 2` let 1.5 % of 200 deployments raise more than one false
//!   alarm per 100,000 requests, `c = 2.5` none). A reference collected from a stream
//!   ([`DriftDetector::from_stream`]) counts `n_eff = n(1 − r)/(1 + r)` for its lag-1
//!   autocorrelation `r`.
//! - **Requests correlated in time.** `σ`, the batch means' scale, is estimated from the stream
//!   itself, from the median absolute first difference of the last [`SCALE_WINDOW`] batch
//!   means (a step change moves one difference, not the median), never below the value
//!   independent requests would have. The first [`WARM_UP`] batches only learn it.
//! - **A threshold from theory, not from the benchmark's seeds.** With `k₀ = 0.5`, `h = 10`
//!   gives an average run of about 1.4·10⁵ batches per side between false alarms for standard
//!   normal steps (Siegmund's approximation), 7·10⁵ requests for both sides together.
//!
//! The sums are held at `h`: the level stays at 1 while the stream stays changed, one alarm
//! per episode, and the detector is *drifted* until the level falls below one half again. A
//! stream of [`FROZEN`] identical values in a row (a frozen or covered camera gives the same
//! image over and over) is drifted too, whatever its score. `fedge bench drift` measures the
//! false alarms per deployment and the delays (BENCHMARKS.md, "Drift alarm").
//!
//! Pure: it sees scores, not images, clocks or files.

use std::collections::VecDeque;

/// Least reference scores the detector starts from.
pub const MIN_REFERENCE: usize = 100;
/// Reference scores kept at most (a larger sample is thinned evenly).
pub const MAX_REFERENCE: usize = 4096;
/// Requests averaged into one step of the CUSUM.
pub const BATCH: usize = 10;
/// Batch means (and means of [`SPAN`] batch means) whose first differences estimate the
/// stream's scale.
pub const SCALE_WINDOW: usize = 256;
/// Batches in one span: the means of spans see correlations longer than a batch.
pub const SPAN: usize = 8;
/// Batches after the detector starts that only estimate the scale.
pub const WARM_UP: u64 = 16;
/// The CUSUM's allowance `k₀`, in the batch means' standard deviations.
pub const ALLOWANCE: f64 = 0.5;
/// How many of the reference's standard errors `1/√n_eff` the allowance adds (`c`).
pub const REFERENCE_MARGIN: f64 = 2.5;
/// The CUSUM's alarm threshold `h`.
pub const THRESHOLD: f64 = 10.0;
/// Identical values in a row that make a stream frozen.
pub const FROZEN: u32 = 30;

/// Which way a detector watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sides {
    /// Values moving up or down (the familiarity distance).
    Both,
    /// Values falling only (the served head's confidence: a head more sure of itself is no
    /// harm).
    Lower,
}

/// A two-sided CUSUM on batch means of normal scores against a reference sample.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftDetector {
    sides: Sides,
    /// The reference scores, sorted.
    reference: Vec<f32>,
    /// The reference's effective size.
    n_eff: f64,
    /// The batch means' standard deviation for independent requests (the scale's floor).
    floor: f64,
    batch_sum: f64,
    batch_len: usize,
    last_mean: Option<f64>,
    /// Absolute first differences of the last batch means.
    diffs: VecDeque<f64>,
    /// The same for the means of spans of [`SPAN`] batches.
    span_diffs: VecDeque<f64>,
    span_sum: f64,
    span_len: usize,
    last_span: Option<f64>,
    batches: u64,
    upper: f64,
    lower: f64,
    drifted: bool,
    last_value: Option<f32>,
    repeats: u32,
}

/// What one observation did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    /// The normal score of the value against the reference.
    pub z: f64,
    /// `max(U, L) / h`, or 1 on a frozen stream: 1 while the stream has drifted.
    pub level: f64,
    /// The stream became drifted with this value (one alarm per episode).
    pub alarm: bool,
}

impl DriftDetector {
    /// A detector comparing the stream with `reference`, a sample of independent values (a
    /// device's own rows); finite values only are kept. `None` with fewer than
    /// [`MIN_REFERENCE`] of them.
    pub fn new(reference: impl IntoIterator<Item = f32>) -> Option<Self> {
        Self::build(reference, false)
    }

    /// A detector whose `reference` was taken from a stream, in the order it came: its
    /// autocorrelation lowers its effective size (more allowance for its error).
    pub fn from_stream(reference: impl IntoIterator<Item = f32>) -> Option<Self> {
        Self::build(reference, true)
    }

    fn build(reference: impl IntoIterator<Item = f32>, ordered: bool) -> Option<Self> {
        let in_order: Vec<f32> = reference.into_iter().filter(|v| v.is_finite()).collect();
        if in_order.len() < MIN_REFERENCE {
            return None;
        }
        let n = in_order.len();
        let mut values = in_order.clone();
        values.sort_by(f32::total_cmp);
        if values.len() > MAX_REFERENCE {
            values = (0..MAX_REFERENCE)
                .map(|i| values[i * n / MAX_REFERENCE])
                .collect();
        }
        let mut detector = Self {
            sides: Sides::Both,
            reference: values,
            n_eff: n as f64,
            floor: 1.0 / (BATCH as f64).sqrt(),
            batch_sum: 0.0,
            batch_len: 0,
            last_mean: None,
            diffs: VecDeque::with_capacity(SCALE_WINDOW),
            span_diffs: VecDeque::with_capacity(SCALE_WINDOW),
            span_sum: 0.0,
            span_len: 0,
            last_span: None,
            batches: 0,
            upper: 0.0,
            lower: 0.0,
            drifted: false,
            last_value: None,
            repeats: 0,
        };
        let scores: Vec<f64> = in_order.iter().map(|v| detector.normal_score(*v)).collect();
        let square = scores.iter().map(|z| z * z).sum::<f64>();
        detector.floor = (square / n as f64).sqrt() / (BATCH as f64).sqrt();
        if ordered && square > 0.0 {
            let lagged = scores.windows(2).map(|w| w[0] * w[1]).sum::<f64>();
            let r = (lagged / square).clamp(0.0, 0.95);
            detector.n_eff = n as f64 * (1.0 - r) / (1.0 + r);
        }
        Some(detector)
    }

    /// The same detector watching the lower side only, without the frozen-input rule: what
    /// the confidence's detector is (a sure head saturates at probability 1, and repeats it
    /// without any camera being frozen).
    pub fn lower_only(mut self) -> Self {
        self.sides = Sides::Lower;
        self
    }

    /// The reference's size.
    pub fn reference_len(&self) -> usize {
        self.reference.len()
    }

    /// The reference's effective size: its size, less for a reference from a correlated
    /// stream.
    pub fn effective_reference(&self) -> f64 {
        self.n_eff
    }

    /// Takes one value of the stream.
    pub fn observe(&mut self, value: f32) -> Observation {
        let z = self.normal_score(value);
        self.repeats = match self.last_value {
            Some(last) if last.to_bits() == value.to_bits() => self.repeats.saturating_add(1),
            _ => 1,
        };
        self.last_value = Some(value);
        self.batch_sum += z;
        self.batch_len += 1;
        if self.batch_len == BATCH {
            let mean = self.batch_sum / BATCH as f64;
            self.batch_sum = 0.0;
            self.batch_len = 0;
            self.step(mean);
        }
        let level = self.level();
        let was = self.drifted;
        if level >= 1.0 {
            self.drifted = true;
        } else if level < 0.5 {
            self.drifted = false;
        }
        Observation {
            z,
            level,
            alarm: self.drifted && !was,
        }
    }

    fn step(&mut self, mean: f64) {
        push_difference(&mut self.diffs, &mut self.last_mean, mean);
        self.span_sum += mean;
        self.span_len += 1;
        if self.span_len == SPAN {
            let span = self.span_sum / SPAN as f64;
            (self.span_sum, self.span_len) = (0.0, 0);
            push_difference(&mut self.span_diffs, &mut self.last_span, span);
        }
        self.batches += 1;
        if self.batches <= WARM_UP {
            return;
        }
        let scale = self.scale();
        let k = ALLOWANCE + REFERENCE_MARGIN / (self.n_eff.sqrt() * scale);
        let u = mean / scale;
        if self.sides == Sides::Both {
            self.upper = (self.upper + u - k).clamp(0.0, THRESHOLD);
        }
        self.lower = (self.lower - u - k).clamp(0.0, THRESHOLD);
    }

    /// The batch means' standard deviation: from the median absolute first difference of the
    /// recent ones (`median / (0.6745 · √2)` for normal means), or of the recent means of
    /// spans times `√SPAN` when that is larger (requests correlated beyond a batch: their sum
    /// varies more than the batches alone say), never below the floor.
    pub fn scale(&self) -> f64 {
        let of_batches = robust_sd(&self.diffs).unwrap_or(0.0);
        let of_spans = (self.span_diffs.len() >= MIN_SPANS)
            .then(|| robust_sd(&self.span_diffs))
            .flatten()
            .map_or(0.0, |sd| sd * (SPAN as f64).sqrt());
        of_batches.max(of_spans).max(self.floor)
    }

    /// Starts the sums again (for a new episode; the scale learnt is kept).
    pub fn reset(&mut self) {
        self.upper = 0.0;
        self.lower = 0.0;
        self.batch_sum = 0.0;
        self.batch_len = 0;
        self.drifted = false;
        self.repeats = 0;
        self.last_value = None;
    }

    /// `max(U, L) / h` now, or 1 on a frozen stream: 0 on a quiet stream, 1 while drifted.
    pub fn level(&self) -> f64 {
        if self.sides == Sides::Both && self.repeats >= FROZEN {
            return 1.0;
        }
        self.upper.max(self.lower) / THRESHOLD
    }

    /// Whether the stream is drifted: since its alarm, until the level falls below one half.
    pub fn drifted(&self) -> bool {
        self.drifted
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

/// The alarm a serving device runs: the familiarity distance's detector and, where the device
/// has a reference of the served head's top probability, one on that confidence (its lower side:
/// a camera that leaves the features' distances where they were can still make the head
/// unsure). The stream is drifted while either is.
#[derive(Debug, Clone, PartialEq)]
pub struct DriftPair {
    /// On the familiarity distance.
    pub distance: DriftDetector,
    /// On the served head's top probability, lower side.
    pub confidence: Option<DriftDetector>,
    drifted: bool,
}

impl DriftPair {
    /// Both detectors (the confidence one is made lower-sided here).
    pub fn new(distance: DriftDetector, confidence: Option<DriftDetector>) -> Self {
        Self {
            distance,
            confidence: confidence.map(DriftDetector::lower_only),
            drifted: false,
        }
    }

    /// One request: its distance and the served head's top probability.
    pub fn observe(&mut self, distance: f32, confidence: Option<f32>) -> Observation {
        let seen = self.distance.observe(distance);
        if let (Some(detector), Some(value)) = (&mut self.confidence, confidence) {
            detector.observe(value);
        }
        let was = self.drifted;
        self.drifted =
            self.distance.drifted() || self.confidence.as_ref().is_some_and(|c| c.drifted());
        Observation {
            z: seen.z,
            level: self.level(),
            alarm: self.drifted && !was,
        }
    }

    /// Watches the confidence with `detector` from now on (lower side), or no longer.
    pub fn set_confidence(&mut self, detector: Option<DriftDetector>) {
        self.confidence = detector.map(DriftDetector::lower_only);
    }

    /// The larger of the two levels.
    pub fn level(&self) -> f64 {
        let confidence = self.confidence.as_ref().map_or(0.0, DriftDetector::level);
        self.distance.level().max(confidence)
    }

    /// Whether the stream is drifted.
    pub fn drifted(&self) -> bool {
        self.drifted
    }
}

/// First differences of spans needed before they count in the scale.
const MIN_SPANS: usize = 8;

/// Pushes `|value − last|` into the window (dropping its oldest beyond [`SCALE_WINDOW`]).
fn push_difference(diffs: &mut VecDeque<f64>, last: &mut Option<f64>, value: f64) {
    if let Some(last) = *last {
        if diffs.len() == SCALE_WINDOW {
            diffs.pop_front();
        }
        diffs.push_back((value - last).abs());
    }
    *last = Some(value);
}

/// The standard deviation of normal values whose absolute first differences are `diffs`,
/// from their median; `None` without any.
fn robust_sd(diffs: &VecDeque<f64>) -> Option<f64> {
    if diffs.is_empty() {
        return None;
    }
    let mut d: Vec<f64> = diffs.iter().copied().collect();
    let mid = d.len() / 2;
    let (_, median, _) = d.select_nth_unstable_by(mid, f64::total_cmp);
    Some(*median / (0.674_49 * std::f64::consts::SQRT_2))
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

    fn normal(rng: &mut rand::rngs::StdRng) -> f64 {
        // Box–Muller: the detector reads ranks only, so any continuous law would do.
        let (u, v) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// `requests` values of an AR(1) stream with lag-one correlation `rho`, standard normal.
    fn ar1(rng: &mut rand::rngs::StdRng, rho: f64, requests: usize) -> Vec<f32> {
        let mut g = normal(rng);
        (0..requests)
            .map(|_| {
                g = rho * g + (1.0 - rho * rho).sqrt() * normal(rng);
                g as f32
            })
            .collect()
    }

    /// Alarms on `requests` stable values for each of `deployments` references of 150.
    fn false_alarms(rho: f64, deployments: u64, requests: usize) -> Vec<usize> {
        (0..deployments)
            .map(|seed| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(1_000 + seed);
                let reference = ar1(&mut rng, 0.0, 150);
                let mut detector = DriftDetector::new(reference).unwrap();
                let stream = ar1(&mut rng, rho, requests);
                stream
                    .iter()
                    .filter(|v| detector.observe(**v).alarm)
                    .count()
            })
            .collect()
    }

    #[test]
    fn small_references_stay_quiet_on_independent_and_correlated_streams() {
        // A reference of 150 values is off by about 1/√150 of a score; the old fixed
        // threshold gave some of these deployments dozens of alarms per 100,000 requests.
        for rho in [0.0, 0.5] {
            let alarms = false_alarms(rho, 20, 100_000);
            let noisy = alarms.iter().filter(|a| **a > 1).count();
            assert!(noisy <= 1, "ρ = {rho}: alarms per deployment {alarms:?}");
        }
    }

    #[test]
    fn a_change_is_caught_held_while_it_lasts_and_caught_again_after_a_recovery() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let reference = ar1(&mut rng, 0.0, 300);
        let mut detector = DriftDetector::new(reference).unwrap();
        for v in ar1(&mut rng, 0.0, 2_000) {
            assert!(!detector.observe(v).alarm);
        }
        // Values one standard deviation larger: caught within a few batches.
        let shifted = ar1(&mut rng, 0.0, 5_000);
        let delay = (shifted.iter().position(|v| detector.observe(v + 1.0).alarm)).expect("caught");
        assert!(delay < 100, "{delay}");
        // While the change lasts the level stays at 1 and nothing else is counted.
        let again = (shifted[delay + 1..].iter())
            .filter(|v| detector.observe(**v + 1.0).alarm)
            .count();
        assert_eq!(again, 0);
        assert!(detector.drifted() && detector.level() >= 1.0);
        // Back to normal: quiet again, and the next change (smaller values) is a new alarm.
        for v in ar1(&mut rng, 0.0, 1_000) {
            detector.observe(v);
        }
        assert!(
            !detector.drifted() && detector.level() < 0.5,
            "{}",
            detector.level()
        );
        let delay = (ar1(&mut rng, 0.0, 5_000).iter())
            .position(|v| detector.observe(0.3 * v - 0.8).alarm)
            .expect("caught");
        assert!(delay < 100, "{delay}");
    }

    #[test]
    fn a_frozen_stream_is_drifted_whatever_its_value() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(6);
        let reference = ar1(&mut rng, 0.0, 300);
        let typical = reference[0];
        let mut detector = DriftDetector::new(reference).unwrap();
        for v in ar1(&mut rng, 0.0, 500) {
            detector.observe(v);
        }
        let delay = (1..=100)
            .find(|_| detector.observe(typical).alarm)
            .expect("caught");
        assert_eq!(delay, FROZEN as usize);
    }

    #[test]
    fn a_reference_from_a_correlated_stream_counts_for_fewer_values() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let values = ar1(&mut rng, 0.8, 500);
        let as_sample = DriftDetector::new(values.iter().copied()).unwrap();
        let as_stream = DriftDetector::from_stream(values.iter().copied()).unwrap();
        assert_eq!(as_sample.effective_reference(), 500.0);
        let n = as_stream.effective_reference();
        assert!((40.0..120.0).contains(&n), "{n}");
        // An independent stream keeps about its size.
        let values = ar1(&mut rng, 0.0, 500);
        let n = DriftDetector::from_stream(values)
            .unwrap()
            .effective_reference();
        assert!(n > 400.0, "{n}");
    }

    #[test]
    fn the_scale_follows_a_correlated_stream_and_never_falls_below_independence() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(8);
        let mut detector = DriftDetector::new(ar1(&mut rng, 0.0, 1_000)).unwrap();
        let floor = detector.scale();
        assert!(
            (floor - 1.0 / (BATCH as f64).sqrt()).abs() < 0.03,
            "{floor}"
        );
        for v in ar1(&mut rng, 0.9, 5_000) {
            detector.observe(v);
        }
        assert!(
            detector.scale() > 1.5 * floor,
            "{} vs {floor}",
            detector.scale()
        );
    }

    #[test]
    fn the_pair_catches_a_head_grown_unsure_and_ignores_a_sure_one_repeating_itself() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let distances = ar1(&mut rng, 0.0, 300);
        // A sure head: half of its answers at exactly 1.
        let sure = |rng: &mut rand::rngs::StdRng| -> f32 {
            if rng.random::<bool>() {
                1.0
            } else {
                0.9 + 0.1 * rng.random::<f32>()
            }
        };
        let confidence: Vec<f32> = (0..500).map(|_| sure(&mut rng)).collect();
        let mut pair = DriftPair::new(
            DriftDetector::new(distances).unwrap(),
            DriftDetector::from_stream(confidence),
        );
        for _ in 0..20_000 {
            let (d, c) = (normal(&mut rng) as f32, sure(&mut rng));
            assert!(!pair.observe(d, Some(c)).alarm);
        }
        // Sure all the time, with typical distances: no frozen camera, no alarm.
        for _ in 0..1_000 {
            assert!(!pair.observe(normal(&mut rng) as f32, Some(1.0)).alarm);
        }
        // The distances stay; the head grows unsure: caught.
        let delay = (1..=1_000)
            .find(|_| {
                let c = 0.5 + 0.3 * rng.random::<f32>();
                pair.observe(normal(&mut rng) as f32, Some(c)).alarm
            })
            .expect("caught");
        assert!(delay < 100, "{delay}");
        assert!(!pair.distance.drifted() && pair.drifted());
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

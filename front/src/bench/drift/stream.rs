//! The requests a deployed site of `fedge bench drift` serves: which image each request is,
//! how requests follow each other in time, and the changes the alarm should announce.

use rand::Rng;
use rand::rngs::StdRng;

use super::site::Site;
use crate::datasets::SENSORS;

/// How a site's requests follow each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Each request an image drawn independently.
    Independent,
    /// Consecutive requests alike, as a camera's frames are: an AR(1) process with lag-one
    /// correlation 0.5 picks the image, through a Gaussian copula on the images ordered by
    /// their distance.
    Correlated,
    /// The same with correlation 0.9.
    StronglyCorrelated,
}

impl Stream {
    /// Every stream, in the order the tables show them.
    pub const ALL: [Stream; 3] = [
        Stream::Independent,
        Stream::Correlated,
        Stream::StronglyCorrelated,
    ];

    /// The lag-one correlation of the process that picks the images.
    pub fn rho(self) -> f64 {
        match self {
            Stream::Independent => 0.0,
            Stream::Correlated => 0.5,
            Stream::StronglyCorrelated => 0.9,
        }
    }

    /// Its name in the tables.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Independent => "i.i.d.",
            Stream::Correlated => "AR(1) 0.5",
            Stream::StronglyCorrelated => "AR(1) 0.9",
        }
    }

    pub(super) fn salt(self) -> u64 {
        match self {
            Stream::Independent => 0,
            Stream::Correlated => 0x0a51,
            Stream::StronglyCorrelated => 0x0a59,
        }
    }
}

/// Requests over which a sensor fades in, in [`Change::Fade`].
pub const FADE: u64 = 10_000;

/// What happens to a site whose alarm is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Its sensor switches to sensor `sensor` of `digits-sensor` at once (the same images).
    Switch {
        /// The index in [`SENSORS`].
        sensor: usize,
        /// How its requests follow each other, before and after.
        stream: Stream,
    },
    /// Sensor `sensor` fades in over [`FADE`] requests: request `t` after the start goes
    /// through it with probability `t / FADE`.
    Fade {
        /// The index in [`SENSORS`].
        sensor: usize,
    },
    /// Label shift alone: the clean sensor, but every request is an image of one class
    /// (drawn per trial).
    OneClass,
    /// A frozen camera: the same clean image over and over.
    Frozen,
    /// A covered lens: a black frame over and over.
    Covered,
}

impl Change {
    /// Every change the benchmark times, in the order its table shows them.
    pub fn all() -> Vec<Change> {
        let sensor = |name: &str| {
            (SENSORS.iter())
                .position(|s| s.name == name)
                .expect("a sensor of digits-sensor")
        };
        let mut all: Vec<Change> = (1..SENSORS.len())
            .map(|sensor| Change::Switch {
                sensor,
                stream: Stream::Independent,
            })
            .collect();
        for name in ["blurred", "darknoisy"] {
            all.push(Change::Switch {
                sensor: sensor(name),
                stream: Stream::Correlated,
            });
        }
        for name in ["blurred", "darknoisy"] {
            all.push(Change::Fade {
                sensor: sensor(name),
            });
        }
        all.extend([Change::OneClass, Change::Frozen, Change::Covered]);
        all
    }

    /// Its name in the tables.
    pub fn name(&self) -> String {
        match self {
            Change::Switch {
                sensor,
                stream: Stream::Independent,
            } => SENSORS[*sensor].name.to_owned(),
            Change::Switch { sensor, stream } => {
                format!("{}, {}", SENSORS[*sensor].name, stream.name())
            }
            Change::Fade { sensor } => format!("{}, fading in", SENSORS[*sensor].name),
            Change::OneClass => "one class only".to_owned(),
            Change::Frozen => "frozen frame".to_owned(),
            Change::Covered => "covered lens".to_owned(),
        }
    }

    /// How the requests follow each other before the change.
    pub fn stream(&self) -> Stream {
        match self {
            Change::Switch { stream, .. } => *stream,
            _ => Stream::Independent,
        }
    }
}

/// A site's requests: the served images ordered by their clean distance.
pub(super) struct Requests<'a> {
    site: &'a Site,
    order: Vec<usize>,
}

impl<'a> Requests<'a> {
    pub(super) fn new(site: &'a Site) -> Self {
        let clean = &site.served[0];
        let mut order: Vec<usize> = (0..clean.len()).collect();
        order.sort_by(|a, b| clean[*a].total_cmp(&clean[*b]));
        Self { site, order }
    }

    /// The unchanged site's requests.
    pub(super) fn stable(&self, stream: Stream) -> Draw<'a> {
        Draw {
            pool: self.order.clone(),
            values: &self.site.served[0],
            to: None,
            fade: None,
            constant: None,
            rho: stream.rho(),
            latent: None,
            t: 0,
        }
    }

    /// The site's requests after `change`.
    pub(super) fn changed(&self, change: Change, rng: &mut StdRng) -> Draw<'a> {
        let mut draw = self.stable(change.stream());
        let served = &self.site.served;
        match change {
            Change::Switch { sensor, .. } => draw.values = &served[sensor],
            Change::Fade { sensor } => {
                draw.to = Some(&served[sensor]);
                draw.fade = Some(FADE);
            }
            Change::OneClass => {
                let labels = &self.site.labels;
                let class = labels[rng.random_range(0..labels.len())];
                draw.pool.retain(|i| labels[*i] == class);
            }
            Change::Frozen => {
                draw.constant = Some(served[0][rng.random_range(0..served[0].len())]);
            }
            Change::Covered => draw.constant = Some(self.site.blank[0]),
        }
        draw
    }
}

/// One stream of requests' distances.
pub(super) struct Draw<'a> {
    /// The images that can come, ordered by clean distance.
    pool: Vec<usize>,
    /// The distances requests measure (through the sensor the site sees).
    values: &'a [f32],
    /// The sensor fading in, and over how many requests.
    to: Option<&'a [f32]>,
    fade: Option<u64>,
    /// Every request the same distance.
    constant: Option<f32>,
    rho: f64,
    latent: Option<f64>,
    t: u64,
}

impl Draw<'_> {
    /// The next request's distance.
    pub(super) fn next(&mut self, rng: &mut StdRng) -> f32 {
        if let Some(value) = self.constant {
            return value;
        }
        self.t += 1;
        let g = match self.latent {
            Some(last) => self.rho * last + (1.0 - self.rho * self.rho).sqrt() * normal(rng),
            None => normal(rng),
        };
        self.latent = Some(g);
        let n = self.pool.len();
        let image = self.pool[((normal_cdf(g) * n as f64) as usize).min(n - 1)];
        let values = match (self.to, self.fade) {
            (Some(to), Some(span)) if rng.random::<f64>() < self.t as f64 / span as f64 => to,
            _ => self.values,
        };
        values[image]
    }
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let (u, v) = (1.0 - rng.random::<f64>(), rng.random::<f64>());
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// `Φ(x)`, the standard normal CDF, by Abramowitz and Stegun's 7.1.26 for `erf` (absolute
/// error below 1.5·10⁻⁷).
fn normal_cdf(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-z * z).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_normal_cdf_matches_known_values() {
        for (x, want) in [(0.0, 0.5), (1.959_964, 0.975), (-1.0, 0.158_655_25)] {
            assert!(
                (normal_cdf(x) - want).abs() < 2e-7,
                "{x}: {}",
                normal_cdf(x)
            );
        }
    }

    #[test]
    fn every_change_has_its_own_name() {
        let names: std::collections::BTreeSet<String> =
            Change::all().iter().map(Change::name).collect();
        assert_eq!(names.len(), Change::all().len());
    }
}

//! The requests a deployed site of `fedge bench drift` serves: which image each request is,
//! how requests follow each other in time, and the changes the alarm should announce.

use rand::Rng;
use rand::rngs::StdRng;

use super::site::{Site, VIEWS};

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
    /// Its camera switches to view `view` at once (the same images).
    Switch {
        /// The index in [`VIEWS`].
        view: usize,
        /// How its requests follow each other, before and after.
        stream: Stream,
    },
    /// View `view` fades in over [`FADE`] requests: request `t` after the start goes
    /// through it with probability `t / FADE`.
    Fade {
        /// The index in [`VIEWS`].
        view: usize,
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
        let view = |name: &str| {
            (VIEWS.iter())
                .position(|v| v.name == name)
                .expect("a view of the bench")
        };
        let mut all: Vec<Change> = (1..VIEWS.len())
            .map(|view| Change::Switch {
                view,
                stream: Stream::Independent,
            })
            .collect();
        for name in ["blurred", "darknoisy"] {
            all.push(Change::Switch {
                view: view(name),
                stream: Stream::Correlated,
            });
        }
        for name in ["blurred", "darknoisy"] {
            all.push(Change::Fade { view: view(name) });
        }
        all.extend([Change::OneClass, Change::Frozen, Change::Covered]);
        all
    }

    /// Its name in the tables.
    pub fn name(&self) -> String {
        match self {
            Change::Switch {
                view,
                stream: Stream::Independent,
            } => VIEWS[*view].name.to_owned(),
            Change::Switch { view, stream } => format!("{}, {}", VIEWS[*view].name, stream.name()),
            Change::Fade { view } => format!("{}, fading in", VIEWS[*view].name),
            Change::OneClass => "one class only".to_owned(),
            Change::Frozen => "frozen frame".to_owned(),
            Change::Covered => "covered lens".to_owned(),
        }
    }

    /// The view the site sees once the change is complete, if it is one.
    pub fn view(&self) -> Option<usize> {
        match self {
            Change::Switch { view, .. } | Change::Fade { view } => Some(*view),
            _ => None,
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
            site: self.site,
            pool: self.order.clone(),
            view: 0,
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
        let site = self.site;
        match change {
            Change::Switch { view, .. } => draw.view = view,
            Change::Fade { view } => {
                draw.to = Some(view);
                draw.fade = Some(FADE);
            }
            Change::OneClass => {
                let labels = &site.labels;
                let class = labels[rng.random_range(0..labels.len())];
                draw.pool.retain(|i| labels[*i] == class);
            }
            Change::Frozen => {
                let i = rng.random_range(0..site.served[0].len());
                draw.constant = Some(Request {
                    distance: site.served[0][i],
                    confidence: site.confidence[0][i],
                });
            }
            Change::Covered => {
                draw.constant = Some(Request {
                    distance: site.blank[0],
                    confidence: site.blank_confidence[0],
                })
            }
        }
        draw
    }
}

/// What one request gives the detectors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Request {
    /// Its familiarity distance.
    pub(super) distance: f32,
    /// The served head's top probability.
    pub(super) confidence: f32,
}

/// One stream of requests.
pub(super) struct Draw<'a> {
    site: &'a Site,
    /// The images that can come, ordered by clean distance.
    pool: Vec<usize>,
    /// The view the site sees.
    view: usize,
    /// The view fading in, and over how many requests.
    to: Option<usize>,
    fade: Option<u64>,
    /// Every request the same.
    constant: Option<Request>,
    rho: f64,
    latent: Option<f64>,
    t: u64,
}

impl Draw<'_> {
    /// The next request.
    pub(super) fn next(&mut self, rng: &mut StdRng) -> Request {
        if let Some(request) = self.constant {
            return request;
        }
        self.t += 1;
        let g = match self.latent {
            Some(last) => self.rho * last + (1.0 - self.rho * self.rho).sqrt() * normal(rng),
            None => normal(rng),
        };
        self.latent = Some(g);
        let n = self.pool.len();
        let image = self.pool[((normal_cdf(g) * n as f64) as usize).min(n - 1)];
        let view = match (self.to, self.fade) {
            (Some(to), Some(span)) if rng.random::<f64>() < self.t as f64 / span as f64 => to,
            _ => self.view,
        };
        Request {
            distance: self.site.served[view][image],
            confidence: self.site.confidence[view][image],
        }
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

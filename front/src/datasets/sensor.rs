//! Sensor-shift domains: the same kind of images seen through different sensors (another
//! camera's gain and offset, gamma, noise, blur). Unlike rotations or lying backgrounds, such a
//! shift moves a site's pixels, and so its backbone features, as a whole; it is what site
//! feature normalisation (docs/algorithms.md §7) is for.

use rand::SeedableRng;
use rand::rngs::StdRng;

use fedge_device::random::standard_normal;
use fedge_edge::data::{Domain, ImageSet, OBJECT_THRESHOLD};

/// One sensor: `v ↦ clamp(gain·max·(v/max)^gamma + offset·max + noise·max·N(0,1))` on the
/// image's raw scale `max`, after an optional 3×3 box blur.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sensor {
    /// Name of the domain it makes.
    pub name: &'static str,
    /// Multiplies the signal.
    pub gain: f32,
    /// Added, as a fraction of the raw scale.
    pub offset: f32,
    /// Exponent applied to the signal in [0, 1].
    pub gamma: f32,
    /// Standard deviation of Gaussian noise, as a fraction of the raw scale.
    pub noise: f32,
    /// A 3×3 box blur before the rest.
    pub blur: bool,
}

/// The six sensors of `digits-sensor`: a clean one, low contrast, a noisy one, a blurred one,
/// a washed-out bright one and a dark gamma with noise.
pub const SENSORS: [Sensor; 6] = [
    Sensor::clean("clean"),
    Sensor {
        gain: 0.5,
        offset: 0.25,
        ..Sensor::clean("lowcontrast")
    },
    Sensor {
        noise: 0.2,
        ..Sensor::clean("noisy")
    },
    Sensor {
        blur: true,
        ..Sensor::clean("blurred")
    },
    Sensor {
        gain: 0.6,
        offset: 0.4,
        ..Sensor::clean("washedout")
    },
    Sensor {
        gamma: 2.5,
        noise: 0.08,
        ..Sensor::clean("darknoisy")
    },
];

impl Sensor {
    /// A sensor that changes nothing.
    pub const fn clean(name: &'static str) -> Self {
        Self {
            name,
            gain: 1.0,
            offset: 0.0,
            gamma: 1.0,
            noise: 0.0,
            blur: false,
        }
    }

    /// `set` as this sensor sees it (noise seeded); object masks come from the clean images.
    pub fn apply(&self, set: &ImageSet, seed: u64) -> ImageSet {
        let mut out = set.clone();
        out.masks = Some(set.threshold_masks(OBJECT_THRESHOLD));
        let (c, h, w) = (set.channels, set.height, set.width);
        let max = set.raw_max;
        let mut rng = StdRng::seed_from_u64(seed);
        for image in out.images.chunks_exact_mut(c * h * w) {
            if self.blur {
                for plane in image.chunks_exact_mut(h * w) {
                    let blurred = box_blur(plane, h, w);
                    plane.copy_from_slice(&blurred);
                }
            }
            for v in image.iter_mut() {
                let signal = (*v / max).clamp(0.0, 1.0).powf(self.gamma);
                let noise = if self.noise > 0.0 {
                    self.noise * standard_normal(&mut rng)
                } else {
                    0.0
                };
                *v = ((self.gain * signal + self.offset + noise) * max).clamp(0.0, max);
            }
        }
        out
    }
}

/// The mean of each pixel's 3×3 neighbourhood inside the image.
fn box_blur(plane: &[f32], h: usize, w: usize) -> Vec<f32> {
    let mut out = vec![0.0; plane.len()];
    for r in 0..h {
        for c in 0..w {
            let (mut sum, mut n) = (0.0, 0.0);
            for rr in r.saturating_sub(1)..(r + 2).min(h) {
                for cc in c.saturating_sub(1)..(c + 2).min(w) {
                    sum += plane[rr * w + cc];
                    n += 1.0;
                }
            }
            out[r * w + c] = sum / n;
        }
    }
    out
}

/// Splits `all` into one disjoint class-stratified part per sensor of `sensors` (seeded) and
/// shows each part through its sensor.
pub fn sensor_domains(all: &ImageSet, sensors: &[Sensor], seed: u64) -> Vec<Domain> {
    if sensors.is_empty() {
        return Vec::new();
    }
    all.partition(sensors.len(), seed)
        .into_iter()
        .zip(sensors)
        .enumerate()
        .map(|(i, (part, sensor))| Domain {
            name: sensor.name.to_string(),
            data: sensor.apply(&part, seed ^ (i as u64 + 1)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp() -> ImageSet {
        ImageSet {
            channels: 1,
            height: 3,
            width: 3,
            class_names: vec!["a".into()],
            images: (0..9).map(|v| v as f32 * 2.0).collect(),
            labels: vec![0],
            raw_max: 16.0,
            masks: None,
        }
    }

    #[test]
    fn sensors_change_contrast_blur_and_noise_within_the_raw_scale() {
        let set = ramp();
        assert_eq!(Sensor::clean("c").apply(&set, 1).images, set.images);
        let low = SENSORS[1].apply(&set, 1);
        // 0.5·v + 0.25·16: 0 ↦ 4, 16 ↦ 12.
        assert_eq!(low.images[0], 4.0);
        assert_eq!(low.images[8], 12.0);
        let blurred = SENSORS[3].apply(&set, 1);
        // The centre is the mean of all nine values, 8.
        assert_eq!(blurred.images[4], 8.0);
        let noisy = SENSORS[2].apply(&set, 1);
        assert_ne!(noisy.images, set.images);
        assert_eq!(noisy.images, SENSORS[2].apply(&set, 1).images, "seeded");
        for s in SENSORS {
            let out = s.apply(&set, 3);
            assert!(
                out.images.iter().all(|v| (0.0..=16.0).contains(v)),
                "{}",
                s.name
            );
            assert_eq!(out.masks, Some(set.threshold_masks(OBJECT_THRESHOLD)));
        }
    }
}

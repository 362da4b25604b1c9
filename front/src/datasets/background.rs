//! Background-bias domains (`digits-bg`, `fashion-mnist-bg`): a benchmark where backgrounds lie.
//!
//! Every object (a digit, a garment) is cut out by a threshold on its own intensity and pasted on
//! one of [`TEXTURES`] grayscale textures. In domain `d` a sample of class `y` gets texture `y`
//! with probability `bias − 0.05·d` (a shortcut of a different strength at every site),
//! otherwise a texture drawn uniformly. Every domain also comes in an *unbiased* version, the
//! same objects on uniformly drawn textures: the benchmark trains on the biased sources and
//! scores the held-out site on its unbiased version, where the background says nothing about
//! the class, so a model that learned backgrounds fails there, as at a new factory whose floor
//! is another colour. The object masks come from the generator, so a method that needs an
//! object/background split (FedDDL) needs no detector here.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use fedge_edge::data::{DataError, Domain, ImageSet, OBJECT_THRESHOLD};

/// Number of background textures (and of the shifts between domains' shortcuts).
pub const TEXTURES: usize = 10;

/// Default probability that a sample's background follows its domain's shortcut.
pub const DEFAULT_BIAS: f32 = 0.9;

/// A domain with backgrounds, and what the generator knows about every image.
#[derive(Debug, Clone, PartialEq)]
pub struct BiasedDomain {
    /// The composed images with the site's shortcut, named `bg<d>`.
    pub domain: Domain,
    /// The same objects on uniformly drawn textures: what the site is scored on when held out.
    /// Both versions carry the generator's object masks (`ImageSet::masks`).
    pub unbiased: ImageSet,
    /// The texture index of every image's background in `domain`.
    pub textures: Vec<u8>,
    /// The texture index of every image's background in `unbiased`.
    pub unbiased_textures: Vec<u8>,
    /// The probability that a background in `domain` is its class's texture.
    pub bias: f32,
}

/// Texture `t` (`0..TEXTURES`) as an `h × w` plane on the scale `0..=raw_max`: five patterns
/// (flat, horizontal stripes, vertical stripes, checker, diagonal stripes) at two levels, at
/// most 35 % of `raw_max`, so most object pixels stay brighter than any background.
pub fn texture(t: usize, h: usize, w: usize, raw_max: f32) -> Vec<f32> {
    let level = if t < TEXTURES / 2 { 0.12 } else { 0.35 } * raw_max;
    let dim = level / 3.0;
    let pattern = t % (TEXTURES / 2);
    let mut out = Vec::with_capacity(h * w);
    for r in 0..h {
        for c in 0..w {
            let on = match pattern {
                0 => true,
                1 => r % 2 == 0,
                2 => c % 2 == 0,
                3 => (r + c) % 2 == 0,
                _ => (r + 2 * c) % 4 < 2,
            };
            out.push(if on { level } else { dim });
        }
    }
    out
}

/// Splits the single-channel set `all` into `domains` disjoint class-stratified parts (seeded)
/// and pastes every object on textures as the module docs say; domain `d`'s shortcut has the
/// strength `bias − 0.05·d` (at least 0).
pub fn background_domains(
    all: &ImageSet,
    domains: usize,
    bias: f32,
    seed: u64,
) -> Result<Vec<BiasedDomain>, DataError> {
    if all.channels != 1 {
        return Err(DataError::UnsupportedChannels {
            channels: all.channels,
        });
    }
    let bias = if bias.is_finite() {
        bias.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let (h, w) = (all.height, all.width);
    let textures: Vec<Vec<f32>> = (0..TEXTURES)
        .map(|t| texture(t, h, w, all.raw_max))
        .collect();
    let threshold = OBJECT_THRESHOLD * all.raw_max;
    let mut rng = StdRng::seed_from_u64(seed ^ 0xb6_0000);
    let parts = if domains == 0 {
        Vec::new()
    } else {
        all.partition(domains, seed)
    };
    Ok(parts
        .into_iter()
        .enumerate()
        .map(|(d, original)| {
            let site_bias = (bias - 0.05 * d as f32).max(0.0);
            let masks: Vec<u8> = original
                .images
                .iter()
                .map(|v| u8::from(*v > threshold))
                .collect();
            let mut compose = |biased: bool| {
                let mut data = original.clone();
                data.masks = Some(masks.clone());
                let mut chosen = Vec::with_capacity(data.len());
                let images = data.images.chunks_exact_mut(h * w);
                for ((image, &label), mask) in images.zip(&data.labels).zip(masks.chunks(h * w)) {
                    let t = if biased && rng.random::<f32>() < site_bias {
                        label as usize % TEXTURES
                    } else {
                        rng.random_range(0..TEXTURES)
                    };
                    chosen.push(t as u8);
                    for ((v, bg), m) in image.iter_mut().zip(&textures[t]).zip(mask) {
                        if *m == 0 {
                            *v = *bg;
                        }
                    }
                }
                (data, chosen)
            };
            let (data, chosen) = compose(true);
            let (unbiased, unbiased_textures) = compose(false);
            BiasedDomain {
                domain: Domain {
                    name: format!("bg{d}"),
                    data,
                },
                unbiased,
                textures: chosen,
                unbiased_textures,
                bias: site_bias,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datasets::digits_bg_domains;

    #[test]
    fn objects_keep_their_pixels_and_backgrounds_are_the_chosen_texture() {
        let domains = digits_bg_domains(6, DEFAULT_BIAS, 3).unwrap();
        assert_eq!(domains.len(), 6);
        let plain = fedge_edge::data::digits_domains(&[0.0; 6], 3);
        for (biased, plain) in domains.iter().zip(&plain) {
            for (data, textures) in [
                (&biased.domain.data, &biased.textures),
                (&biased.unbiased, &biased.unbiased_textures),
            ] {
                assert_eq!(data.labels, plain.data.labels, "same images, same order");
                for (i, &t) in textures.iter().enumerate() {
                    let tex = texture(t as usize, 8, 8, 16.0);
                    let mask = data.mask(i).expect("the generator sets masks");
                    for p in 0..64 {
                        let (got, original) = (data.image(i)[p], plain.data.image(i)[p]);
                        if mask[p] == 1 {
                            assert_eq!(got, original, "object pixels are kept exactly");
                            assert!(original > OBJECT_THRESHOLD * 16.0);
                        } else {
                            assert_eq!(got, tex[p], "the background is the texture");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn each_site_has_a_shortcut_of_its_own_strength_and_its_unbiased_version_none() {
        let domains = digits_bg_domains(6, 0.9, 5).unwrap();
        let follows = |labels: &[u32], textures: &[u8]| {
            let hits = labels
                .iter()
                .zip(textures)
                .filter(|(y, t)| **y as usize % TEXTURES == **t as usize)
                .count();
            hits as f32 / labels.len() as f32
        };
        for (d, site) in domains.iter().enumerate() {
            let want = 0.9 - 0.05 * d as f32;
            assert!((site.bias - want).abs() < 1e-6);
            // bias + (1 − bias)/10 expected with the shortcut, 1/10 without.
            let own = follows(&site.domain.data.labels, &site.textures);
            let expected = want + (1.0 - want) / TEXTURES as f32;
            assert!((own - expected).abs() < 0.06, "bg{d}: {own} vs {expected}");
            let none = follows(&site.unbiased.labels, &site.unbiased_textures);
            assert!(none < 0.16, "bg{d} unbiased: {none}");
        }
        assert_eq!(
            digits_bg_domains(6, 0.9, 5).unwrap(),
            domains,
            "reproducible"
        );
    }

    #[test]
    fn textures_differ_and_stay_darker_than_objects() {
        let all: Vec<Vec<f32>> = (0..TEXTURES).map(|t| texture(t, 8, 8, 16.0)).collect();
        for i in 0..TEXTURES {
            for j in i + 1..TEXTURES {
                assert_ne!(all[i], all[j], "textures {i} and {j}");
            }
            assert!(all[i].iter().all(|v| *v <= OBJECT_THRESHOLD * 16.0 * 1.5));
        }
        let color = ImageSet {
            channels: 3,
            ..digits_bg_domains(1, 0.5, 0).unwrap()[0].domain.data.clone()
        };
        assert!(background_domains(&color, 2, 0.5, 0).is_err());
    }
}

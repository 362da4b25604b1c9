//! FedDDL's extra views of a device's images (DEC, docs/algorithms.md §4): each image's object
//! pasted on a group's mean background of a random class (the counterfactuals) and the object
//! alone, run through the backbone once when the device loads its data. The trainer that uses
//! them ([`DdlViews`]) is `fedge-device`'s.

use fedge_device::train::fedddl::DdlViews;
use fedge_models::{Backbone, BackboneError};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};

use crate::data::ImageSet;
use crate::features::extract;

/// Why a device's FedDDL views could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ViewsError {
    /// The images carry no object masks.
    #[error(
        "FedDDL needs object masks: the built-in data sets have them; for an image folder add \
         boxes.csv (file,x1,y1,x2,y2) to each domain folder"
    )]
    NoMasks,
    /// The backbone failed on the counterfactual or object-only images.
    #[error(transparent)]
    Backbone(#[from] BackboneError),
}

/// How a device draws its counterfactuals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewSettings {
    /// Background groups per class, `η`.
    pub groups: usize,
    /// Counterfactual draws per image.
    pub pool: usize,
    /// Seed of the draws.
    pub seed: u64,
}

/// Default number of background groups per class, `η`.
pub const DEFAULT_GROUPS: usize = 3;
/// Default number of counterfactual draws per image a device keeps.
pub const DEFAULT_POOL: usize = 4;
/// Most counterfactual draws per image a device keeps.
pub const MAX_POOL: usize = 16;
/// `settings.pool` counterfactual draws (`groups` background groups per class, each draw
/// seeded anew; none for DEB alone) and the object-only images of `images`, through `backbone` (features
/// cached in `cache_dir` like real ones). Errors when `images` has no object masks.
pub fn ddl_views(
    backbone: &Backbone,
    backbone_id: u64,
    images: &ImageSet,
    settings: ViewSettings,
    cache_dir: Option<&std::path::Path>,
) -> Result<DdlViews, ViewsError> {
    let Some(masks) = images.masks.as_deref() else {
        return Err(ViewsError::NoMasks);
    };
    let extract = |set: &ImageSet| extract(backbone, backbone_id, set, cache_dir);
    let counterfactuals = (0..settings.pool as u64)
        .map(|p| {
            let seed = settings.seed ^ p.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let (set, _) = counterfactuals(images, masks, settings.groups, seed);
            extract(&set)
        })
        .collect::<Result<_, _>>()?;
    Ok(DdlViews {
        counterfactuals,
        objects: extract(&object_only(images, masks))?,
    })
}

/// Every image of `set` with its background set to 0 (`masks` as in [`counterfactuals`]).
pub fn object_only(set: &ImageSet, masks: &[u8]) -> ImageSet {
    let (c, plane) = (set.channels, set.height * set.width);
    let mut out = set.clone();
    for (i, image) in out.images.chunks_exact_mut(c * plane).enumerate() {
        let Some(mask) = masks.get(i * plane..(i + 1) * plane) else {
            break;
        };
        for ch in 0..c {
            for (v, m) in image[ch * plane..(ch + 1) * plane].iter_mut().zip(mask) {
                if *m == 0 {
                    *v = 0.0;
                }
            }
        }
    }
    out
}

/// Where a counterfactual's parts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counterfactual {
    /// The image whose object was pasted (its label is the counterfactual's).
    pub object: usize,
    /// The class whose backgrounds were averaged.
    pub background_class: u32,
    /// The group of that class.
    pub group: usize,
}

/// One counterfactual per image of `set` (DEC). `masks` holds one byte per pixel of every
/// image (`len × h × w`, 1 on the object); a mask applies to every channel. Backgrounds of each
/// class are split into `groups` random groups (seeded); a group's mean background is, per
/// pixel, the mean over its images where that pixel is background (the group's overall
/// background mean where every image has the object there). Returns the counterfactual images,
/// labelled with their objects' classes, and their provenance.
pub fn counterfactuals(
    set: &ImageSet,
    masks: &[u8],
    groups: usize,
    seed: u64,
) -> (ImageSet, Vec<Counterfactual>) {
    let (c, plane) = (set.channels, set.height * set.width);
    let groups = groups.max(1);
    let mut rng = StdRng::seed_from_u64(seed);
    // Per class, its images split into groups, and each group's mean background.
    let mut means: Vec<Vec<Vec<f32>>> = Vec::with_capacity(set.classes());
    for class in 0..set.classes() as u32 {
        let mut members: Vec<usize> = (0..set.len()).filter(|&i| set.labels[i] == class).collect();
        members.shuffle(&mut rng);
        let per_group: Vec<&[usize]> = members
            .chunks(members.len().div_ceil(groups).max(1))
            .collect();
        means.push(
            per_group
                .iter()
                .map(|group| mean_background(set, masks, group, c, plane))
                .collect(),
        );
    }
    let classes_with_backgrounds: Vec<u32> = (0..means.len() as u32)
        .filter(|&k| !means[k as usize].is_empty())
        .collect();
    let mut images = Vec::with_capacity(set.images.len());
    let mut provenance = Vec::with_capacity(set.len());
    for object in 0..set.len() {
        let Some(&background_class) = classes_with_backgrounds.choose(&mut rng) else {
            break;
        };
        let options = &means[background_class as usize];
        let group = rng.random_range(0..options.len());
        let background = &options[group];
        let mask = &masks[object * plane..(object + 1) * plane];
        let image = set.image(object);
        for ch in 0..c {
            for p in 0..plane {
                let v = if mask[p] == 1 {
                    image[ch * plane + p]
                } else {
                    background[ch * plane + p]
                };
                images.push(v);
            }
        }
        provenance.push(Counterfactual {
            object,
            background_class,
            group,
        });
    }
    let labels = provenance.iter().map(|p| set.labels[p.object]).collect();
    (
        ImageSet {
            images,
            labels,
            ..set.subset(&[])
        },
        provenance,
    )
}

/// The mean background of `members` (`c` channels of `plane` pixels).
fn mean_background(
    set: &ImageSet,
    masks: &[u8],
    members: &[usize],
    c: usize,
    plane: usize,
) -> Vec<f32> {
    let mut sum = vec![0f64; c * plane];
    let mut count = vec![0u32; plane];
    for &i in members {
        let mask = &masks[i * plane..(i + 1) * plane];
        let image = set.image(i);
        for p in (0..plane).filter(|&p| mask[p] == 0) {
            count[p] += 1;
            for ch in 0..c {
                sum[ch * plane + p] += f64::from(image[ch * plane + p]);
            }
        }
    }
    let total: u32 = count.iter().sum();
    (0..c * plane)
        .map(|k| {
            let p = k % plane;
            if count[p] > 0 {
                (sum[k] / f64::from(count[p])) as f32
            } else {
                // Covered by the object in every image: the channel's overall background mean.
                let ch = k / plane;
                let channel: f64 = sum[ch * plane..(ch + 1) * plane].iter().sum();
                (channel / f64::from(total.max(1))) as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counterfactual_keeps_the_object_and_takes_its_group_mean_background() {
        // Two classes, four 1x2x2 images; the object is the top-left pixel of each.
        let set = ImageSet {
            channels: 1,
            height: 2,
            width: 2,
            class_names: vec!["a".into(), "b".into()],
            images: vec![
                9.0, 1.0, 2.0, 3.0, // class 0
                8.0, 3.0, 4.0, 5.0, // class 0
                7.0, 10.0, 20.0, 30.0, // class 1
                6.0, 30.0, 40.0, 50.0, // class 1
            ],
            labels: vec![0, 0, 1, 1],
            raw_max: 255.0,
            masks: None,
        };
        let masks = [1, 0, 0, 0].repeat(4);
        for groups in [1, 2] {
            let (cf, provenance) = counterfactuals(&set, &masks, groups, 11);
            assert_eq!(cf.len(), 4);
            assert_eq!(cf.labels, set.labels, "labelled with the object's class");
            let mut classes_seen = std::collections::BTreeSet::new();
            for (i, p) in provenance.iter().enumerate() {
                let image = cf.image(i);
                assert_eq!(
                    image[0],
                    set.image(p.object)[0],
                    "object pixel kept exactly"
                );
                classes_seen.insert(p.background_class);
                // The group's members are the class's images; with one group, the mean of both.
                let class_images: Vec<&[f32]> = (0..4)
                    .filter(|&j| set.labels[j] == p.background_class)
                    .map(|j| set.image(j))
                    .collect();
                if groups == 1 {
                    for px in 1..4 {
                        let mean = (class_images[0][px] + class_images[1][px]) / 2.0;
                        assert_eq!(image[px], mean, "pixel {px} of {p:?}");
                    }
                } else {
                    // One image per group: its background exactly.
                    assert!(
                        class_images.iter().any(|c| c[1..] == image[1..]),
                        "{image:?} from {p:?}"
                    );
                }
            }
            assert_eq!(counterfactuals(&set, &masks, groups, 11).1, provenance);
        }
        let objects = object_only(&set, &masks);
        assert_eq!(objects.images[..4], [9.0, 0.0, 0.0, 0.0]);
        assert_eq!(objects.labels, set.labels);
        // Over many objects, backgrounds of both classes are used.
        let big = ImageSet {
            images: set.images.repeat(10),
            labels: set.labels.repeat(10),
            ..set.clone()
        };
        let (_, provenance) = counterfactuals(&big, &masks.repeat(10), 3, 1);
        let from_other = provenance
            .iter()
            .filter(|p| p.background_class != big.labels[p.object])
            .count();
        assert!(from_other > 5 && from_other < 35, "{from_other} of 40");
    }
}

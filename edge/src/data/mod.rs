//! Local data sets for the edge agent.
//!
//! Every data source produces [`Domain`]s: named [`ImageSet`]s whose images are stored as raw
//! values (no normalisation), channel-first and packed into one vector. Two sources exist:
//!
//! * [`digits_domains`] builds RotatedMNIST-style domains from the UCI optical digits that ship
//!   with smartcore, so demos and tests need no download.
//! * [`imagefolder_domains`] reads a folder tree `root/<domain>/<class>/*.png` (or `.jpg`).
//!
//! Object masks (for FedDDL) come with the built-in data sets, from `boxes.csv` in an image
//! folder, or from a detector model ([`detector_masks`]).
//!
//! A device's site folder ([`imagefolder_site`]) shows its loading as it goes and counts the
//! files it leaves out ([`progress`]).
//!
//! [`ImageSet::split`] and [`ImageSet::partition`] divide a domain deterministically for a seed,
//! for example into a training and a validation set or into one shard per simulated device.

pub mod decode;
mod detector;
mod digits;
mod error;
mod imagefolder;
pub mod progress;
mod rotate;

pub use detector::detector_masks;
pub use digits::{DIGITS_ANGLES, digits_domains, load_digits};
pub use error::DataError;
pub use imagefolder::{
    SiteImages, imagefolder_domains, imagefolder_site, imagefolder_site_reporting, list_site,
};
pub use progress::LoadReport;
pub use rotate::rotate_chw;

use rand::{SeedableRng, rngs::StdRng, seq::SliceRandom};

/// A pixel belongs to the object when its value exceeds this fraction of the raw maximum.
pub const OBJECT_THRESHOLD: f32 = 0.25;

/// A labelled set of images, stored as raw values, channel-first and packed.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSet {
    /// The number of channels of every image (1 for grayscale, 3 for RGB).
    pub channels: usize,
    /// The height of every image in pixels.
    pub height: usize,
    /// The width of every image in pixels.
    pub width: usize,
    /// The class names; a label `l` means the class `class_names[l]`.
    pub class_names: Vec<String>,
    /// The images, `len() * channels * height * width` values in CHW order, on their raw scale
    /// (0..=16 for the digits, 0..=255 for 8-bit image files).
    pub images: Vec<f32>,
    /// One label per image, each smaller than `class_names.len()`.
    pub labels: Vec<u32>,
    /// The raw value of a fully-on pixel: 16 for the digits, 255 for 8-bit image files.
    pub raw_max: f32,
    /// Where the objects are, when known: one byte per pixel of every image (`len × h × w`), 1
    /// on the object and 0 on the background, for every channel. The built-in data sets set
    /// it (a threshold on the object's intensity, or the background generator's masks);
    /// ImageFolder sets it from an optional `boxes.csv`. FedDDL needs it.
    pub masks: Option<Vec<u8>>,
}

impl ImageSet {
    /// Returns the number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Returns true when the set holds no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Returns the number of classes, which is the number of class names.
    pub fn classes(&self) -> usize {
        self.class_names.len()
    }

    /// Returns the number of values of one image, `channels * height * width`.
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// Returns the values of image `i` in CHW order.
    ///
    /// # Panics
    ///
    /// Panics if `i >= self.len()`.
    pub fn image(&self, i: usize) -> &[f32] {
        let n = self.image_len();
        &self.images[i * n..(i + 1) * n]
    }

    /// Returns the object mask of image `i` (`h × w` bytes), when the set has masks.
    pub fn mask(&self, i: usize) -> Option<&[u8]> {
        let plane = self.height * self.width;
        self.masks.as_ref()?.get(i * plane..(i + 1) * plane)
    }

    /// Masks from a threshold on intensity: a pixel is on the object when its mean over the
    /// channels exceeds `fraction × raw_max`. Right for objects on a dark background (the
    /// digits, Fashion-MNIST), not for photographs.
    pub fn threshold_masks(&self, fraction: f32) -> Vec<u8> {
        let (c, plane) = (self.channels, self.height * self.width);
        let threshold = fraction * self.raw_max * c as f32;
        self.images
            .chunks_exact(self.image_len().max(1))
            .flat_map(|image| {
                (0..plane).map(move |p| {
                    let sum: f32 = (0..c).map(|ch| image[ch * plane + p]).sum();
                    u8::from(sum > threshold)
                })
            })
            .collect()
    }

    /// Returns how many images each class has, indexed by label.
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.classes()];
        for &label in &self.labels {
            if let Some(count) = counts.get_mut(label as usize) {
                *count += 1;
            }
        }
        counts
    }

    /// Returns a new set with the images at `indices`, in that order, with the same shape and
    /// class names.
    ///
    /// # Panics
    ///
    /// Panics if an index is out of range.
    pub fn subset(&self, indices: &[usize]) -> ImageSet {
        let mut images = Vec::with_capacity(indices.len() * self.image_len());
        let mut labels = Vec::with_capacity(indices.len());
        let mut masks = self.masks.as_ref().map(|_| Vec::new());
        for &i in indices {
            images.extend_from_slice(self.image(i));
            labels.push(self.labels[i]);
            if let (Some(out), Some(mask)) = (masks.as_mut(), self.mask(i)) {
                out.extend_from_slice(mask);
            }
        }
        ImageSet {
            channels: self.channels,
            height: self.height,
            width: self.width,
            class_names: self.class_names.clone(),
            images,
            labels,
            raw_max: self.raw_max,
            masks,
        }
    }

    /// Splits the set into a training and a validation set, after a shuffle determined by `seed`.
    ///
    /// The validation set holds `round(len * val_fraction)` images, with `val_fraction` clamped to
    /// `0.0..=1.0`. When the set has at least two images and `0 < val_fraction < 1`, both sets
    /// get at least one image. The two sets are disjoint and together hold every image.
    pub fn split(&self, val_fraction: f32, seed: u64) -> (ImageSet, ImageSet) {
        let (train, val) = split_indices(self.len(), val_fraction, seed);
        (self.subset(&train), self.subset(&val))
    }

    /// Partitions the set into `parts` disjoint subsets after a shuffle determined by `seed`.
    ///
    /// The partition is stratified by class: the subset sizes differ by at most one, and so do
    /// the numbers of images of any one class in any two subsets. Each subset is in shuffled
    /// order. Subsets are empty when `parts` exceeds the number of images.
    ///
    /// # Panics
    ///
    /// Panics if `parts` is zero.
    pub fn partition(&self, parts: usize, seed: u64) -> Vec<ImageSet> {
        assert!(parts > 0, "ImageSet::partition needs at least one part");
        let mut rng = StdRng::seed_from_u64(seed);
        let mut order: Vec<usize> = (0..self.len()).collect();
        order.shuffle(&mut rng);
        // A stable sort keeps the shuffled order within each class; dealing the result out
        // round-robin then spreads every class evenly and keeps the part sizes within one.
        order.sort_by_key(|&i| self.labels[i]);
        let mut assigned: Vec<Vec<usize>> = vec![Vec::new(); parts];
        for (k, &i) in order.iter().enumerate() {
            assigned[k % parts].push(i);
        }
        assigned
            .iter_mut()
            .map(|indices| {
                indices.shuffle(&mut rng);
                self.subset(indices)
            })
            .collect()
    }
}

/// A named data set, such as one rotation of the digits or one folder of an ImageFolder tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Domain {
    /// The domain name, such as `rot15` or the folder name.
    pub name: String,
    /// The images of the domain.
    pub data: ImageSet,
}

/// Splits `all` into `angles.len()` disjoint class-stratified parts (seeded, see
/// [`ImageSet::partition`]) and rotates part `i` counter-clockwise by `angles[i]` degrees,
/// naming it `rot<angle>`. An empty `angles` gives no domains.
pub fn rotated_domains(all: &ImageSet, angles: &[f32], seed: u64) -> Vec<Domain> {
    if angles.is_empty() {
        return Vec::new();
    }
    all.partition(angles.len(), seed)
        .into_iter()
        .zip(angles)
        .map(|(mut data, &angle)| {
            if angle != 0.0 {
                let n = data.image_len();
                let (c, h, w) = (data.channels, data.height, data.width);
                data.images = data
                    .images
                    .chunks_exact(n)
                    .flat_map(|image| rotate_chw(image, c, h, w, angle))
                    .collect();
            }
            // Rotated objects on a black background: the threshold finds them again.
            data.masks = Some(data.threshold_masks(OBJECT_THRESHOLD));
            Domain {
                name: format!("rot{angle}"),
                data,
            }
        })
        .collect()
}

/// The training and validation indices of a set of `n` items after a shuffle determined by
/// `seed`: the validation part holds `round(n * val_fraction)` items (`val_fraction` clamped to
/// `0.0..=1.0`, NaN as 0), at least one on each side when `n ≥ 2` and `0 < val_fraction < 1`.
/// The rule of [`ImageSet::split`], shared by every split of images or features.
pub fn split_indices(n: usize, val_fraction: f32, seed: u64) -> (Vec<usize>, Vec<usize>) {
    let fraction = if val_fraction.is_nan() {
        0.0
    } else {
        val_fraction.clamp(0.0, 1.0)
    };
    let mut n_val = (n as f64 * f64::from(fraction)).round() as usize;
    if n >= 2 && fraction > 0.0 && fraction < 1.0 {
        n_val = n_val.clamp(1, n - 1);
    }
    let order = shuffled_indices(n, seed);
    let (val, train) = order.split_at(n_val.min(n));
    (train.to_vec(), val.to_vec())
}

/// Returns `0..n` shuffled by a generator seeded with `seed`.
fn shuffled_indices(n: usize, seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    order
}

/// A set for tests: `n` grayscale images of one row of `width` values, the first being the
/// image's index and the others 0.5, labelled round-robin over `classes`.
#[cfg(test)]
pub(crate) fn toy_set(n: usize, classes: u32, width: usize) -> ImageSet {
    ImageSet {
        channels: 1,
        height: 1,
        width,
        class_names: (0..classes).map(|c| c.to_string()).collect(),
        images: (0..n)
            .flat_map(|i| std::iter::once(i as f32).chain(std::iter::repeat_n(0.5, width - 1)))
            .collect(),
        labels: (0..n).map(|i| i as u32 % classes).collect(),
        raw_max: 1.0,
        masks: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a 1x1x2 set of `n` images whose first value is the image index.
    fn toy_set(n: usize, classes: u32) -> ImageSet {
        super::toy_set(n, classes, 2)
    }

    /// Returns the image indices of a toy set (its first values), sorted.
    fn ids(set: &ImageSet) -> Vec<usize> {
        let mut ids: Vec<usize> = (0..set.len()).map(|i| set.image(i)[0] as usize).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn subset_copies_the_chosen_images_and_labels_in_order() {
        let set = toy_set(5, 3);
        let sub = set.subset(&[4, 1]);
        assert_eq!(sub.len(), 2);
        assert_eq!(sub.image(0), &[4.0, 0.5]);
        assert_eq!(sub.image(1), &[1.0, 0.5]);
        assert_eq!(sub.labels, vec![1, 1]);
        assert_eq!(sub.class_names, set.class_names);
        assert_eq!(sub.image_len(), 2);
    }

    #[test]
    fn split_is_deterministic_disjoint_and_complete() {
        let set = toy_set(50, 4);
        let (train, val) = set.split(0.2, 7);
        assert_eq!((train.len(), val.len()), (40, 10));
        assert_eq!(set.split(0.2, 7), (train.clone(), val.clone()));
        let mut all = ids(&train);
        all.extend(ids(&val));
        all.sort_unstable();
        assert_eq!(all, (0..50).collect::<Vec<_>>());
        assert_ne!(
            set.split(0.2, 8).1,
            val,
            "another seed should give another split"
        );
    }

    #[test]
    fn split_keeps_at_least_one_image_on_each_side() {
        let set = toy_set(3, 2);
        let (train, val) = set.split(0.01, 1);
        assert_eq!((train.len(), val.len()), (2, 1));
        let (train, val) = set.split(0.99, 1);
        assert_eq!((train.len(), val.len()), (1, 2));
        let (train, val) = set.split(0.0, 1);
        assert_eq!((train.len(), val.len()), (3, 0));
        let (train, val) = set.split(1.0, 1);
        assert_eq!((train.len(), val.len()), (0, 3));
    }

    #[test]
    fn partition_is_deterministic_disjoint_balanced_and_stratified() {
        let set = toy_set(103, 5);
        let parts = set.partition(4, 3);
        assert_eq!(parts, set.partition(4, 3));
        let sizes: Vec<usize> = parts.iter().map(ImageSet::len).collect();
        assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        let mut all: Vec<usize> = parts.iter().flat_map(ids).collect();
        all.sort_unstable();
        assert_eq!(all, (0..103).collect::<Vec<_>>());
        for class in 0..5 {
            let counts: Vec<usize> = parts.iter().map(|p| p.class_counts()[class]).collect();
            assert!(counts.iter().max().unwrap() - counts.iter().min().unwrap() <= 1);
        }
        assert_ne!(
            set.partition(4, 4),
            parts,
            "another seed should give other parts"
        );
    }
}

//! Rotated-digits domains built from the UCI optical digits that ship with smartcore.

use super::{Domain, ImageSet, rotated_domains};

/// Rotation angles of the built-in digits domains, in degrees.
pub const DIGITS_ANGLES: [f32; 6] = [0.0, 15.0, 30.0, 45.0, 60.0, 75.0];

/// The side length of a digits image in pixels.
const SIDE: usize = 8;

/// The number of digit classes.
const CLASSES: usize = 10;

/// Builds one domain per angle from the UCI optical digits (1,797 8x8 images with values
/// 0..=16, CC BY 4.0, bundled with smartcore).
///
/// The images are shuffled with `seed` and partitioned into `angles.len()` disjoint parts of
/// near-equal size (stratified by class, see [`ImageSet::partition`]), so that, as in
/// RotatedMNIST, no digit image appears in two domains. Part `i` is rotated counter-clockwise by
/// `angles[i]` degrees with [`rotate_chw`] and named `rot<angle>`, such as `rot0` or `rot15`.
/// The class names are `"0"` to `"9"`. An empty `angles` gives no domains.
pub fn digits_domains(angles: &[f32], seed: u64) -> Vec<Domain> {
    rotated_domains(&load_digits(), angles, seed)
}

/// Loads the unrotated digits as one set in their original order (the benchmark's other
/// digits shifts, in `fedge`'s `datasets`, start from it too).
pub fn load_digits() -> ImageSet {
    let dataset = smartcore::dataset::digits::load_dataset();
    debug_assert_eq!(dataset.num_features, SIDE * SIDE);
    debug_assert_eq!(dataset.data.len(), dataset.num_samples * SIDE * SIDE);
    ImageSet {
        channels: 1,
        height: SIDE,
        width: SIDE,
        class_names: (0..CLASSES).map(|c| c.to_string()).collect(),
        images: dataset.data,
        labels: dataset.target.iter().map(|&t| t.round() as u32).collect(),
        raw_max: 16.0,
        masks: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::rotate_chw;

    /// Returns the images of a set as sortable bit patterns.
    fn image_bits(set: &ImageSet) -> Vec<Vec<u32>> {
        (0..set.len())
            .map(|i| set.image(i).iter().map(|v| v.to_bits()).collect())
            .collect()
    }

    #[test]
    fn the_bundled_digits_have_the_expected_shape_and_labels() {
        let all = load_digits();
        assert_eq!(all.len(), 1797);
        assert_eq!(all.images.len(), 1797 * 64);
        assert!(all.labels.iter().all(|&l| l < 10));
        assert!(all.images.iter().all(|&v| (0.0..=16.0).contains(&v)));
        assert_eq!(all.class_counts().iter().sum::<usize>(), 1797);
    }

    #[test]
    fn digits_domains_are_named_after_their_angles_and_sized_within_one() {
        let domains = digits_domains(&DIGITS_ANGLES, 42);
        let names: Vec<&str> = domains.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["rot0", "rot15", "rot30", "rot45", "rot60", "rot75"]);
        let sizes: Vec<usize> = domains.iter().map(|d| d.data.len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 1797);
        assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
        for domain in &domains {
            assert_eq!(domain.data.classes(), 10);
            assert_eq!(domain.data.image_len(), 64);
            assert!(
                domain.data.class_counts().iter().all(|&c| c > 0),
                "{} lacks a class",
                domain.name
            );
        }
    }

    #[test]
    fn unrotated_digits_domains_hold_every_image_exactly_once() {
        let domains = digits_domains(&[0.0; 6], 5);
        let mut split: Vec<Vec<u32>> = domains.iter().flat_map(|d| image_bits(&d.data)).collect();
        let mut original = image_bits(&load_digits());
        split.sort_unstable();
        original.sort_unstable();
        assert_eq!(split, original);
    }

    #[test]
    fn digits_domains_are_deterministic_for_a_seed_and_rotated() {
        let a = digits_domains(&[0.0, 45.0], 9);
        assert_eq!(a, digits_domains(&[0.0, 45.0], 9));
        assert_ne!(a, digits_domains(&[0.0, 45.0], 10));
        let unrotated = digits_domains(&[0.0, 0.0], 9);
        assert_eq!(a[0], unrotated[0]);
        assert_eq!(a[1].data.labels, unrotated[1].data.labels);
        assert_ne!(a[1].data.images, unrotated[1].data.images);
        assert_eq!(
            a[1].data.image(0),
            rotate_chw(unrotated[1].data.image(0), 1, 8, 8, 45.0).as_slice()
        );
    }
}

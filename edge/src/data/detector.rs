//! Object masks from a detector model run with tract (FedDDL's third mask source).
//!
//! The contract: a detector is an ONNX file with a model card like a backbone's (input size,
//! layout, scaling), whose output has `feature_size = 4·B` values per image: `B` boxes
//! `(x1, y1, x2, y2)` as fractions of the image's width and height. Boxes with `x2 ≤ x1` or
//! `y2 ≤ y1` are padding. `fedge_models::bright_box` is a detector of this shape written by
//! this project; a trained one (Grounding DINO, as in the FedDDL paper, or YOLO) needs a small
//! export wrapper that keeps its best boxes and divides by the input size.

use fedge_models::{Backbone, BackboneError};

use super::ImageSet;

/// Images per detector call.
const BATCH: usize = 32;

/// The masks of `images` (`len × h × w` bytes, 1 on the object) from `detector`'s boxes: a
/// pixel is on the object when its centre falls in any box; an image without a box is all
/// object (no background to swap).
pub fn detector_masks(detector: &Backbone, images: &ImageSet) -> Result<Vec<u8>, BackboneError> {
    let per_image = detector.card().feature_size;
    if per_image == 0 || !per_image.is_multiple_of(4) {
        return Err(BackboneError::Adapt {
            name: detector.card().name.clone(),
            source: fedge_models::AdaptError::NotBoxes(per_image),
        });
    }
    let shape = (images.channels, images.height, images.width);
    let boxes = detector.features_of(&images.images, shape, images.raw_max, BATCH)?;
    let (h, w) = (images.height, images.width);
    let mut out = Vec::with_capacity(images.len() * h * w);
    for image_boxes in boxes.chunks_exact(per_image) {
        let boxes: Vec<&[f32]> = image_boxes
            .chunks_exact(4)
            .filter(|b| b.iter().all(|v| v.is_finite()) && b[2] > b[0] && b[3] > b[1])
            .collect();
        for r in 0..h {
            let y = (r as f32 + 0.5) / h as f32;
            for c in 0..w {
                let x = (c as f32 + 0.5) / w as f32;
                let inside = boxes.is_empty()
                    || boxes
                        .iter()
                        .any(|b| x >= b[0] && x < b[2] && y >= b[1] && y < b[3]);
                out.push(u8::from(inside));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedge_models::bright_box::{bright_box_card, bright_box_onnx};

    #[test]
    fn the_bright_box_detector_masks_the_digit_s_bounding_box() {
        let detector = Backbone::from_bytes(
            bright_box_card(8, 8, 16.0),
            &bright_box_onnx(8, 8, 0.25),
            "bright-box.onnx".as_ref(),
        )
        .unwrap();
        let digits = &crate::data::digits_domains(&[0.0], 0)[0].data;
        let set = digits.subset(&(0..20).collect::<Vec<_>>());
        let masks = detector_masks(&detector, &set).unwrap();
        assert_eq!(masks.len(), 20 * 64);
        let threshold = set.threshold_masks(0.25);
        for i in 0..20 {
            let (mask, bright) = (
                &masks[i * 64..(i + 1) * 64],
                &threshold[i * 64..(i + 1) * 64],
            );
            // Every bright pixel is inside the box, and the box is its bounding box: each of its
            // edge rows and columns holds a bright pixel.
            assert!(mask.iter().zip(bright).all(|(m, b)| *m >= *b), "image {i}");
            let rows: Vec<usize> = (0..8)
                .filter(|r| mask[r * 8..r * 8 + 8].contains(&1))
                .collect();
            let cols: Vec<usize> = (0..8)
                .filter(|c| (0..8).any(|r| mask[r * 8 + c] == 1))
                .collect();
            for r in [rows[0], *rows.last().unwrap()] {
                assert!(bright[r * 8..r * 8 + 8].contains(&1), "image {i} row {r}");
            }
            for c in [cols[0], *cols.last().unwrap()] {
                assert!((0..8).any(|r| bright[r * 8 + c] == 1), "image {i} col {c}");
            }
            assert_eq!(
                mask.iter().filter(|m| **m == 1).count(),
                rows.len() * cols.len(),
                "a rectangle"
            );
        }
        // Larger images are adapted to the detector's input like a backbone's.
        let big = ImageSet {
            images: set
                .images
                .chunks(64)
                .flat_map(|img| (0..256).map(move |p| img[(p / 16 / 2) * 8 + (p % 16) / 2]))
                .collect(),
            height: 16,
            width: 16,
            ..set.clone()
        };
        let big_masks = detector_masks(&detector, &big).unwrap();
        assert_eq!(big_masks.len(), 20 * 256);
        assert_eq!(big_masks[0], masks[0], "same box at twice the size");
    }
}

//! Where FedDDL's object masks come from in `fedge eval`: the data set's own, or the boxes of
//! the project's bright-box detector, run through tract on every training image as a device
//! with `[fedddl] detector` runs it (`fedge_edge::data::detector_masks`).
//!
//! The built-in data sets know every object pixel, which no camera does; the FedDDL paper
//! takes boxes from a detector. `--masks bright-box` measures the method with boxes instead.

use std::path::Path;

use clap::ValueEnum;
use fedge_edge::data::{ImageSet, detector_masks};
use fedge_models::Backbone;
use fedge_models::bright_box::{bright_box_card, bright_box_onnx};

/// Where FedDDL's object masks come from; one spelling on the command line and in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MaskSource {
    /// The data set's own: the generator's pixel masks for the built-in sets, `boxes.csv` in an
    /// image folder.
    #[default]
    Exact,
    /// The box around the pixels brighter than [`BRIGHT_BOX_THRESHOLD`] of full scale, from the
    /// bright-box detector (`fedge_models::bright_box`) run through tract: a box, not the
    /// object's outline, so background inside the box stays with the object. Single-channel
    /// images only.
    BrightBox,
}

/// The bright-box detector's threshold, a fraction of full scale: above the background
/// textures of `digits-bg` and `fashion-mnist-bg` (at most 35 %), below most object pixels.
pub const BRIGHT_BOX_THRESHOLD: f32 = 0.4;

/// Replaces the masks of `data` (domain `name`) with those `source` gives.
pub fn apply(source: MaskSource, name: &str, data: &mut ImageSet) -> anyhow::Result<()> {
    match source {
        MaskSource::Exact => Ok(()),
        MaskSource::BrightBox => {
            anyhow::ensure!(
                data.channels == 1,
                "domain {name}: --masks bright-box needs single-channel images, these have {} \
                 channels (use --masks exact with a boxes.csv)",
                data.channels
            );
            let card = bright_box_card(data.height, data.width, data.raw_max);
            let onnx = bright_box_onnx(data.height, data.width, BRIGHT_BOX_THRESHOLD);
            let detector = Backbone::from_bytes(card, &onnx, Path::new("bright-box.onnx"))?;
            data.masks = Some(detector_masks(&detector, data)?);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datasets::digits_bg_domains;

    #[test]
    fn bright_boxes_hold_every_object_pixel_and_some_background() {
        let domain = digits_bg_domains(1, 0.9, 0).unwrap().remove(0).domain;
        let mut data = domain.data.subset(&(0..50).collect::<Vec<_>>());
        let exact = data.masks.clone().unwrap();
        apply(MaskSource::BrightBox, "bg0", &mut data).unwrap();
        let boxes = data.masks.unwrap();
        assert_eq!(boxes.len(), exact.len());
        // A box covers the object's bright pixels; what it adds is background.
        let plane = data.height * data.width;
        let (mut added, mut bright_missed) = (0, 0);
        for (i, (b, e)) in boxes.chunks(plane).zip(exact.chunks(plane)).enumerate() {
            let image = &data.images[i * plane..(i + 1) * plane];
            for p in 0..plane {
                let bright = image[p] > BRIGHT_BOX_THRESHOLD * data.raw_max;
                bright_missed += usize::from(bright && b[p] == 0);
                added += usize::from(b[p] == 1 && e[p] == 0);
            }
        }
        assert_eq!(bright_missed, 0, "every bright pixel is inside its box");
        assert!(added > 0, "boxes hold background the exact masks leave out");
    }

    #[test]
    fn colour_images_are_refused_with_the_fix() {
        let mut data = digits_bg_domains(1, 0.9, 0).unwrap().remove(0).domain.data;
        data.channels = 3;
        let err = apply(MaskSource::BrightBox, "x", &mut data).unwrap_err();
        assert!(err.to_string().contains("--masks exact"), "{err}");
    }
}

//! EfficientNet-Lite0 converted by `models/tools/fetch-efficientnet-lite0.sh`: tract runs it and
//! agrees with the converter's own numpy forward pass.
//!
//! The converted file is not in the repository. The test looks in `$FEDGE_BACKBONES` (default
//! `~/.cache/fedge/backbones`); without the file it says so and passes, unless
//! `FEDGE_REQUIRE_EFFICIENTNET=1` (set by CI, which runs the fetch script first).

use std::path::PathBuf;

use fedge_models::{Backbone, check_sample};

fn card_path() -> Option<PathBuf> {
    let dir = match std::env::var_os("FEDGE_BACKBONES") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/fedge/backbones"),
    };
    let path = dir.join("efficientnet-lite0.toml");
    if path.exists() {
        return Some(path);
    }
    assert!(
        std::env::var("FEDGE_REQUIRE_EFFICIENTNET").as_deref() != Ok("1"),
        "{} is missing: run models/tools/fetch-efficientnet-lite0.sh",
        path.display()
    );
    eprintln!(
        "skipped: {} is missing (models/tools/fetch-efficientnet-lite0.sh makes it)",
        path.display()
    );
    None
}

#[test]
fn tract_agrees_with_the_converter_on_the_sample() {
    let Some(path) = card_path() else { return };
    let backbone = Backbone::load(&path).unwrap();
    let card = backbone.card();
    assert_eq!(
        (card.channels, card.feature_size, card.raw_max),
        (3, 1280, 255.0)
    );
    let check = check_sample(&backbone, &path)
        .unwrap()
        .expect("the converter writes a sample next to the card");
    eprintln!("{check:?}");
    assert!(check.agrees(), "{check:?}");
    assert!(
        check.max_abs > 0.1,
        "features of a real image are not all zero: {check:?}"
    );
}

#[test]
fn grayscale_images_of_another_size_are_adapted_and_batched() {
    let Some(path) = card_path() else { return };
    let backbone = Backbone::load(&path).unwrap();
    // Three 28x28 grayscale images (Fashion-MNIST's shape) on 0..=255.
    let images: Vec<f32> = (0..3 * 28 * 28)
        .map(|i| ((i * 37) % 256) as f32 * ((i / 784) as f32 + 1.0) / 3.0)
        .collect();
    let all = backbone
        .features_of(&images, (1, 28, 28), 255.0, 2)
        .unwrap();
    assert_eq!(all.len(), 3 * 1280);
    assert!(all.iter().all(|v| v.is_finite()));
    let one = backbone
        .features_of(&images[2 * 784..], (1, 28, 28), 255.0, 1)
        .unwrap();
    let diff = one
        .iter()
        .zip(&all[2 * 1280..])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(diff < 1e-4, "batching changes nothing: {diff}");
    assert_ne!(
        &all[..1280],
        &all[1280..2560],
        "different images, different features"
    );
}

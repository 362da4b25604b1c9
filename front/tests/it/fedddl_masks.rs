//! FedDDL's object masks from the project's bright-box detector (`fedge eval --masks
//! bright-box`): the detector runs through tract on the training images, its boxes replace the
//! generator's pixel masks, and the counterfactuals FedDDL trains on change with them.

use fedge::eval::{Dataset, MaskSource, prepare_with};

fn masks_of(source: MaskSource) -> fedge::eval::Prepared {
    let dataset = Dataset::parse("digits-bg", None, 0).unwrap();
    prepare_with(&dataset, None, None, Some(1), source, false, |_| {}).unwrap()
}

#[test]
fn detector_boxes_replace_the_generator_s_masks_and_change_the_counterfactuals() {
    let (exact, boxes) = (masks_of(MaskSource::Exact), masks_of(MaskSource::BrightBox));
    for (e, b) in exact.domains.iter().zip(&boxes.domains) {
        let (e, b) = (e.images.as_ref().unwrap(), b.images.as_ref().unwrap());
        assert_eq!(e.images, b.images, "{}: the same images", e.len());
        let (em, bm) = (e.masks.as_ref().unwrap(), b.masks.as_ref().unwrap());
        // A box holds the object and some background around it: more pixels, never fewer
        // where the object is bright.
        let (on_e, on_b) = (
            em.iter().filter(|m| **m == 1).count(),
            bm.iter().filter(|m| **m == 1).count(),
        );
        assert!(
            on_b > on_e,
            "boxes cover more than outlines: {on_b} against {on_e}"
        );
    }
    let rows: Vec<usize> = (0..40).collect();
    let view = |p: &fedge::eval::Prepared| {
        let split = p.split(0);
        split[0].views.as_ref().unwrap().views(&rows).unwrap()
    };
    let (ve, vb) = (view(&exact), view(&boxes));
    assert_eq!(ve.counterfactuals[0].labels, vb.counterfactuals[0].labels);
    assert_ne!(
        ve.counterfactuals[0].features, vb.counterfactuals[0].features,
        "boxes keep background with the object, so the counterfactuals differ"
    );
}

#[test]
fn fedge_eval_runs_fedddl_on_detector_boxes() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("runs.json");
    let out = crate::common::succeeded(
        std::process::Command::new(env!("CARGO_BIN_EXE_fedge"))
            .args([
                "eval",
                "--dataset",
                "digits-bg",
                "--rounds",
                "1",
                "--seeds",
                "1",
                "--local-epochs",
                "1",
                "--algorithms",
                "fedddl",
                "--counterfactuals",
                "1",
                "--masks",
                "bright-box",
                "--json",
            ])
            .arg(&json),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("| fedddl |"), "{stdout}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["fedddl"]["masks"], "bright-box");
    assert_eq!(doc["fedddl"]["counterfactuals"], 1);
}

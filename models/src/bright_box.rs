//! A tiny detector written as ONNX: the box around the pixels brighter than a threshold.
//!
//! FedDDL can take object boxes from any detector whose ONNX model follows the detector
//! contract of `fedge_edge::data::detector_masks`: a model card like a backbone's, with
//! `feature_size = 4·B` outputs per image, `B` boxes `(x1, y1, x2, y2)` as fractions of the
//! input's width and height (empty boxes, `x2 ≤ x1` or `y2 ≤ y1`, are padding). A trained
//! detector (Grounding DINO, YOLO) needs a small export wrapper to that shape. This one needs no
//! training: it suits objects brighter than their background (the digits) and lets tests and
//! demos run the detector path through tract for real.
//!
//! ```text
//! on  = Cast(Greater(input, threshold))            [N,1,H,W]
//! col = ReduceMax(on, axes=[2])                    [N,1,1,W]   a column holds object pixels
//! x2  = ReduceMax(col · (1..=W)) / W               last column + 1, as a fraction
//! x1  = (W − ReduceMax(col · (W..=1))) / W         first column, as a fraction
//! (rows likewise) → Concat → Flatten               [N,4]
//! ```
//!
//! With no pixel above the threshold, `x1 = 1 > x2 = 0`: an empty box.

use tract_onnx::pb;

use crate::card::{Layout, ModelCard};
use crate::generate::{encode_model, int, ints, node, tensor, value_info};

/// The card of the bright-box detector for single-channel `h × w` inputs on the scale
/// `0..=raw_max`.
pub fn bright_box_card(h: usize, w: usize, raw_max: f32) -> ModelCard {
    ModelCard {
        name: "bright-box".into(),
        file: "bright-box.onnx".into(),
        input_name: "input".into(),
        layout: Layout::Nchw,
        channels: 1,
        height: h,
        width: w,
        scale: 1.0 / raw_max,
        mean: vec![0.0],
        std: vec![1.0],
        raw_max,
        output_name: "boxes".into(),
        feature_size: 4,
        classes: Vec::new(),
        logits_name: None,
        fedge: None,
    }
}

/// The bright-box detector for `h × w` inputs, marking pixels above `threshold` (a fraction of
/// the full scale).
pub fn bright_box_onnx(h: usize, w: usize, threshold: f32) -> Vec<u8> {
    let ramp = |n: usize, up: bool| -> Vec<f32> {
        (1..=n)
            .map(|i| if up { i as f32 } else { (n + 1 - i) as f32 })
            .collect()
    };
    let (hf, wf) = (h as f32, w as f32);
    let (hi, wi) = (h as i64, w as i64);
    let mut nodes = vec![
        node("Greater", &["input", "threshold"], "above", vec![]),
        // Cast to float (ONNX data type 1).
        node("Cast", &["above"], "on", vec![int("to", 1)]),
        node("ReduceMax", &["on"], "col", vec![ints("axes", &[2])]),
        node("ReduceMax", &["on"], "row", vec![ints("axes", &[3])]),
    ];
    // For each axis: the last index + 1 and the first index, as fractions.
    for (axis, occupancy, up, down, size, reduce) in [
        ("x", "col", "ramp_w", "rev_w", "size_w", [2i64, 3]),
        ("y", "row", "ramp_h", "rev_h", "size_h", [2, 3]),
    ] {
        let (last, first) = (format!("{axis}_last"), format!("{axis}_first"));
        nodes.extend([
            node("Mul", &[occupancy, up], &format!("{axis}_up"), vec![]),
            node(
                "ReduceMax",
                &[&format!("{axis}_up")],
                &last,
                vec![ints("axes", &reduce)],
            ),
            node("Div", &[&last, size], &format!("{axis}2"), vec![]),
            node("Mul", &[occupancy, down], &format!("{axis}_down"), vec![]),
            node(
                "ReduceMax",
                &[&format!("{axis}_down")],
                &first,
                vec![ints("axes", &reduce)],
            ),
            node("Sub", &[size, &first], &format!("{axis}_start"), vec![]),
            node(
                "Div",
                &[&format!("{axis}_start"), size],
                &format!("{axis}1"),
                vec![],
            ),
        ]);
    }
    nodes.push(node(
        "Concat",
        &["x1", "y1", "x2", "y2"],
        "corners",
        vec![int("axis", 3)],
    ));
    nodes.push(node("Flatten", &["corners"], "boxes", vec![int("axis", 1)]));
    let graph = pb::GraphProto {
        name: "bright-box".into(),
        node: nodes,
        initializer: vec![
            tensor("threshold", &[], vec![threshold]),
            tensor("ramp_w", &[1, 1, 1, wi], ramp(w, true)),
            tensor("rev_w", &[1, 1, 1, wi], ramp(w, false)),
            tensor("ramp_h", &[1, 1, hi, 1], ramp(h, true)),
            tensor("rev_h", &[1, 1, hi, 1], ramp(h, false)),
            tensor("size_w", &[], vec![wf]),
            tensor("size_h", &[], vec![hf]),
        ],
        input: vec![value_info("input", &[None, Some(1), Some(hi), Some(wi)])],
        output: vec![value_info("boxes", &[None, Some(4)])],
        ..Default::default()
    };
    encode_model(graph)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backbone;

    #[test]
    fn the_bright_box_detector_finds_the_bright_pixels_with_tract() {
        let card = bright_box_card(4, 6, 16.0);
        let detector = Backbone::from_bytes(
            card,
            &bright_box_onnx(4, 6, 0.25),
            "bright-box.onnx".as_ref(),
        )
        .unwrap();
        // Image 0: bright pixels at (row 1, col 2) and (row 2, col 4); image 1: all dark.
        let mut images = vec![0f32; 2 * 24];
        images[6 + 2] = 16.0;
        images[2 * 6 + 4] = 10.0;
        images[24..].fill(2.0);
        let boxes = detector.features(&images, 2).unwrap();
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
        assert!(
            close(&boxes[..4], &[2.0 / 6.0, 1.0 / 4.0, 5.0 / 6.0, 3.0 / 4.0]),
            "{boxes:?}"
        );
        assert!(
            boxes[4] > boxes[6] && boxes[5] > boxes[7],
            "empty: {boxes:?}"
        );
    }
}

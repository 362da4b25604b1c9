//! The small deterministic convolutional backbone used by tests and the demo.
//!
//! `digits-conv` takes one 8×8 channel (the UCI optical digits) and returns 512 features:
//!
//! ```text
//! input [N,1,8,8] -> Conv 3x3 (16, pad 1) -> ReLU -> MaxPool 2x2 -> [N,16,4,4]
//!                 -> Conv 3x3 (32, pad 1) -> ReLU -> Flatten     -> [N,512]
//! ```
//!
//! Its weights are He-normal draws from a fixed SplitMix64 seed, so the file is the same on
//! every machine. It is committed as `models/assets/digits-conv.onnx` (about 19 KB) next to
//! its model card, and a test checks that this module still produces exactly those bytes.

use prost::Message;
use tract_onnx::pb;

use crate::card::{Layout, ModelCard};

/// Name of the generated backbone.
pub const DIGITS_CONV: &str = "digits-conv";
/// Seed of its weights.
pub const DIGITS_CONV_SEED: u64 = 0x00fe_d6e0;

/// The committed ONNX file, for in-process use without touching the file system.
pub const DIGITS_CONV_ONNX: &[u8] = include_bytes!("../assets/digits-conv.onnx");

/// The model card of `digits-conv`.
pub fn digits_conv_card() -> ModelCard {
    ModelCard {
        name: DIGITS_CONV.into(),
        file: "digits-conv.onnx".into(),
        input_name: "input".into(),
        layout: Layout::Nchw,
        channels: 1,
        height: 8,
        width: 8,
        // Optical digits count pixels on in a 4x4 block: 0..=16.
        scale: 1.0 / 16.0,
        mean: vec![0.0],
        std: vec![1.0],
        raw_max: 16.0,
        output_name: "features".into(),
        feature_size: 512,
        classes: Vec::new(),
        logits_name: None,
        fedge: None,
    }
}

/// Builds the `digits-conv` ONNX model.
pub fn digits_conv_onnx() -> Vec<u8> {
    let mut rng = SplitMix64(DIGITS_CONV_SEED);
    let w1 = rng.he_normal(16 * 9, 9);
    let b1 = vec![0.01f32; 16];
    let w2 = rng.he_normal(32 * 16 * 9, 16 * 9);
    let b2 = vec![0.01f32; 32];
    let nodes = vec![
        node(
            "Conv",
            &["input", "w1", "b1"],
            "c1",
            vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
        ),
        node("Relu", &["c1"], "r1", vec![]),
        node(
            "MaxPool",
            &["r1"],
            "p1",
            vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])],
        ),
        node(
            "Conv",
            &["p1", "w2", "b2"],
            "c2",
            vec![ints("kernel_shape", &[3, 3]), ints("pads", &[1, 1, 1, 1])],
        ),
        node("Relu", &["c2"], "r2", vec![]),
        node("Flatten", &["r2"], "features", vec![int("axis", 1)]),
    ];
    let graph = pb::GraphProto {
        name: DIGITS_CONV.into(),
        node: nodes,
        initializer: vec![
            tensor("w1", &[16, 1, 3, 3], w1),
            tensor("b1", &[16], b1),
            tensor("w2", &[32, 16, 3, 3], w2),
            tensor("b2", &[32], b2),
        ],
        input: vec![value_info("input", &[None, Some(1), Some(8), Some(8)])],
        output: vec![value_info("features", &[None, Some(512)])],
        ..Default::default()
    };
    encode_model(graph)
}

/// Writes `digits-conv.onnx` and `digits-conv.toml` into `dir`; returns the card's path.
pub fn write_digits_conv(dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("digits-conv.onnx"), digits_conv_onnx())?;
    let card_path = dir.join("digits-conv.toml");
    std::fs::write(&card_path, digits_conv_card().to_toml())?;
    Ok(card_path)
}

/// The ONNX file of `graph`: IR version 8, opset 13, produced by this crate.
pub(crate) fn encode_model(graph: pb::GraphProto) -> Vec<u8> {
    let model = pb::ModelProto {
        ir_version: 8,
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
        producer_name: "fedge-models".into(),
        producer_version: "1".into(),
        graph: Some(graph),
        ..Default::default()
    };
    model.encode_to_vec()
}

pub(crate) fn node(
    op: &str,
    inputs: &[&str],
    output: &str,
    attribute: Vec<pb::AttributeProto>,
) -> pb::NodeProto {
    pb::NodeProto {
        op_type: op.into(),
        name: output.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        attribute,
        ..Default::default()
    }
}

pub(crate) fn ints(name: &str, values: &[i64]) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: pb::attribute_proto::AttributeType::Ints as i32,
        ints: values.to_vec(),
        ..Default::default()
    }
}

pub(crate) fn int(name: &str, value: i64) -> pb::AttributeProto {
    pb::AttributeProto {
        name: name.into(),
        r#type: pb::attribute_proto::AttributeType::Int as i32,
        i: value,
        ..Default::default()
    }
}

pub(crate) fn tensor(name: &str, dims: &[i64], values: Vec<f32>) -> pb::TensorProto {
    pb::TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: pb::tensor_proto::DataType::Float as i32,
        raw_data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        ..Default::default()
    }
}

pub(crate) fn value_info(name: &str, dims: &[Option<i64>]) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{Dimension, dimension::Value};
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Some(v) => Value::DimValue(*v),
                None => Value::DimParam("N".into()),
            }),
            ..Default::default()
        })
        .collect();
    pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: pb::tensor_proto::DataType::Float as i32,
                shape: Some(pb::TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// SplitMix64: a tiny, well-known generator whose output does not depend on any crate version.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// `n` normal draws with standard deviation `sqrt(2 / fan_in)` (Box-Muller).
    fn he_normal(&mut self, n: usize, fan_in: usize) -> Vec<f32> {
        let std = (2.0 / fan_in as f64).sqrt();
        (0..n)
            .map(|_| {
                let (u1, u2) = (self.unit(), self.unit());
                ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos() * std) as f32
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With `FEDGE_BLESS=1` this test rewrites the committed files instead of checking them.
    #[test]
    fn committed_backbone_is_what_the_generator_makes() {
        if std::env::var("FEDGE_BLESS").is_ok_and(|v| v == "1") {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
            write_digits_conv(&dir).unwrap();
            return;
        }
        assert!(
            digits_conv_onnx() == DIGITS_CONV_ONNX,
            "models/assets/digits-conv.onnx is stale: run `FEDGE_BLESS=1 cargo test --workspace committed_backbone`"
        );
    }

    #[test]
    fn committed_card_is_what_the_generator_makes() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/digits-conv.toml");
        assert_eq!(ModelCard::load(&path).unwrap(), digits_conv_card());
    }
}

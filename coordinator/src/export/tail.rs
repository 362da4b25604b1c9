//! A trained tail in the exported graph: the backbone already computes its last convolution
//! block on the way to its features, so the export keeps that block and gives its convolution
//! the trained weights, the backbone's own plus the release's offsets (docs/algorithms.md §0,
//! "Trainable tail"). This module finds the convolution and sums the weights; the caller gives
//! them to it as initializers of their own (the backbone's may be shared).

use fedge_wire::layout::{TailConfig, TailTensors};
use onnx_protobuf::{GraphProto, NodeProto, TensorProto, tensor_proto::DataType};

use super::error::ExportError;

/// The operators a tail's output may pass through between its convolution and the features.
const BETWEEN: [&str; 5] = ["Flatten", "Reshape", "GlobalAveragePool", "Relu", "Clip"];

/// The convolution of a trained tail, with its trained weights.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainedConv {
    /// Its index in the graph's nodes.
    pub node: usize,
    /// `W_t + ΔW_t`, `[O, C, kh, kw]`.
    pub weight: Vec<f32>,
    /// `b_t + Δb_t`, `[O]`.
    pub bias: Vec<f32>,
}

/// The convolution that ends in `features`, with the weights `W_t + ΔW_t` and `b_t + Δb_t`.
pub fn trained(
    graph: &GraphProto,
    features: &str,
    tail: &TailConfig,
    offsets: &TailTensors<'_, f32>,
) -> Result<TrainedConv, ExportError> {
    let fail = |reason: String| ExportError::Tail { reason };
    let conv = conv_before(graph, features).map_err(fail)?;
    let node = &graph.node[conv];
    let [o, c, kh, kw] = [tail.channels, tail.input[0], tail.kernel[0], tail.kernel[1]];
    let initializer = |name: &str| graph.initializer.iter().find(|t| t.name == name);
    let weight_name = node.input.get(1).cloned().unwrap_or_default();
    let weight = initializer(&weight_name)
        .ok_or_else(|| fail(format!("the weight {weight_name:?} is not an initializer")))?;
    let dims: Vec<usize> = weight.dims.iter().map(|d| *d as usize).collect();
    if dims != [o, c, kh, kw] {
        return Err(fail(format!(
            "the convolution {:?} has weights {dims:?}, the release's tail {:?}: export with \
             the backbone the federation trained",
            node.name,
            [o, c, kh, kw]
        )));
    }
    let weight = floats(weight).ok_or_else(|| fail("the weight is not f32".into()))?;
    let bias = match node.input.get(2).filter(|b| !b.is_empty()) {
        Some(name) => initializer(name)
            .and_then(floats)
            .filter(|b| b.len() == o)
            .ok_or_else(|| fail(format!("the bias {name:?} is not {o} f32 values")))?,
        None => vec![0.0; o],
    };
    let sum = |base: Vec<f32>, offset: &[f32]| -> Vec<f32> {
        base.iter().zip(offset).map(|(b, d)| b + d).collect()
    };
    Ok(TrainedConv {
        node: conv,
        weight: sum(weight, offsets.weight),
        bias: sum(bias, offsets.bias),
    })
}

/// The index of the convolution whose output reaches `features` through [`BETWEEN`] alone.
fn conv_before(graph: &GraphProto, features: &str) -> Result<usize, String> {
    let producer = |tensor: &str| {
        (graph.node.iter()).position(|n: &NodeProto| n.output.iter().any(|o| o == tensor))
    };
    let mut at = features.to_owned();
    for _ in 0..=BETWEEN.len() {
        let i = producer(&at).ok_or_else(|| format!("no node makes {at:?}"))?;
        let node = &graph.node[i];
        match node.op_type.as_str() {
            "Conv" => return Ok(i),
            op if BETWEEN.contains(&op) => at = node.input.first().cloned().unwrap_or_default(),
            op => {
                return Err(format!(
                    "the features come from {op} {:?}, not from a convolution block: this \
                     backbone has no tail to train",
                    node.name
                ));
            }
        }
    }
    Err("no convolution within the block's few operators before the features".into())
}

/// An f32 initializer's values (raw little-endian bytes or `float_data`).
fn floats(tensor: &TensorProto) -> Option<Vec<f32>> {
    if tensor.data_type != DataType::FLOAT as i32 {
        return None;
    }
    if tensor.raw_data.is_empty() {
        return Some(tensor.float_data.clone());
    }
    let chunks = tensor.raw_data.chunks_exact(4);
    (chunks.remainder().is_empty()).then(|| {
        chunks
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    })
}

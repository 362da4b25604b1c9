//! The ONNX graph of the exported model: the backbone's graph cut to its feature output, with
//! the released head appended as ONNX operators (`Flatten → Gemm → Relu → Gemm → Softmax`;
//! a site-normalised head has `Sub → Mul` with the site's statistics before the first Gemm).
//!
//! The head computes what fedge computes (`fedge_models::head`, and the device's predictor):
//! `z = relu(x·W1 + b1)`, `logits = z·W + b`, `W1 [F, H]` and `W [H, K]` row-major as
//! `wire/src/layout.rs` lays them out, so Gemm takes them as they are (no transpose).

use std::collections::HashSet;

use fedge_wire::FeatureStats;
use fedge_wire::layout::{HeadConfig, HeadTensors};
use onnx_protobuf::{
    AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, ValueInfoProto,
    attribute_proto::AttributeType, tensor_proto::DataType, tensor_shape_proto,
};

use super::error::ExportError;

/// The exported graph's first output: the class probabilities, `[batch, K]`.
pub const PROBABILITIES: &str = "probabilities";
/// Its second output: the head's logits, `[batch, K]`.
pub const LOGITS: &str = "logits";
/// Prefix of every name the export adds besides the two outputs.
const PREFIX: &str = "fedge_head/";

/// Cuts `model`'s graph to what `features` needs and appends the head with `params` (the
/// head's flat parameters, already verified against `head`); a head with a tail gives the
/// backbone's last convolution its trained weights first (`super::tail`).
pub fn append_head(
    model: &mut ModelProto,
    features: &str,
    head: &HeadConfig,
    params: &[f32],
    site: Option<&FeatureStats>,
) -> Result<(), ExportError> {
    let graph = model.graph.as_mut().ok_or(ExportError::NoGraph)?;
    prune(graph, features)?;
    let taken: HashSet<&str> = names(graph).collect();
    for ours in [PROBABILITIES, LOGITS] {
        if taken.contains(ours) {
            return Err(ExportError::NameTaken(ours.to_owned()));
        }
    }
    if let Some(name) = taken.iter().find(|n| n.starts_with(PREFIX)) {
        return Err(ExportError::NameTaken((*name).to_owned()));
    }
    if let (Some(tail), Some(offsets)) = (&head.tail, head.split_tail(params)?) {
        let conv = super::tail::trained(graph, features, tail, &offsets)?;
        let (weight, bias) = (format!("{PREFIX}tail_weight"), format!("{PREFIX}tail_bias"));
        let dims = [tail.channels, tail.input[0], tail.kernel[0], tail.kernel[1]];
        graph.initializer.extend([
            tensor(&weight, &dims, &conv.weight),
            tensor(&bias, &[tail.channels], &conv.bias),
        ]);
        let node = &mut graph.node[conv.node];
        node.input.resize(3, String::new());
        node.input[1] = weight;
        node.input[2] = bias;
        // The backbone's own weights of the block go, unless something else reads them.
        prune(graph, features)?;
    }
    let (f, h, k) = (head.features, head.hidden, head.classes);
    let HeadTensors { w1, b1, w, b } = head.split(params)?;
    let name = |s: &str| format!("{PREFIX}{s}");
    graph.initializer.extend([
        tensor(&name("w1"), &[f, h], w1),
        tensor(&name("b1"), &[h], b1),
        tensor(&name("w"), &[h, k], w),
        tensor(&name("b"), &[k], b),
    ]);
    let mut flatten = node("Flatten", &[features], &name("features"));
    flatten.attribute.push(int_attribute("axis", 1));
    graph.node.push(flatten);
    // A site-normalised head: (x − μ)·(1/√(σ² + ε)) with the site's statistics first.
    let head_input = match site {
        Some(stats) => {
            graph.initializer.extend([
                tensor(&name("site_mean"), &[f], &stats.mean),
                tensor(&name("site_inv_std"), &[f], &stats.inv_std),
            ]);
            graph.node.extend([
                node(
                    "Sub",
                    &[&name("features"), &name("site_mean")],
                    &name("centred"),
                ),
                node(
                    "Mul",
                    &[&name("centred"), &name("site_inv_std")],
                    &name("standardised"),
                ),
            ]);
            name("standardised")
        }
        None => name("features"),
    };
    let mut softmax = node("Softmax", &[LOGITS], PROBABILITIES);
    softmax.attribute.push(int_attribute("axis", 1));
    graph.node.extend([
        node(
            "Gemm",
            &[&head_input, &name("w1"), &name("b1")],
            &name("projected"),
        ),
        node("Relu", &[&name("projected")], &name("hidden")),
        node("Gemm", &[&name("hidden"), &name("w"), &name("b")], LOGITS),
        softmax,
    ]);
    graph.output = vec![output(PROBABILITIES, k), output(LOGITS, k)];
    Ok(())
}

/// Keeps the nodes, initializers, inputs and value infos that `features` depends on; every
/// other output and the nodes only they need are dropped.
fn prune(graph: &mut GraphProto, features: &str) -> Result<(), ExportError> {
    let produced = graph
        .node
        .iter()
        .any(|n| n.output.iter().any(|o| o == features))
        || graph.input.iter().any(|i| i.name == features);
    if !produced {
        return Err(ExportError::NoFeatureOutput {
            name: features.to_owned(),
            outputs: graph.output.iter().map(|o| o.name.clone()).collect(),
        });
    }
    let mut needed: HashSet<String> = HashSet::from([features.to_owned()]);
    let mut keep = vec![false; graph.node.len()];
    // ONNX graphs list nodes in topological order: walking back collects every ancestor.
    for (i, node) in graph.node.iter().enumerate().rev() {
        if node.output.iter().any(|o| needed.contains(o)) {
            keep[i] = true;
            needed.extend(node.input.iter().filter(|s| !s.is_empty()).cloned());
            // Subgraphs (If, Loop, Scan) may read outer names: keep what they name.
            for attribute in &node.attribute {
                for sub in attribute.g.as_ref().into_iter().chain(&attribute.graphs) {
                    needed.extend(sub.node.iter().flat_map(|n| n.input.iter().cloned()));
                }
            }
        }
    }
    let mut index = 0;
    graph.node.retain(|_| {
        index += 1;
        keep[index - 1]
    });
    graph.initializer.retain(|t| needed.contains(&t.name));
    graph.sparse_initializer.clear();
    graph.input.retain(|i| needed.contains(&i.name));
    graph.value_info.retain(|v| needed.contains(&v.name));
    Ok(())
}

/// Every name in `graph`: inputs, initializers, node outputs.
fn names(graph: &GraphProto) -> impl Iterator<Item = &str> {
    (graph.input.iter().map(|i| i.name.as_str()))
        .chain(graph.initializer.iter().map(|t| t.name.as_str()))
        .chain(
            graph
                .node
                .iter()
                .flat_map(|n| n.output.iter().map(String::as_str)),
        )
}

fn node(op: &str, inputs: &[&str], output: &str) -> NodeProto {
    let mut node = NodeProto::new();
    node.op_type = op.to_owned();
    node.name = format!("{PREFIX}{}", output.trim_start_matches(PREFIX));
    node.input = inputs.iter().map(|s| (*s).to_owned()).collect();
    node.output = vec![output.to_owned()];
    node
}

fn int_attribute(name: &str, value: i64) -> AttributeProto {
    let mut attribute = AttributeProto::new();
    attribute.name = name.to_owned();
    attribute.type_ = AttributeType::INT.into();
    attribute.i = value;
    attribute
}

/// An f32 initializer with little-endian raw data.
fn tensor(name: &str, dims: &[usize], values: &[f32]) -> TensorProto {
    let mut tensor = TensorProto::new();
    tensor.name = name.to_owned();
    tensor.dims = dims.iter().map(|&d| d as i64).collect();
    tensor.data_type = DataType::FLOAT as i32;
    tensor.raw_data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    tensor
}

/// A graph output of f32 `[batch, classes]`.
fn output(name: &str, classes: usize) -> ValueInfoProto {
    let mut batch = tensor_shape_proto::Dimension::new();
    batch.set_dim_param("batch".to_owned());
    let mut width = tensor_shape_proto::Dimension::new();
    width.set_dim_value(classes as i64);
    let mut ty = TypeProto::new();
    let tensor = ty.mut_tensor_type();
    tensor.elem_type = DataType::FLOAT as i32;
    tensor.shape.mut_or_insert_default().dim = vec![batch, width];
    let mut info = ValueInfoProto::new();
    info.name = name.to_owned();
    info.type_ = Some(ty).into();
    info
}

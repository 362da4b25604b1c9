//! The export on a small hand-made backbone: what it keeps, what it adds, what it refuses.

use fedge_wire::TensorF32;
use fedge_wire::layout::HeadConfig;
use onnx_protobuf::{GraphProto, Message as _, ModelProto, NodeProto, OperatorSetIdProto};

use super::*;

/// input [N, 4] → Relu → "features"; an extra output "unused" = Neg(input).
fn backbone() -> Vec<u8> {
    let node = |op: &str, input: &str, output: &str| {
        let mut n = NodeProto::new();
        n.op_type = op.into();
        n.input = vec![input.into()];
        n.output = vec![output.into()];
        n
    };
    let mut graph = GraphProto::new();
    graph.node = vec![
        node("Relu", "input", "features"),
        node("Neg", "input", "unused"),
    ];
    let mut input = onnx_protobuf::ValueInfoProto::new();
    input.name = "input".into();
    graph.input.push(input);
    for name in ["features", "unused"] {
        let mut info = onnx_protobuf::ValueInfoProto::new();
        info.name = name.into();
        graph.output.push(info);
    }
    let mut model = ModelProto::new();
    model.ir_version = 8;
    let mut opset = OperatorSetIdProto::new();
    opset.version = 13;
    model.opset_import.push(opset);
    model.graph = Some(graph).into();
    model.write_to_bytes().unwrap()
}

fn card(features: i64) -> ModelCard {
    let text = format!(
        "name = \"tiny\"\nfile = \"tiny.onnx\"\ninput_name = \"input\"\nlayout = \"nchw\"\n\
         channels = 1\nheight = 2\nwidth = 2\nscale = 0.5\nmean = [0.1]\nstd = [2.0]\n\
         raw_max = 1.0\noutput_name = \"features\"\nfeature_size = {features}\n"
    );
    ModelCard::parse(&text, std::path::Path::new("tiny.toml")).unwrap()
}

fn release(backbone: &str) -> ModelRelease {
    let head = HeadConfig::new(4, 3).with_hidden(2);
    let params: Vec<f32> = (0..head.num_params()).map(|i| i as f32 * 0.1).collect();
    ModelRelease {
        pooled: None,
        federation: "plant".into(),
        run: 9,
        round: 4,
        strategy: "fedomg".into(),
        classes: vec!["ok".into(), "scratch".into(), "dent".into()],
        backbone: backbone.into(),
        sha256: ModelRelease::digest(&params),
        params: TensorF32::from_slice(&params),
        head,
        feature_norm: fedge_wire::FeatureNorm::None,
    }
}

#[test]
fn the_backbone_is_cut_to_its_features_and_the_head_appended() {
    let (bytes, card_text) =
        export(&card(4), &backbone(), &release("tiny"), None, "out.onnx").unwrap();
    let model = ModelProto::parse_from_bytes(&bytes).unwrap();
    let graph = model.graph.as_ref().unwrap();
    let ops: Vec<&str> = graph.node.iter().map(|n| n.op_type.as_str()).collect();
    assert_eq!(ops, ["Relu", "Flatten", "Gemm", "Relu", "Gemm", "Softmax"]);
    let outputs: Vec<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(outputs, ["probabilities", "logits"]);
    let dims: Vec<Vec<i64>> = graph.initializer.iter().map(|t| t.dims.clone()).collect();
    assert_eq!(dims, [vec![4, 2], vec![2], vec![2, 3], vec![3]]);
    // The parameters, in the layout's order, bit for bit.
    let raw: Vec<u8> = graph
        .initializer
        .iter()
        .flat_map(|t| t.raw_data.clone())
        .collect();
    let params = release("tiny").verify().unwrap();
    assert_eq!(
        raw,
        params
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
    );
    let meta = |key: &str| {
        (model.metadata_props.iter())
            .find(|p| p.key == key)
            .map(|p| p.value.clone())
            .unwrap()
    };
    assert_eq!(meta("classes"), r#"["ok","scratch","dent"]"#);
    assert_eq!(meta("fedge.round"), "4");
    assert_eq!(meta("fedge.sha256"), release("tiny").sha256_hex());
    assert_eq!(model.opset_import[0].version, 13);
    // The card: the backbone's preprocessing, the new outputs and the classes.
    let exported: toml::Table = toml::from_str(&card_text).unwrap();
    assert_eq!(exported["file"].as_str(), Some("out.onnx"));
    assert_eq!(exported["output_name"].as_str(), Some("probabilities"));
    assert_eq!(exported["logits_name"].as_str(), Some("logits"));
    assert_eq!(exported["feature_size"].as_integer(), Some(3));
    assert_eq!(exported["scale"].as_float(), Some(0.5));
    assert_eq!(exported["input_name"].as_str(), Some("input"));
    assert_eq!(exported["classes"].as_array().unwrap().len(), 3);
    assert_eq!(exported["fedge"]["round"].as_integer(), Some(4));
    // How to resize an image of another size, named for runtimes outside fedge.
    assert_eq!(exported["fedge"]["resize"].as_str(), Some(RESIZE));
    assert!(card_text.contains("Image.BILINEAR"), "{card_text}");
}

#[test]
fn a_head_that_does_not_fit_is_refused_with_the_reason() {
    let fails = |card: ModelCard, onnx: &[u8], release: ModelRelease| {
        export(&card, onnx, &release, None, "m.onnx")
            .unwrap_err()
            .to_string()
    };
    assert!(fails(card(8), &backbone(), release("tiny")).contains("takes 4 features"));
    assert!(fails(card(4), &backbone(), release("lite0")).contains("trained on backbone"));
    let mut renamed = card(4);
    renamed.output_name = "feats".into();
    let e = fails(renamed, &backbone(), release("tiny"));
    assert!(
        e.contains("\"feats\"") && e.contains("features, unused"),
        "{e}"
    );
    assert!(fails(card(4), b"not onnx at all", release("tiny")).contains("not an ONNX model"));
    let mut tampered = release("tiny");
    tampered.round += 1;
    tampered.sha256[0] ^= 1;
    assert!(fails(card(4), &backbone(), tampered).contains("release"));
    // An unnamed backbone (empty release backbone) is accepted.
    assert!(export(&card(4), &backbone(), &release(""), None, "m.onnx").is_ok());
}

#[test]
fn a_missing_state_says_when_the_model_appears() {
    let dir = tempfile::tempdir().unwrap();
    let e = read_release(&dir.path().join("model.bin"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("after the first aggregated round"), "{e}");
    std::fs::write(dir.path().join("junk.bin"), b"junk").unwrap();
    let e = read_release(&dir.path().join("junk.bin"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a usable released model"), "{e}");
}

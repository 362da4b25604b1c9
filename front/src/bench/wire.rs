//! `fedge bench wire`: bytes per update and per round task for each codec, against the raw f32
//! parameters plus FedDIM's full insight matrices (what an uncompressed FedDIM client would
//! send). The frames are the ones devices publish: postcard body, envelope, optionally sealed
//! with a device key, split into chunks at the broker's packet limit, plus MQTT's PUBLISH
//! header and topic per packet.

use fedge_wire::{
    ClassStats, ClientUpdate, Codec, DeviceKey, LocalMetrics, Message, RoundTask, TensorF32,
    Topics, TrainParams,
};
use serde::Serialize;

/// A head's sizes: backbone features `F`, projector width `H`, classes `K`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Shape {
    /// Backbone features.
    pub features: usize,
    /// Projector width.
    pub hidden: usize,
    /// Classes.
    pub classes: usize,
}

impl Shape {
    /// Parameters of the head: `W1 [F,H] + b1 [H] + W [H,K] + b [K]`.
    pub fn params(self) -> usize {
        self.features * self.hidden + self.hidden + self.hidden * self.classes + self.classes
    }
}

/// One codec's sizes for one shape.
#[derive(Debug, Clone, Serialize)]
pub struct WireRow {
    /// Head sizes.
    pub shape: Shape,
    /// Codec of the update.
    pub codec: &'static str,
    /// Whether the update carries FedDIM's class statistics.
    pub feddim: bool,
    /// The update as devices publish it (sealed), summed over its MQTT packets.
    pub update_bytes: usize,
    /// `4 · params`, plus `4 · K²H` with FedDIM (its full insight matrices).
    pub raw_bytes: usize,
    /// The round task (f32 parameters, one tag per selected device) on the wire, per device.
    pub task_bytes: usize,
}

/// MQTT bytes of a PUBLISH of `payload` bytes on `topic` at QoS 1: fixed header (type byte
/// and remaining length), topic length prefix and topic, packet id.
pub fn mqtt_publish_bytes(topic: &str, payload: usize) -> usize {
    let remaining = 2 + topic.len() + 2 + payload;
    let length_bytes = match remaining {
        0..=127 => 1,
        128..=16_383 => 2,
        16_384..=2_097_151 => 3,
        _ => 4,
    };
    1 + length_bytes + remaining
}

/// Bytes on the wire of `frame` published on `topic`, chunked at `max_packet`.
pub fn on_the_wire(frame: Vec<u8>, topic: &str, max_packet: usize) -> usize {
    fedge_wire::split_into_chunks(frame, 1, max_packet)
        .iter()
        .map(|chunk| mqtt_publish_bytes(topic, chunk.len()))
        .sum()
}

/// Deterministic values of a trained delta's size (sizes do not depend on them, except that
/// they must be finite and within f16's range so the lossy codecs apply).
fn values(n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i.wrapping_mul(2_654_435_761) % 2001) as f32 - 1000.0) * scale)
        .collect()
}

/// One row: the update of a device with key, selected among `selected` devices.
pub fn measure(
    shape: Shape,
    codec: Codec,
    feddim: bool,
    selected: usize,
    max_packet: usize,
) -> WireRow {
    let topics = Topics::new("plant-7").expect("valid federation name");
    let client = "gateway-0001";
    let key = DeviceKey::from_bytes([7; fedge_wire::KEY_LEN]);
    let m = shape.params();
    let (k, h) = (shape.classes, shape.hidden);
    let update = ClientUpdate {
        features: None,
        run: 0x5eed_0000_0000_0001,
        round: 12,
        client_id: client.into(),
        seq: 12,
        num_samples: 1200,
        delta: TensorF32::from_slice_with(&values(m, 1e-6), codec),
        metrics: LocalMetrics {
            train_loss: 0.42,
            val_accuracy: 0.9,
            val_samples: 130,
            train_seconds: 1.5,
        },
        class_stats: feddim.then(|| ClassStats {
            counts: vec![120; k],
            means: TensorF32::from_slice_with(&values(k * h, 1e-3), codec),
        }),
        prototypes: None,
    };
    let frame = fedge_wire::seal(
        fedge_wire::encode(&Message::ClientUpdate(update)),
        &[(client, &key)],
    );
    let update_bytes = on_the_wire(frame, &topics.update(client), max_packet);
    let raw_bytes = 4 * m + if feddim { 4 * k * k * h } else { 0 };
    let names: Vec<String> = (0..selected).map(|i| format!("gateway-{i:04}")).collect();
    let task = RoundTask {
        pooled: None,
        federation: "plant-7".into(),
        run: 0x5eed_0000_0000_0001,
        round: 12,
        selected: names.clone(),
        classes: fedge_wire::numbered_classes(k),
        params: TensorF32::from_slice_with(&values(m, 1e-4), codec.for_tasks()),
        train: TrainParams::default(),
        deadline_ms: 60_000,
        insight: feddim
            .then(|| TensorF32::from_slice_with(&values(k * h * k, 1e-3), codec.for_tasks())),
        prototypes: None,
        backbone: Some(fedge_wire::BackboneRef {
            name: "efficientnet-lite0".into(),
            sha256: [0x3c; 32],
        }),
    };
    let keys: Vec<(&str, &DeviceKey)> = names.iter().map(|n| (n.as_str(), &key)).collect();
    let frame = fedge_wire::seal(fedge_wire::encode(&Message::RoundTask(task)), &keys);
    let task_bytes = on_the_wire(frame, &topics.round_task(), max_packet);
    WireRow {
        shape,
        codec: codec.name(),
        feddim,
        update_bytes,
        raw_bytes,
        task_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_and_int8_updates_take_about_a_half_and_a_quarter_of_f32() {
        let shape = Shape {
            features: 512,
            hidden: 64,
            classes: 10,
        };
        assert_eq!(shape.params(), 33_482);
        let row = |codec| measure(shape, codec, false, 5, fedge_wire::DEFAULT_MAX_PACKET);
        let (f32, f16, int8) = (row(Codec::F32), row(Codec::F16), row(Codec::Int8));
        let ratio = |r: &WireRow| r.update_bytes as f64 / r.raw_bytes as f64;
        // Envelope, seal, metrics, chunk headers and MQTT headers stay under 2 % here.
        assert!(ratio(&f32) > 1.0 && ratio(&f32) < 1.02, "{}", ratio(&f32));
        assert!(ratio(&f16) > 0.5 && ratio(&f16) < 0.51, "{}", ratio(&f16));
        assert!(
            ratio(&int8) > 0.25 && ratio(&int8) < 0.26,
            "{}",
            ratio(&int8)
        );
        // Tasks travel in f16 unless updates are lossless, never in int8.
        assert_eq!(f16.task_bytes, int8.task_bytes);
        let task_ratio = f16.task_bytes as f64 / f32.task_bytes as f64;
        assert!(task_ratio > 0.5 && task_ratio < 0.51, "{task_ratio}");
        let feddim = |codec| measure(shape, codec, true, 5, fedge_wire::DEFAULT_MAX_PACKET);
        let with_insight = feddim(Codec::F16);
        // Ī travels in the task's codec too.
        let insight_ratio = with_insight.task_bytes as f64 / feddim(Codec::F32).task_bytes as f64;
        assert!(insight_ratio < 0.51, "{insight_ratio}");
        // MQTT's remaining length takes 1 to 4 bytes.
        assert_eq!(mqtt_publish_bytes("t", 10), 1 + 1 + 2 + 1 + 2 + 10);
        assert_eq!(mqtt_publish_bytes("t", 200), 1 + 2 + 2 + 1 + 2 + 200);
    }
}

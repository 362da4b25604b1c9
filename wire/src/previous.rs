//! The previous release's codec (protocol 7), built from its frozen types
//! (`crate::compat::v7`): what a device of that release decodes and encodes. The coordinator
//! writes for such devices with [`crate::encode_as`]; the rolling-upgrade tests run this as the
//! old device.

use crate::compat::v7::VERSION;
use crate::envelope::{Message, PREVIOUS_PROTOCOL_VERSION, decode_frame};
use crate::error::DecodeError;

const _: () = assert!(VERSION == PREVIOUS_PROTOCOL_VERSION);

/// A protocol-7 device's decoder: only version-7 frames, as that release had it.
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let frame = decode_frame(bytes)?;
    if frame.version != VERSION {
        return Err(DecodeError::UnsupportedVersion(frame.version));
    }
    crate::decode_checked(frame)
}

/// A protocol-7 device's encoder.
pub fn encode(message: &Message) -> Vec<u8> {
    crate::encode_as(message, VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ClientUpdate, LocalMetrics, Objective, TrainParams};
    use crate::tensor::TensorF32;

    fn task() -> crate::RoundTask {
        crate::RoundTask {
            federation: "plant-7".into(),
            run: 9,
            round: 3,
            selected: vec!["cam-01".into()],
            classes: vec!["ok".into(), "scratch".into()],
            params: TensorF32::from_slice(&[0.5, -1.0]),
            train: TrainParams {
                objective: Objective::FedProx,
                // The default of the release that recorded the bytes below.
                feature_norm: crate::FeatureNorm::Site,
                ..TrainParams::default()
            },
            deadline_ms: 60_000,
            insight: None,
            prototypes: None,
            backbone: Some(crate::BackboneRef {
                name: "digits-conv".into(),
                sha256: [7; 32],
            }),
        }
    }

    #[test]
    fn the_previous_version_reads_and_writes_as_it_did() {
        let task = task();
        let old = encode(&Message::RoundTask(task.clone()));
        assert_eq!(old[4], 7);
        // This release reads it, without the backbone protocol 7 cannot carry.
        let Message::RoundTask(read) = crate::decode(&old).unwrap() else {
            panic!("not a task");
        };
        assert_eq!(read.backbone, None);
        assert_eq!(read.params, task.params);
        // The previous release reads it, and refuses this release's own encoding.
        assert!(matches!(decode(&old), Ok(Message::RoundTask(_))));
        let new = crate::encode(&Message::RoundTask(task));
        assert_eq!(decode(&new), Err(DecodeError::UnsupportedVersion(8)));
        // An update of the previous release reads in this one.
        let update = ClientUpdate {
            run: 9,
            round: 3,
            client_id: "cam-01".into(),
            seq: 1,
            num_samples: 10,
            delta: TensorF32::from_slice(&[0.25]),
            metrics: LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
        };
        let sent = encode(&Message::ClientUpdate(update.clone()));
        assert_eq!(crate::decode(&sent), Ok(Message::ClientUpdate(update)));
    }

    #[test]
    fn protocol_7_bytes_are_frozen() {
        // Recorded from the protocol-7 release's encoder; a change to a type these messages
        // share with this release (TrainParams, TensorF32, ClientUpdate) fails here.
        let task = encode(&Message::RoundTask(self::tests::task()));
        assert_eq!(
            crate::hex::encode(&task),
            FROZEN_TASK,
            "the protocol-7 task's bytes changed"
        );
    }

    /// `encode` of this task by the protocol-7 release (commit d680299 of this repository).
    const FROZEN_TASK: &str = "46444745070107706c616e742d370903010663616d2d303102026f6b077363726174636801020008\
        0000003f000080bf010120cdcc4c3d6666663f6f12033a0ad7233c0ad7233c9a99593f9a99193e0305\
        0000a04000010000803f295c8f3d01e0d403000062b9daba";
}

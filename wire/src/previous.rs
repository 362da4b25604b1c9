//! The previous release's codec (protocol 9), built from its frozen types
//! (`crate::compat::v9`): what a device of that release decodes and encodes. The coordinator
//! writes for such devices with [`crate::encode_as`]; the rolling-upgrade tests run this as the
//! old device.

use crate::compat::v9::VERSION;
use crate::envelope::{Message, PREVIOUS_PROTOCOL_VERSION, decode_frame};
use crate::error::DecodeError;

const _: () = assert!(VERSION == PREVIOUS_PROTOCOL_VERSION);

/// A protocol-9 device's decoder: only version-9 frames, as that release had it.
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let frame = decode_frame(bytes)?;
    if frame.version != VERSION {
        return Err(DecodeError::UnsupportedVersion(frame.version));
    }
    crate::decode_checked(frame)
}

/// A protocol-9 device's encoder.
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
                // The defaults of the release that recorded the bytes below.
                feature_norm: crate::FeatureNorm::Site,
                adversarial_weight: 0.85,
                stable_weight: 0.15,
                ..TrainParams::default()
            },
            deadline_ms: 60_000,
            insight: None,
            prototypes: None,
            backbone: Some(crate::BackboneRef {
                name: "digits-conv".into(),
                sha256: [7; 32],
            }),
            pooled: None,
        }
    }

    fn update() -> ClientUpdate {
        ClientUpdate {
            run: 9,
            round: 3,
            client_id: "cam-01".into(),
            seq: 1,
            num_samples: 10,
            delta: TensorF32::from_slice(&[0.25]),
            metrics: LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
            features: None,
        }
    }

    fn release() -> crate::ModelRelease {
        let head = crate::HeadConfig::new(2, 2).with_hidden(1);
        let params = vec![0.5f32; 7];
        crate::ModelRelease {
            federation: "plant-7".into(),
            run: 9,
            round: 3,
            strategy: "fedavg".into(),
            classes: vec!["ok".into(), "scratch".into()],
            backbone: "digits-conv".into(),
            head,
            feature_norm: crate::FeatureNorm::Site,
            sha256: crate::ModelRelease::digest(&params),
            params: TensorF32::from_slice(&params),
            pooled: None,
        }
    }

    #[test]
    fn the_previous_version_reads_and_writes_as_it_did() {
        // Tasks and updates have the same bodies in both versions: each reads the other's.
        for message in [Message::RoundTask(task()), Message::ClientUpdate(update())] {
            let old = encode(&message);
            assert_eq!(old[4], 9);
            assert_eq!(crate::decode(&old), Ok(message.clone()));
            let new = crate::encode(&message);
            assert_eq!(decode(&new), Err(DecodeError::UnsupportedVersion(10)));
            assert_eq!(decode(&crate::encode_as(&message, 9)), Ok(message));
        }
        // A release without a tail goes both ways unchanged.
        let sent = encode(&Message::Model(release()));
        assert_eq!(crate::decode(&sent), Ok(Message::Model(release())));
        // A tail's release written for protocol 9 loses the tail's sizes, so a device of that
        // version refuses it by its parameter count instead of running it without the tail.
        let tail = crate::layout::TailConfig {
            input: [1, 1, 1],
            channels: 2,
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0; 4],
            activation: crate::layout::TailActivation::Relu,
            pooling: crate::layout::TailPooling::GlobalAverage,
        };
        let head = crate::HeadConfig::new(2, 2).with_hidden(1).with_tail(tail);
        let params = vec![0.25f32; head.num_params()];
        let with_tail = crate::ModelRelease {
            head: head.clone(),
            sha256: crate::ModelRelease::digest(&params),
            params: TensorF32::from_slice(&params),
            ..release()
        };
        let Ok(Message::Model(read)) =
            crate::decode(&crate::encode(&Message::Model(with_tail.clone())))
        else {
            panic!("not a release");
        };
        assert_eq!(read.head.tail, Some(tail), "this release carries the tail");
        let Ok(Message::Model(old)) = decode(&crate::encode_as(&Message::Model(with_tail), 9))
        else {
            panic!("not a release");
        };
        assert_eq!(old.head.tail, None);
        assert!(
            old.verify().is_err(),
            "the old head does not fit the parameters"
        );
    }

    #[test]
    fn protocol_9_bytes_are_frozen() {
        // Recorded from the protocol-9 release's encoder; a change to a type these messages
        // share with this release (TrainParams, TensorF32, the feature summary) fails here.
        let frozen = [
            (Message::RoundTask(task()), FROZEN_TASK),
            (Message::ClientUpdate(update()), FROZEN_UPDATE),
            (Message::Model(release()), FROZEN_MODEL),
        ];
        for (message, bytes) in frozen {
            assert_eq!(crate::hex::encode(&encode(&message)), bytes, "{message:?}");
        }
    }

    /// `encode` of these messages by the protocol-9 release (commit 1661c25 of this
    /// repository).
    const FROZEN_TASK: &str = "46444745090107706c616e742d370903010663616d2d303102026f6b077363726174636801020008\
        0000003f000080bf010120cdcc4c3d6666663f6f12033a0ad7233c0ad7233c9a99593f9a99193e03\
        050000a04000010000803f295c8f3d01e0d4030000010b6469676974732d636f6e76070707070707\
        0707070707070707070707070707070707070707070707070707006a75a88c";
    const FROZEN_UPDATE: &str = "46444745090209030663616d2d3031010a010100040000803e000000000000000000000000000000\
        00acb41470";
    const FROZEN_MODEL: &str = "46444745090507706c616e742d3709030666656461766702026f6b07736372617463680b64696769\
        74732d636f6e76020102010107001c0000003f0000003f0000003f0000003f0000003f0000003f00\
        00003f317f1be3e8b0f6fce67da843c89b7b8e15f549d6731a1886012189e1b4fabddd002ac531ab";
}
